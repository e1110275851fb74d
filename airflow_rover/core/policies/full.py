"""Full recovery (CPR paper section 2.2): every PS reloads the last checkpoint on any PS
failure, and the shards resume from the batches every PS had applied.

Overhead per unit of training time ``O_save/T_save + (O_load + T_save/2 + O_res)/T_fail``,
minimised by ``T_save = sqrt(2*O_save*T_fail)``. Its behaviour in the processes is the
default of every hook (``base.CheckpointPolicy``).
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field, field_validator

from airflow_rover.core.policies.base import CheckpointPolicy
from airflow_rover.core.policies.costs import (
    CheckpointCosts,
    CheckpointPlan,
    Overhead,
    duration,
    floored,
    pct,
    positive,
)
from airflow_rover.core.policies.options import PolicyOptions, check_range


class FullOptions(PolicyOptions):
    """Full recovery: every PS reloads the last checkpoint on any PS failure."""

    section = "full"
    interval_s: float | None = Field(
        default=None,
        description="seconds between checkpoints; default sqrt(2*O_save*T_fail) from the "
        "measured save cost and the failure rate (CPR section 2.2)",
    )

    @field_validator("interval_s")
    @classmethod
    def _interval(cls, v: float | None, info: Any) -> float | None:
        return None if v is None else check_range(cls.option(info.field_name), v, 0.0, None)


def optimal_full_interval(save_s: float, mtbf_s: float) -> float:
    """``sqrt(2*O_save*T_fail)``: the interval minimising eq. 1 (CPR section 2.2)."""
    if save_s <= 0 or mtbf_s <= 0:
        raise ValueError(f"save_s={save_s!r} and mtbf_s={mtbf_s!r} must be > 0")
    return math.sqrt(2.0 * save_s * mtbf_s)


def full_overhead(
    save_s: float, load_s: float, mtbf_s: float, interval_s: float, reschedule_s: float = 0.0
) -> Overhead:
    """Eq. 1 divided by T_total: ``O_save/T_save + (O_load + T_save/2 + O_res)/T_fail``."""
    positive(interval=interval_s, mtbf=mtbf_s)
    return Overhead(
        save=save_s / interval_s,
        load=load_s / mtbf_s,
        lost=0.5 * interval_s / mtbf_s,
        reschedule=reschedule_s / mtbf_s,
    )


class FullRecovery(CheckpointPolicy):
    name = "full"
    Options = FullOptions
    options: FullOptions

    def plan(self, costs: CheckpointCosts) -> CheckpointPlan:
        if self.options.interval_s is not None:
            interval, how = self.options.interval_s, "set"
        else:
            optimum = optimal_full_interval(costs.save_s, costs.mtbf_s)
            interval, how = floored(optimum, costs, "sqrt(2*O_save*T_fail)")
        over = full_overhead(costs.save_s, costs.load_s, costs.mtbf_s, interval, costs.reschedule_s)
        return CheckpointPlan(
            requested="full",
            policy="full",
            interval_s=interval,
            partial_interval_s=None,
            overhead=over,
            expected_pls=0.0,
            reason=f"full recovery, T_save={duration(interval)} ({how}), expected overhead "
            f"{pct(over.total)}",
        )
