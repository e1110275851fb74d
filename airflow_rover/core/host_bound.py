"""The most a job whose nodes share one host can train: its cores over the work of a step.

On the local launcher every node is a process of one machine. Once the job's processes keep
the cores it can get busy, more workers or PS add only their own overhead: DLRover-RM's
equation, where every node brings its own cores, cannot say so. A global step costs
``a + b * p`` core-seconds (``a``: the step's work wherever it runs; ``b``: what each PS adds,
its share of every step's requests), read from the nodes' busy CPU under each plan, so the job
trains at most ``cores / (a + b * p)`` global steps per second.

``cores`` is what the job's nodes can get: the host's cores until the job has kept nearly all
of them busy (``SATURATED``), then the most it kept busy (the master, the OS and other jobs
hold the rest).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from airflow_rover.core.spec import ResourcePlan

SATURATED = 0.85  # busy share of the host's cores from which the host is the bound
PER_PS_PRIOR_WEIGHT = 0.01  # pulls b to 0 until two PS counts have run


@dataclass(frozen=True)
class HostUse:
    """What one plan kept busy: the job's busy cores and core-seconds per global step."""

    plan: ResourcePlan
    busy_cores: float
    step_cost: float


@dataclass(frozen=True)
class HostBound:
    cores: float  # what the job's nodes can get of the host
    step_base: float  # core-seconds of a global step's own work
    step_per_ps: float  # core-seconds each PS adds to a global step

    def step_cost(self, plan: ResourcePlan) -> float:
        return self.step_base + self.step_per_ps * plan.num_ps

    def max_steps_per_s(self, plan: ResourcePlan) -> float:
        cost = self.step_cost(plan)
        return self.cores / cost if cost > 0 else float("inf")

    @classmethod
    def fit(cls, host_cores: float, uses: Sequence[HostUse]) -> HostBound:
        """The bound from what the plans run so far kept busy. With one PS count seen, a PS
        adds nothing (the prior: the plan does not change a step's work) until another
        count shows what it adds."""
        if not host_cores > 0:
            raise ValueError(f"host_cores: must be > 0, got {host_cores}")
        if not uses:
            raise ValueError("uses: at least one plan's busy cores are needed")
        costs = np.array([u.step_cost for u in uses])
        if not np.all(costs > 0):
            raise ValueError("uses: step_cost must be > 0")
        rows = np.array([[1.0, u.plan.num_ps] for u in uses]) / costs[:, None]
        ridge = np.sqrt(PER_PS_PRIOR_WEIGHT * len(uses)) / float(np.mean(costs))
        a = np.vstack([rows, [0.0, ridge]])
        y = np.concatenate([np.ones(len(uses)), [0.0]])
        (base, per_ps), _ = nnls(a, y)
        busiest = max(u.busy_cores for u in uses)
        cores = min(host_cores, busiest) if busiest >= SATURATED * host_cores else host_cores
        return cls(cores=cores, step_base=float(base), step_per_ps=float(per_ps))
