"""Warm start (DLRover-RM section 4.3, Algorithm 1): a new job's first plan from similar past jobs.

Pure logic, no database and no Airflow: the history store (``airflow_rover.history``) hands in
past jobs as ``PastJob``; this module scores them against the incoming job, keeps the top k and
smooths their final plans.

Similarity (a weighted sum in [0, 1]; each part is in [0, 1]):

==========  ======  =======================================================================
part        weight  value
==========  ======  =======================================================================
model       0.40    1 if the model reference (``"wide_deep"``, ``"pkg.mod:factory"``) is the
                    same, else 0
features    0.30    0.5 * Jaccard of the ``(table name, dim)`` pairs (plus the dense width)
                    + 0.5 * min/max of the embedding parameter counts (sum vocab * dim);
                    1 for the same feature config, 0 when either side's is unknown
dataset     0.20    min/max of the training-set sizes (samples per epoch), i.e.
                    exp(-abs(ln(n_new / n_past))); 0 when either is unknown
owner       0.10    1 for the same DAG and task, 0.5 for the same DAG, else 0
==========  ======  =======================================================================

Past jobs scoring below ``min_similarity`` are ignored; of the rest the ``k`` best are kept (ties
go to the most recent). Algorithm 1 ranks them from least to most similar, ``A^0 .. A^{k-1}``,
and smooths: ``A_bar^0 = A^0``, ``A_bar^i = mu * A^i + (1 - mu) * A_bar^{i-1}``; the result
``A_bar^{k-1}`` gives the most similar job the largest weight (``mu``). Every numeric field of
``ResourcePlan`` is smoothed on its own, then rounded (counts and megabytes to integers, half up;
CPUs to tenths of a core) and clamped to the field's bounds, so the answer is a valid plan.
With no past job similar enough, the cold-start plan is used and the answer says so.

Algorithm 1 blends layouts field by field (5 PS of 24 cores and 4 of 32 make 5 of 28, a layout
no job ran). ``refine`` fixes that where the history allows: when the similar jobs ran under at
least two plans, their pooled iteration times fit the throughput model, and since every plan
costs the same to launch, the best plan it predicts (at least ``min_rel_gain`` faster) replaces
the smoothed one before anything starts.

The history store also gives the answer the autoscaler's ``prior`` (``autoscale.prior``) from
the same matched jobs: their samples fitted, their hot share and measured scaling costs.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import annotated_types

from airflow_rover.core.autoscale_prior import prior_from
from airflow_rover.core.optimizer import PlanBounds, ScalingCosts, choose_plan, pareto_plans
from airflow_rover.core.plan_limits import plan_limits
from airflow_rover.core.prior_config import AutoscalePrior
from airflow_rover.core.spec import AutoscaleConfig, FeatureConfig, JobSpec, ResourcePlan
from airflow_rover.core.throughput import BusyShare, JobShape, ThroughputModel

WEIGHTS: Mapping[str, float] = {"model": 0.4, "features": 0.3, "dataset": 0.2, "owner": 0.1}
DEFAULT_K = 5
DEFAULT_MU = 0.5
DEFAULT_MIN_SIMILARITY = 0.5
DEFAULT_MIN_REL_GAIN = 0.03  # refine moves the smoothed plan only for >= 3% more samples/s
CPU_STEP = 0.1  # float plan fields (CPUs) are rounded to tenths


@dataclass(frozen=True)
class JobTraits:
    """What warm start compares between jobs; ``None`` / ``()`` where a trait is unknown."""

    model: str
    tables: tuple[tuple[str, int, int], ...] = ()  # (name, dim, vocab_size), sorted by name
    num_dense: int | None = None
    dataset_samples: int | None = None
    dag_id: str | None = None
    task_id: str | None = None

    @classmethod
    def of(
        cls,
        model: str,
        features: FeatureConfig | None = None,
        dataset_samples: int | None = None,
        dag_id: str | None = None,
        task_id: str | None = None,
    ) -> JobTraits:
        tables: tuple[tuple[str, int, int], ...] = ()
        num_dense = None
        if features is not None:
            tables = tuple(sorted((t.name, t.dim, t.vocab_size) for t in features.tables))
            num_dense = features.num_dense
        return cls(model, tables, num_dense, dataset_samples, dag_id, task_id)

    @property
    def embedding_params(self) -> int:
        """Embedding parameters of the model: sum of vocab_size * dim over its tables."""
        return sum(dim * vocab for _, dim, vocab in self.tables)

    @property
    def feature_signature(self) -> str | None:
        """A short hash of the feature config (tables and dense width); None when unknown."""
        if not self.tables:
            return None
        canonical = json.dumps([self.num_dense, [list(t) for t in self.tables]])
        return hashlib.sha1(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PastJob:
    """One finished job of the history: its traits and the plan it ended with."""

    job_id: str
    traits: JobTraits
    plan: Mapping[str, Any]
    finished_at: float = 0.0


@dataclass(frozen=True)
class Match:
    """A past job and how similar it is to the incoming one (``score`` = weighted ``parts``)."""

    job: PastJob
    score: float
    parts: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class WarmStart:
    """The answer: the plan to start with, where it came from, and the jobs it came from."""

    plan: ResourcePlan
    source: Literal["history", "cold_start"]
    message: str
    matches: tuple[Match, ...] = ()  # most similar first
    k: int = DEFAULT_K
    mu: float = DEFAULT_MU
    prior: AutoscalePrior | None = None  # the autoscaler's, from the matched jobs; None: cold

    def to_xcom(self) -> dict[str, Any]:
        """A plain JSON dict: the plan, its source, the matched jobs' ids, scores and plans,
        and the autoscaler's ``prior`` (None: a cold start)."""
        return {
            "plan": self.plan.model_dump(),
            "prior": self.prior.model_dump(mode="json") if self.prior is not None else None,
            "source": self.source,
            "message": self.message,
            "k": self.k,
            "mu": self.mu,
            "matches": [
                {
                    "job_id": m.job.job_id,
                    "score": round(m.score, 4),
                    "parts": {name: round(value, 4) for name, value in m.parts.items()},
                    "plan": dict(m.job.plan),
                }
                for m in self.matches
            ],
        }


# -- similarity ------------------------------------------------------------------------------
def _ratio(a: float | None, b: float | None) -> float:
    """min/max of two positive sizes (= exp(-|ln(a/b)|)); 0 when either is unknown or 0."""
    if not a or not b or a <= 0 or b <= 0:
        return 0.0
    return min(a, b) / max(a, b)


def feature_similarity(a: JobTraits, b: JobTraits) -> float:
    """0.5 * Jaccard of (table, dim) pairs and dense width + 0.5 * embedding-size ratio."""
    if not a.tables or not b.tables:
        return 0.0
    set_a = {(name, dim) for name, dim, _ in a.tables} | {("<dense>", a.num_dense or 0)}
    set_b = {(name, dim) for name, dim, _ in b.tables} | {("<dense>", b.num_dense or 0)}
    jaccard = len(set_a & set_b) / len(set_a | set_b)
    return 0.5 * jaccard + 0.5 * _ratio(a.embedding_params, b.embedding_params)


def owner_similarity(a: JobTraits, b: JobTraits) -> float:
    if a.dag_id is None or a.dag_id != b.dag_id:
        return 0.0
    return 1.0 if a.task_id is not None and a.task_id == b.task_id else 0.5


def similarity_parts(query: JobTraits, past: JobTraits) -> dict[str, float]:
    """Each part of the similarity, in [0, 1], unweighted (see the module docstring)."""
    return {
        "model": 1.0 if query.model == past.model else 0.0,
        "features": feature_similarity(query, past),
        "dataset": _ratio(query.dataset_samples, past.dataset_samples),
        "owner": owner_similarity(query, past),
    }


def similarity(query: JobTraits, past: JobTraits) -> float:
    """The weighted similarity in [0, 1]: 1 for the same model, features, size and task."""
    parts = similarity_parts(query, past)
    return sum(WEIGHTS[name] * value for name, value in parts.items())


def top_k_similar(
    query: JobTraits,
    candidates: Iterable[PastJob],
    k: int = DEFAULT_K,
    min_similarity: float = DEFAULT_MIN_SIMILARITY,
) -> list[Match]:
    """The ``k`` past jobs most similar to ``query`` (at least ``min_similarity``), most similar
    first; equal scores go to the most recently finished job."""
    matches = []
    for job in candidates:
        parts = similarity_parts(query, job.traits)
        score = sum(WEIGHTS[name] * value for name, value in parts.items())
        if score >= min_similarity - 1e-12:
            matches.append(Match(job, score, parts))
    matches.sort(key=lambda m: (-m.score, -m.job.finished_at, m.job.job_id))
    return matches[:k]


# -- smoothing (Algorithm 1) -----------------------------------------------------------------
def smooth(configs: Sequence[Mapping[str, float]], mu: float) -> dict[str, float]:
    """Algorithm 1 on ``configs`` ranked from least (``A^0``) to most similar (``A^{k-1}``):
    ``A_bar^0 = A^0``; ``A_bar^i = mu * A^i + (1 - mu) * A_bar^{i-1}``; returns ``A_bar^{k-1}``.
    Every config must carry the same keys."""
    if not configs:
        raise ValueError("smooth: no configuration to smooth")
    if not 0 < mu <= 1:
        raise ValueError(f"mu={mu!r}: the smoothing factor must be in (0, 1]")
    smoothed = {key: float(value) for key, value in configs[0].items()}
    for config in configs[1:]:
        smoothed = {key: mu * float(config[key]) + (1 - mu) * smoothed[key] for key in smoothed}
    return smoothed


def _bounds(metadata: Sequence[Any], step: float) -> tuple[float, float]:
    low, high = -math.inf, math.inf
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            low = max(low, float(item.ge))  # type: ignore[arg-type]
        elif isinstance(item, annotated_types.Gt):
            low = max(low, float(item.gt) + step)  # type: ignore[arg-type]
        elif isinstance(item, annotated_types.Le):
            high = min(high, float(item.le))  # type: ignore[arg-type]
        elif isinstance(item, annotated_types.Lt):
            high = min(high, float(item.lt) - step)  # type: ignore[arg-type]
    return low, high


def numeric_fields() -> dict[str, type]:
    """The plan fields that are smoothed: every int or float field of ``ResourcePlan``."""
    fields: dict[str, type] = {}
    for name, info in ResourcePlan.model_fields.items():
        if info.annotation is int:
            fields[name] = int
        elif info.annotation is float:
            fields[name] = float
    return fields


def to_plan(values: Mapping[str, float], fallback: ResourcePlan | None = None) -> ResourcePlan:
    """Round and clamp smoothed values to a valid ``ResourcePlan``: integers half up, floats to
    tenths, each within its field's bounds; fields not in ``values`` come from ``fallback``."""
    base = {**(fallback or ResourcePlan()).model_dump(), "sizes": ()}  # per-node: not smoothed
    for name, kind in numeric_fields().items():
        if name not in values:
            continue
        step = 1.0 if kind is int else CPU_STEP
        low, high = _bounds(ResourcePlan.model_fields[name].metadata, step)
        rounded = math.floor(round(float(values[name]) / step, 6) + 0.5) * step
        clamped = min(max(rounded, low), high)
        base[name] = int(clamped) if kind is int else round(clamped, 6)
    return ResourcePlan.model_validate(base)


def _numeric_view(plan: Mapping[str, Any], fallback: ResourcePlan) -> dict[str, float]:
    """The numeric plan fields of a recorded plan, missing or malformed ones from ``fallback``."""
    base = fallback.model_dump()
    view = {}
    for name in numeric_fields():
        value = plan.get(name, base[name])
        if isinstance(value, bool) or not isinstance(value, int | float):
            value = base[name]
        view[name] = float(value)
    return view


def warm_start(
    query: JobTraits,
    candidates: Iterable[PastJob],
    cold_start: ResourcePlan | None = None,
    k: int = DEFAULT_K,
    mu: float = DEFAULT_MU,
    min_similarity: float = DEFAULT_MIN_SIMILARITY,
) -> WarmStart:
    """Algorithm 1 end to end: the smoothed final plans of the top-k similar past jobs, or the
    cold-start plan (``cold_start``, default ``ResourcePlan()``) when none is similar enough."""
    check_settings(k, mu, min_similarity)
    cold = cold_start or ResourcePlan()
    matches = top_k_similar(query, candidates, k, min_similarity) if k > 0 else []
    if not matches:
        why = "warm start disabled (k=0)" if k == 0 else "no similar job in the history"
        message = f"{why} (min_similarity={min_similarity}): cold-start plan"
        return WarmStart(cold, "cold_start", message, (), k, mu)
    ranked = [_numeric_view(m.job.plan, cold) for m in reversed(matches)]  # least similar first
    plan = to_plan(smooth(ranked, mu), fallback=cold)
    ids = ", ".join(f"{m.job.job_id} ({m.score:.2f})" for m in matches)
    message = f"smoothed the final plans of {len(matches)} similar job(s): {ids}"
    return WarmStart(plan, "history", message, tuple(matches), k, mu)


def check_settings(k: Any, mu: Any, min_similarity: Any) -> None:
    """Raise ValueError naming the setting when k, mu or min_similarity is out of range."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k={k!r}: the number of similar jobs must be an integer >= 0")
    if isinstance(mu, bool) or not isinstance(mu, int | float) or not 0 < mu <= 1:
        raise ValueError(f"mu={mu!r}: the smoothing factor must be in (0, 1]")
    if (
        isinstance(min_similarity, bool)
        or not isinstance(min_similarity, int | float)
        or not 0 <= min_similarity <= 1
    ):
        raise ValueError(f"min_similarity={min_similarity!r}: must be in [0, 1]")


@dataclass(frozen=True)
class Refinement:
    """What ``refine`` needs about the new job: its shape for the model, the plans it may
    have, and whether a plan fits its budget."""

    shape: JobShape
    bounds: PlanBounds
    fits: Callable[[ResourcePlan], bool] = lambda _plan: True
    min_rel_gain: float = DEFAULT_MIN_REL_GAIN


def refinement_for(spec: JobSpec, capacity_cpu: float | None) -> Refinement:
    """The refinement of a job of ``spec``: counts within its autoscale bounds at today's node
    sizes, all nodes within ``autoscale.cpu_budget`` (else ``capacity_cpu``, the launcher's)."""
    scale = spec.autoscale
    budget = scale.cpu_budget if scale.cpu_budget is not None else capacity_cpu
    limits = plan_limits(scale, spec.plan)
    bounds = PlanBounds(
        max_workers=int(limits.high("num_workers")),
        max_ps=int(limits.high("num_ps")),
        worker_cpus=(spec.plan.worker_cpu,),
        ps_cpus=(spec.plan.ps_cpu,),
        min_workers=int(limits.low("num_workers")),
        min_ps=int(limits.low("num_ps")),
    )

    def fits(plan: ResourcePlan) -> bool:
        return budget is None or plan.total_cores <= budget + 1e-9

    return Refinement(JobShape.of(spec), bounds, fits)


def within_bounds(decision: WarmStart, autoscale: AutoscaleConfig) -> WarmStart:
    """``decision`` with its plan moved into the ``autoscale`` bounds the user gave (a bound
    left out stretches to the plan, as for any starting plan), saying so in its message."""
    plan = plan_limits(autoscale, decision.plan).clamp(decision.plan)
    if plan == decision.plan:
        return decision
    moved = ", ".join(
        f"{name} {getattr(decision.plan, name):g} -> {getattr(plan, name):g}"
        for name in ResourcePlan.model_fields
        if getattr(plan, name) != getattr(decision.plan, name)
    )
    return replace(decision, plan=plan, message=f"{decision.message}; within autoscale: {moved}")


def refine(
    decision: WarmStart,
    observations: Sequence[tuple[ResourcePlan, float]],
    how: Refinement,
    seed: int = 0,
    busy: Sequence[BusyShare] = (),
) -> WarmStart:
    """The smoothed plan moved to the best plan of the model fitted on the similar jobs'
    ``observations`` (plan, seconds per worker iteration), when that plan fits and is
    predicted ``how.min_rel_gain`` faster; ``decision`` as it is otherwise (a cold start, or a
    history of a single plan without ``busy`` shares, which cannot tell the model's terms
    apart)."""
    plans = {plan for plan, _ in observations}
    if decision.source != "history" or len(plans) < (1 if busy else 2):
        return decision
    prior = prior_from(how.shape, observations, busy=busy).coefficients
    model = ThroughputModel(prior, how.shape) if prior is not None else None
    if model is None:
        return decision
    start = decision.plan
    free = ScalingCosts(worker_start_s=0.0, ps_start_s=0.0, ps_reload_s=0.0)
    candidates = [
        c
        for c in pareto_plans(model, start, 1e12, how.bounds, costs=free, seed=seed)
        if how.fits(c.plan)
    ]
    now = model.throughput(start)
    best = choose_plan(candidates, start, now, how.min_rel_gain)
    if best is None:
        return decision
    message = (
        f"{decision.message}; the model fitted on their {len(observations)} throughput samples "
        f"({len(plans)} plans) predicts {now:.0f} -> {model.throughput(best.plan):.0f} "
        f"samples/s for {_describe(best.plan)} instead of {_describe(start)}"
    )
    return replace(decision, plan=best.plan, message=message)


def _describe(plan: ResourcePlan) -> str:
    return (
        f"{plan.num_workers} workers x {plan.worker_cpu:g} cores + "
        f"{plan.num_ps} PS x {plan.ps_cpu:g} cores"
    )
