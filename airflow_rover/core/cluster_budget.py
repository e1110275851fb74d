"""Cluster arbiter: which running jobs may grow now, when jobs of many DAGs share one budget.

Each job's master proposes its own plans (``master.autoscaler``) within the job's own limits.
When jobs share a cluster budget (``ClusterBudget``: cores and memory that all their nodes may
hold together), every job's trigger registers the job (its plan, its pending proposal, its
remaining samples and samples/s) in the registry (``history.registry``), and before applying its
proposal asks ``arbitrate`` whether the proposal is selected:

- a proposal that grows nothing the budget limits (a scale-down) is always allowed;
- when every pending scale-up fits the budget left by the running plans, all are allowed;
- otherwise the scale-ups are contested, and ``core.optimizer.weighted_greedy`` (DLRover-RM
  4.3) selects them by RE * WG * weight, largest first, while they fit: RE = gain / cost of the
  proposed plan (``Prices``), WG = 1 / (remaining samples / samples/s after the change + 1),
  weight the job's ``autoscale.weight`` (default 1).

The gain of a proposal (samples/s) is the master's ``expected_gain`` when the proposal carries
one; otherwise it is estimated as linear scaling in the worker count: ``samples/s * (new workers
/ old workers - 1)``, and 0 when the worker count does not change (a PS-side change: it is then
applied only with budget left after every scale-up that promises a gain).

Rows not refreshed within their TTL are ignored (their job's trigger is gone): a dead triggerer
never holds the budget. Everything here is pure (no database, no Airflow): ``history.registry``
reads and writes the rows, the trigger applies what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from airflow_rover.core.optimizer import (
    Budget,
    Candidate,
    JobCandidates,
    Prices,
    weight,
    weighted_greedy,
)
from airflow_rover.core.plans import PlanRecord, pending_plan
from airflow_rover.core.spec import ClusterBudget, ResourcePlan
from airflow_rover.core.states import JobState

DEFAULT_TTL_S = 60.0  # a row this old (or 3 polls old, if longer) no longer counts
RHO = 1.0  # WG's exponent (DLRover-RM Eqn. 14)


def ttl_for(poll_interval: float) -> float:
    """How long a job's registration counts without a refresh: a minute, or three polls."""
    return max(DEFAULT_TTL_S, 3.0 * poll_interval)


@dataclass(frozen=True)
class RunningJob:
    """One row of the registry: a running job, what it holds, what it asks for."""

    job_id: str
    budget: str
    plan: ResourcePlan
    remaining_samples: float
    samples_per_second: float
    updated_at: float
    ttl_s: float = DEFAULT_TTL_S
    proposal: PlanRecord | None = None  # the plan its master proposed and nobody applied yet
    weight: float = 1.0  # the job's ``autoscale.weight``: multiplies its priority

    def fresh(self, now: float) -> bool:
        return now - self.updated_at <= self.ttl_s

    def reserved(self) -> RunningJob:
        """The row once its proposal is applied: it holds the proposed plan."""
        if self.proposal is None:
            return self
        return replace(self, plan=self.proposal.plan, proposal=None)


def throughput_of(status: Mapping[str, Any]) -> float:
    """The job's samples/s: its newest profile sample under today's plan (a rate measured
    after the plan's sampling period), else the master's current rate."""
    plan = status.get("plan")
    samples = (status.get("profile") or {}).get("throughput") or []
    for sample in reversed(samples):
        if isinstance(sample, Mapping) and sample.get("plan") == plan:
            rate = sample.get("samples_per_second")
            if isinstance(rate, int | float) and rate > 0:
                return float(rate)
    rate = status.get("throughput")
    return float(rate) if isinstance(rate, int | float) and rate > 0 else 0.0


def running_job(
    status: Mapping[str, Any],
    plans: Sequence[PlanRecord],
    budget: str,
    now: float,
    ttl_s: float = DEFAULT_TTL_S,
) -> RunningJob | None:
    """The registry row of a job from its master's status and its plan records; None when the
    status names no job or no plan. Only a running job offers its proposal (the master applies
    plans only then)."""
    job_id, plan = status.get("job_id"), status.get("plan")
    if not job_id or not isinstance(plan, Mapping):
        return None
    try:
        current = ResourcePlan.model_validate(plan)
    except ValidationError:
        return None
    progress = status.get("progress") or {}
    total, done = progress.get("samples_total"), progress.get("samples_done")
    remaining = (
        max(0.0, float(total) - float(done))
        if isinstance(total, int | float) and isinstance(done, int | float)
        else 0.0
    )
    proposal = pending_plan(plans) if status.get("state") == JobState.RUNNING else None
    return RunningJob(
        weight=weight_of(status),
        job_id=str(job_id),
        budget=budget,
        plan=current,
        remaining_samples=remaining,
        samples_per_second=throughput_of(status),
        updated_at=now,
        ttl_s=ttl_s,
        proposal=proposal,
    )


def weight_of(status: Mapping[str, Any]) -> float:
    """The job's ``autoscale.weight`` from its status; 1 when the status has none."""
    value = (status.get("autoscale") or {}).get("weight")
    return float(value) if isinstance(value, int | float) and value > 0 else 1.0


def proposal_gain(job: RunningJob) -> float:
    """Samples/s the job's proposal adds: the master's figure, else linear worker scaling."""
    proposal = job.proposal
    if proposal is None:
        return 0.0
    if proposal.expected_gain is not None:
        return proposal.expected_gain
    old, new = job.plan.num_workers, proposal.plan.num_workers
    if new == old:
        return 0.0
    return job.samples_per_second * (new / old - 1.0)


def limits(budget: ClusterBudget) -> Budget:
    """The budget as the optimizer's ``Budget`` (a limit left out is infinite)."""
    return Budget(
        cpu=budget.cpu if budget.cpu is not None else math.inf,
        memory_mb=float(budget.memory_mb) if budget.memory_mb is not None else math.inf,
    )


@dataclass(frozen=True)
class Verdict:
    """What the arbiter says about one job's pending proposal."""

    job_id: str
    proposal_id: int
    allowed: bool
    reason: str
    gain: float
    score: float | None = None  # RE * WG * weight, when the proposal was contested


@dataclass(frozen=True)
class Decision:
    """The arbiter's answer for every fresh job with a pending proposal."""

    budget: str
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    cpu_used: float = 0.0  # by the fresh jobs' plans once the allowed proposals are applied
    memory_mb_used: float = 0.0

    def allowed(self, job_id: str) -> bool:
        verdict = self.verdicts.get(job_id)
        return verdict is not None and verdict.allowed

    @property
    def selected(self) -> set[str]:
        return {job_id for job_id, v in self.verdicts.items() if v.allowed}


def _describe(cpu: float, memory_mb: float) -> str:
    parts = []
    if math.isfinite(cpu):
        parts.append(f"{cpu:g} cores")
    if math.isfinite(memory_mb):
        parts.append(f"{memory_mb:g} MB")
    return " and ".join(parts) or "nothing"


def arbitrate(
    jobs: Iterable[RunningJob],
    budget: ClusterBudget,
    now: float,
    prices: Prices | None = None,
    rho: float = RHO,
) -> Decision:
    """Which pending proposals of ``jobs`` may be applied now within ``budget`` (see the
    module docstring). Deterministic: every trigger that reads the same rows decides alike."""
    prices = prices or Prices()
    limit = limits(budget)
    fresh = sorted((j for j in jobs if j.fresh(now)), key=lambda j: j.job_id)
    cpu = sum(Budget.used(j.plan)[0] for j in fresh)
    mem = sum(Budget.used(j.plan)[1] for j in fresh)
    verdicts: dict[str, Verdict] = {}

    asking = [j for j in fresh if j.proposal is not None]
    ups: list[RunningJob] = []
    for job in asking:  # scale-downs first: they only free resources
        d_cpu, d_mem = _delta(job)
        if (d_cpu <= 0 or math.isinf(limit.cpu)) and (d_mem <= 0 or math.isinf(limit.memory_mb)):
            cpu, mem = cpu + d_cpu, mem + d_mem
            verdicts[job.job_id] = _verdict(
                job, True, f"grows nothing budget {budget.name!r} limits: always allowed"
            )
        else:
            ups.append(job)
    if not ups:
        return Decision(budget.name, verdicts, cpu, mem)

    need_cpu = sum(_delta(j)[0] for j in ups)
    need_mem = sum(_delta(j)[1] for j in ups)
    if cpu + need_cpu <= limit.cpu and mem + need_mem <= limit.memory_mb:
        cpu, mem = cpu + need_cpu, mem + need_mem
        used = _describe(
            cpu if math.isfinite(limit.cpu) else math.inf,
            mem if math.isfinite(limit.memory_mb) else math.inf,
        )
        total = _describe(limit.cpu, limit.memory_mb)
        for job in ups:
            verdicts[job.job_id] = _verdict(
                job,
                True,
                f"every pending scale-up fits budget {budget.name!r} ({used} of {total})",
            )
        return Decision(budget.name, verdicts, cpu, mem)
    return _contested(ups, budget, limit, (cpu, mem), verdicts, prices, rho)


def _delta(job: RunningJob) -> tuple[float, float]:
    """(cores, MB) the job's proposal adds to what its plan holds (negative: frees)."""
    assert job.proposal is not None
    (old_cpu, old_mem), (new_cpu, new_mem) = (
        Budget.used(job.plan),
        Budget.used(job.proposal.plan),
    )
    return new_cpu - old_cpu, new_mem - old_mem


def _contested(
    ups: list[RunningJob],
    budget: ClusterBudget,
    limit: Budget,
    used: tuple[float, float],
    verdicts: dict[str, Verdict],
    prices: Prices,
    rho: float,
) -> Decision:
    """Weighted greedy over the scale-ups ``ups``, within what the other jobs leave; ``used``:
    (cores, MB) the fresh jobs hold once the scale-downs are applied."""
    cpu, mem = used
    up_cpu = sum(Budget.used(j.plan)[0] for j in ups)
    up_mem = sum(Budget.used(j.plan)[1] for j in ups)
    room = Budget(cpu=limit.cpu - (cpu - up_cpu), memory_mb=limit.memory_mb - (mem - up_mem))
    options: list[JobCandidates] = []
    scores: dict[str, float] = {}
    for job in ups:
        assert job.proposal is not None
        gain = proposal_gain(job)
        if gain < 0:
            continue  # it costs more and promises less: never worth contested resources
        candidate = Candidate(job.proposal.plan, prices.cost(job.proposal.plan), gain)
        scores[job.job_id] = (
            candidate.efficiency
            * weight(job.remaining_samples, job.samples_per_second + gain, rho)
            * job.weight
        )
        options.append(
            JobCandidates(
                job.job_id,
                job.plan,
                job.samples_per_second,
                job.remaining_samples,
                (candidate,),
                job_weight=job.weight,
            )
        )
    chosen = weighted_greedy(options, room, min_gain=-math.inf, rho=rho)
    for job in ups:
        if job.job_id in chosen:
            d_cpu, d_mem = _delta(job)
            cpu, mem = cpu + d_cpu, mem + d_mem
    ranked = sorted(scores, key=lambda job_id: -scores[job_id])
    for job in ups:
        selected = job.job_id in chosen
        reason = _contested_reason(job, budget, limit, (cpu, mem), selected, ranked, scores)
        verdicts[job.job_id] = _verdict(job, selected, reason, scores.get(job.job_id))
    return Decision(budget.name, verdicts, cpu, mem)


def _contested_reason(
    job: RunningJob,
    budget: ClusterBudget,
    limit: Budget,
    used: tuple[float, float],
    selected: bool,
    ranked: list[str],
    scores: dict[str, float],
) -> str:
    """Why a contested scale-up was selected or not; ``used``: (cores, MB) held once the
    selected plans are applied, ``ranked``: the scored jobs, best RE * WG first."""
    score = scores.get(job.job_id)
    if selected:
        return (
            f"selected for budget {budget.name!r} by weighted greedy: RE*WG {score:.4g}"
            f"{_weighted(job)}, "
            f"rank {ranked.index(job.job_id) + 1} of {len(ranked)}"
        )
    if score is None:
        return f"budget {budget.name!r} is contested and this plan promises no gain"
    cpu, mem = used
    d_cpu, d_mem = _delta(job)
    needs = _describe(
        max(d_cpu, 0.0) if math.isfinite(limit.cpu) else math.inf,
        max(d_mem, 0.0) if math.isfinite(limit.memory_mb) else math.inf,
    )
    left = _describe(max(limit.cpu - cpu, 0.0), max(limit.memory_mb - mem, 0.0))
    return (
        f"budget {budget.name!r} is contested: this plan needs +{needs}, {left} left "
        f"after the selected plans; RE*WG {score:.4g}{_weighted(job)}, "
        f"rank {ranked.index(job.job_id) + 1} of {len(ranked)}"
    )


def _weighted(job: RunningJob) -> str:
    return f" (weight {job.weight:g} included)" if job.weight != 1.0 else ""


def _verdict(job: RunningJob, allowed: bool, reason: str, score: float | None = None) -> Verdict:
    assert job.proposal is not None
    return Verdict(job.job_id, job.proposal.id, allowed, reason, proposal_gain(job), score)
