"""What a job's autoscaler starts from: the throughput model's prior and the scaling costs.

Cold, the prior is the paper's coefficients scaled to the job's first observation and the
costs are defaults. Warm-started, both come from similar past jobs: their pooled iteration
times fitted with the paper's proportions as the prior, the median share of PS load their hot
PS kept, and the median of the scaling costs they measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from airflow_rover.core.optimizer import ScalingCosts
from airflow_rover.core.spec import ResourcePlan
from airflow_rover.core.throughput import Coefficients, JobShape, ThroughputModel

PRIOR_WEIGHT = 0.01  # how hard a prior pulls the coefficients until the data decide


@dataclass(frozen=True)
class Prior:
    coefficients: Coefficients | None = None  # None: the paper's, scaled to the first sample
    hot_share: float = 0.0
    costs: ScalingCosts | None = None  # None: not measured, the defaults


def prior_from(
    shape: JobShape,
    observations: Sequence[tuple[ResourcePlan, float]],
    hot_shares: Sequence[float] = (),
    costs: Sequence[ScalingCosts] = (),
) -> Prior:
    """The prior of a job like the past jobs that saw ``observations`` (plan, seconds per
    worker iteration), kept ``hot_shares`` and measured ``costs``."""
    hot_share = statistics.median(hot_shares) if hot_shares else shape.hot_share
    shape = replace(shape, hot_share=hot_share)  # the coefficients of the model that will use it
    coefficients = None
    if observations:
        paper = Coefficients.paper().scaled_to(shape, *observations[0])
        coefficients = ThroughputModel.fit(shape, observations, paper, PRIOR_WEIGHT).coefficients
    measured = None
    if costs:
        measured = ScalingCosts(
            worker_start_s=statistics.median(c.worker_start_s for c in costs),
            ps_start_s=statistics.median(c.ps_start_s for c in costs),
            ps_reload_s=statistics.median(c.ps_reload_s for c in costs),
        )
    return Prior(coefficients, hot_share, measured)
