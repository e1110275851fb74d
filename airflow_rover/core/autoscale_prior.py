"""What a job's autoscaler starts from: the throughput model's prior and the scaling costs.

Cold, the prior is the paper's coefficients scaled to the job's first observation and the
costs are defaults. Warm-started, both come from similar past jobs: their pooled iteration
times fitted with the paper's proportions as the prior (at their median hot share, the shape
the autoscaler then predicts with), the median share of PS load their hot PS kept, and the
median of each scaling cost they measured. The spec carries it as ``autoscale.prior``
(``core.prior_config.AutoscalePrior``); ``to_config`` and ``from_config`` convert.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from airflow_rover.core.optimizer import ScalingCosts
from airflow_rover.core.prior_config import COEFFICIENTS, COSTS, AutoscalePrior
from airflow_rover.core.spec import ResourcePlan
from airflow_rover.core.throughput import BusyShare, Coefficients, JobShape, ThroughputModel

PRIOR_WEIGHT = 0.01  # how hard a prior pulls the coefficients until the data decide


@dataclass(frozen=True)
class Prior:
    coefficients: Coefficients | None = None  # None: the paper's, scaled to the first sample
    hot_share: float = 0.0
    costs: ScalingCosts | None = None  # None: not measured, the defaults
    jobs: tuple[str, ...] = ()  # the past jobs it came from; none: a cold start

    @property
    def warm(self) -> bool:
        return bool(self.jobs)

    def describe(self) -> dict[str, Any]:
        """How the autoscaler started, for the master's status: ``warm`` from these jobs
        (and what it took from them), or ``cold``."""
        if not self.warm:
            return {"start": "cold", "prior_jobs": [], "prior_parts": []}
        parts = {
            "coefficients": self.coefficients is not None,
            "hot_share": self.hot_share > 0,
            "scaling_costs": self.costs is not None,
        }
        took = [name for name, present in parts.items() if present]
        return {"start": "warm", "prior_jobs": list(self.jobs), "prior_parts": took}

    def to_config(self) -> AutoscalePrior:
        values: dict[str, Any] = {"hot_share": self.hot_share, "jobs": self.jobs}
        if self.coefficients is not None:
            values |= asdict(self.coefficients)
        if self.costs is not None:
            values |= asdict(self.costs)
        return AutoscalePrior(**values)

    @classmethod
    def from_config(cls, config: AutoscalePrior | None) -> Prior:
        """The autoscaler's prior of ``autoscale.prior`` (None: cold); a cost it lacks is
        the default."""
        if config is None:
            return cls()
        coefficients = None
        if config.grad is not None:  # all five or none (AutoscalePrior checks)
            coefficients = Coefficients(*(float(getattr(config, n)) for n in COEFFICIENTS))
        measured = {n: getattr(config, n) for n in COSTS if getattr(config, n) is not None}
        costs = ScalingCosts(**measured) if measured else None
        return cls(coefficients, config.hot_share, costs, tuple(config.jobs))


def cost_medians(costs: Sequence[ScalingCosts | Mapping[str, float | None]]) -> dict[str, float]:
    """Each cost's median over the jobs that measured it (a ``ScalingCosts`` measured them
    all; a mapping those it holds, None for one it did not); a cost none measured is absent."""
    known: dict[str, list[float]] = {f.name: [] for f in fields(ScalingCosts)}
    for entry in costs:
        values = asdict(entry) if isinstance(entry, ScalingCosts) else entry
        for name, seconds in values.items():
            if name in known and seconds is not None:
                known[name].append(float(seconds))
    return {name: statistics.median(v) for name, v in known.items() if v}


def measured_costs(
    costs: Sequence[ScalingCosts | Mapping[str, float | None]],
) -> ScalingCosts | None:
    """``cost_medians`` as the autoscaler plans with them: the default for a cost none
    measured; None when none measured anything."""
    medians = cost_medians(costs)
    return ScalingCosts(**medians) if medians else None


def prior_from(
    shape: JobShape,
    observations: Sequence[tuple[ResourcePlan, float]],
    hot_shares: Sequence[float] = (),
    costs: Sequence[ScalingCosts | Mapping[str, float | None]] = (),
    jobs: Sequence[str] = (),
    busy: Sequence[BusyShare] = (),
) -> Prior:
    """The prior of a job like the past jobs ``jobs`` that saw ``observations`` (plan,
    seconds per worker iteration) and ``busy`` shares, kept ``hot_shares`` and measured
    ``costs``."""
    hot_share = statistics.median(hot_shares) if hot_shares else shape.hot_share
    shape = replace(shape, hot_share=hot_share)  # the shape the autoscaler predicts with
    coefficients = None
    if observations:
        paper = Coefficients.paper().scaled_to(shape, *observations[0])
        fitted = ThroughputModel.fit(shape, observations, paper, PRIOR_WEIGHT, busy)
        coefficients = fitted.coefficients
    return Prior(coefficients, hot_share, measured_costs(costs), tuple(jobs))


def job_shape(batch_size: int, embedding_dim: int) -> JobShape:
    """The shape of a job of this batch size and embedding width, as ``JobShape.of`` gives it
    for a spec (for a caller that has no spec: the ``WarmStartOperator``)."""
    return JobShape.sized(batch_size, embedding_dim)
