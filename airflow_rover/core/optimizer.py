"""Resource plans for running jobs (DLRover-RM section 4.3): Pareto candidates per job from
NSGA-II, then a weighted greedy choice across jobs that share a budget.

Two objectives per job: resource cost ``RC`` (CPU and memory at their prices) and throughput
gain ``TG``: the job's effective samples/s under a plan, counting the time a change costs
(new pods start, PS reload their partition), minus its samples/s today. A worker-only change
costs less than one that touches the PS, so the optimizer prefers it whenever it gains as much.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from airflow_rover.core.spec import ResourcePlan
from airflow_rover.core.throughput import ThroughputModel


@dataclass(frozen=True)
class PlanBounds:
    """The plans a job may have: counts, the CPU sizes each role may choose from, and, with
    ``hot_ps`` (the index of the PS that holds the hot share), that PS's own size."""

    max_workers: int = 32
    max_ps: int = 16
    worker_cpus: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    ps_cpus: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    min_workers: int = 1
    min_ps: int = 1
    hot_ps: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers or not 1 <= self.min_ps <= self.max_ps:
            raise ValueError(
                f"PlanBounds: workers {self.min_workers}..{self.max_workers}, "
                f"PS {self.min_ps}..{self.max_ps}: each needs 1 <= min <= max"
            )
        if not self.worker_cpus or not self.ps_cpus:
            raise ValueError("PlanBounds: worker_cpus and ps_cpus each need a size")

    def _ranges(self) -> list[range]:
        ranges = [
            range(self.min_workers, self.max_workers + 1),
            range(self.min_ps, self.max_ps + 1),
            range(len(self.worker_cpus)),
            range(len(self.ps_cpus)),
        ]
        if self.hot_ps is not None:
            ranges.append(range(len(self.ps_cpus)))
        return ranges

    @property
    def lower(self) -> np.ndarray:
        return np.array([r.start for r in self._ranges()])

    @property
    def upper(self) -> np.ndarray:
        return np.array([r.stop - 1 for r in self._ranges()])

    @property
    def size(self) -> int:
        """How many genomes lie within the bounds."""
        return math.prod(len(r) for r in self._ranges())

    def every(self) -> np.ndarray:
        """Every genome of the bounds, one per row."""
        return np.array(list(itertools.product(*self._ranges())))

    def plan(self, genome: Sequence[float] | np.ndarray, like: ResourcePlan) -> ResourcePlan:
        """The plan of ``genome`` (workers, PS, worker size, PS size[, hot PS size]); nodes
        ``like`` sizes apart keep their sizes while they exist (``with_counts``), but the hot
        PS, which gets the genome's."""
        w, p, wc, pc, *hot = (int(v) for v in genome)
        if like.sizes:
            like = like.with_counts(num_workers=w, num_ps=p)
        plan = like.model_copy(
            update={
                "num_workers": w,
                "num_ps": p,
                "worker_cpu": self.worker_cpus[wc],
                "ps_cpu": self.ps_cpus[pc],
            }
        )
        if hot and self.hot_ps is not None and self.hot_ps < p:
            node = f"ps-{self.hot_ps}"
            plan = plan.with_size(node, cpu=max(self.ps_cpus[hot[0]], plan.ps_cpu))
        return plan


def ps_layout(plan: ResourcePlan) -> tuple[tuple[float, int], ...]:
    """(cores, MB) of each PS: what changes when the PS must reload."""
    return tuple(plan.size_of(f"ps-{j}") for j in range(plan.num_ps))


@dataclass(frozen=True)
class Prices:
    cpu: float = 1.0  # per core
    memory_gb: float = 0.1  # per GB

    def cost(self, plan: ResourcePlan) -> float:
        return plan.total_cores * self.cpu + plan.total_memory_mb / 1024 * self.memory_gb


@dataclass(frozen=True)
class ScalingCosts:
    """Seconds a change costs: new workers start while the others train on; a PS change also
    stops training while the PS reload their partitions."""

    worker_start_s: float = 20.0
    ps_start_s: float = 20.0
    ps_reload_s: float = 100.0

    def pause_s(self, current: ResourcePlan, plan: ResourcePlan) -> float:
        """Training time lost to the change (seconds at zero throughput)."""
        if ps_layout(plan) != ps_layout(current):
            return self.ps_start_s + self.ps_reload_s
        return 0.0

    def ramp_s(self, current: ResourcePlan, plan: ResourcePlan) -> float:
        """Seconds before new or resized workers train (the rest train at the old rate)."""
        if plan == current:
            return 0.0
        return self.worker_start_s


@dataclass(frozen=True)
class Candidate:
    plan: ResourcePlan
    cost: float
    gain: float  # samples/s, after the change's cost

    @property
    def efficiency(self) -> float:
        return self.gain / self.cost if self.cost > 0 else 0.0


def throughput_gain(
    model: ThroughputModel,
    current: ResourcePlan,
    plan: ResourcePlan,
    remaining_samples: float,
    costs: ScalingCosts,
) -> float:
    """Effective samples/s over the rest of the job under ``plan`` minus today's samples/s."""
    old = model.throughput(current)
    if plan == current or remaining_samples <= 0:
        return 0.0
    new = model.throughput(plan)
    pause, ramp = costs.pause_s(current, plan), costs.ramp_s(current, plan)
    # During the ramp the old plan keeps training (unless the PS pause it); then the new one.
    trained_in_ramp = 0.0 if pause else old * ramp
    rest = max(0.0, remaining_samples - trained_in_ramp)
    seconds = pause + (0.0 if pause else ramp) + rest / new
    return remaining_samples / seconds - old


def pareto_plans(
    model: ThroughputModel,
    current: ResourcePlan,
    remaining_samples: float,
    bounds: PlanBounds | None = None,
    prices: Prices | None = None,
    costs: ScalingCosts | None = None,
    seed: int = 0,
    generations: int = 60,
    population: int = 60,
) -> list[Candidate]:
    """Non-dominated plans on (resource cost, -throughput gain), cheapest first: NSGA-II, or
    every plan where the space holds no more plans than NSGA-II would evaluate (then the front
    is exact, and found without NSGA-II's hunt for unseen offspring in a nearly covered space)."""
    bounds, prices, costs = bounds or PlanBounds(), prices or Prices(), costs or ScalingCosts()
    if bounds.size <= population * generations:
        genomes = bounds.every()
    else:
        from airflow_rover.core.plan_search import nsga2_genomes  # pymoo: imported when used

        def cost_and_gain(genome: np.ndarray) -> tuple[float, float]:
            plan = bounds.plan(genome, like=current)
            gain = throughput_gain(model, current, plan, remaining_samples, costs)
            return prices.cost(plan), gain

        genomes = nsga2_genomes(
            cost_and_gain, bounds.lower, bounds.upper, seed, generations, population
        )
    seen: dict[ResourcePlan, Candidate] = {}
    for x in genomes:
        plan = bounds.plan(x, like=current)
        gain = throughput_gain(model, current, plan, remaining_samples, costs)
        seen[plan] = Candidate(plan, prices.cost(plan), gain)
    return sorted(non_dominated(list(seen.values())), key=lambda c: (c.cost, -c.gain))


def non_dominated(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Candidates no other candidate beats on both cost and gain."""
    return [
        c
        for c in candidates
        if not any(
            o.cost <= c.cost and o.gain >= c.gain and (o.cost < c.cost or o.gain > c.gain)
            for o in candidates
        )
    ]


@dataclass(frozen=True)
class JobCandidates:
    """One job's options for the cluster-level choice; ``current`` None: a job waiting to
    start, which holds nothing yet."""

    job_id: str
    current: ResourcePlan | None
    current_throughput: float
    remaining_samples: float
    candidates: tuple[Candidate, ...]
    job_weight: float = 1.0  # the job's weight (``autoscale.weight``): multiplies its priority
    start_cost: tuple[float, float] = (0.0, 0.0)  # (cores, MB) a waiting job needs beside its plan


@dataclass(frozen=True)
class Budget:
    cpu: float
    memory_mb: float

    @staticmethod
    def used(plan: ResourcePlan | None) -> tuple[float, float]:
        """(cores, MB) ``plan`` holds; nothing for None (a job not started)."""
        if plan is None:
            return 0.0, 0.0
        return plan.total_cores, float(plan.total_memory_mb)


def weight(
    remaining_samples: float, throughput: float, rho: float = 1.0, eps: float = 1.0
) -> float:
    """Priority of a job: higher the sooner it would finish (DLRover-RM Eqn. 14)."""
    return 1.0 / (remaining_samples / max(throughput, 1e-9) + eps) ** rho


def weighted_greedy(
    jobs: Sequence[JobCandidates], budget: Budget, min_gain: float = 0.0, rho: float = 1.0
) -> dict[str, ResourcePlan]:
    """New plans for some of ``jobs``, largest RE * WG (times the job's weight) first, while the
    sum of every job's plan stays within ``budget`` (jobs without a new plan keep their current
    one); a waiting job chosen also takes its ``start_cost``."""
    cpu = sum(Budget.used(j.current)[0] for j in jobs)
    mem = sum(Budget.used(j.current)[1] for j in jobs)
    options = [
        (
            c.efficiency
            * weight(j.remaining_samples, j.current_throughput + c.gain, rho)
            * j.job_weight,
            j,
            c,
        )
        for j in jobs
        for c in j.candidates
        if c.gain > min_gain and c.plan != j.current
    ]
    options.sort(key=lambda o: o[0], reverse=True)
    chosen: dict[str, ResourcePlan] = {}
    for _, job, cand in options:
        if job.job_id in chosen:
            continue
        old_cpu, old_mem = Budget.used(job.current)
        new_cpu, new_mem = Budget.used(cand.plan)
        if job.current is None:
            new_cpu, new_mem = new_cpu + job.start_cost[0], new_mem + job.start_cost[1]
        if cpu - old_cpu + new_cpu <= budget.cpu and mem - old_mem + new_mem <= budget.memory_mb:
            chosen[job.job_id] = cand.plan
            cpu += new_cpu - old_cpu
            mem += new_mem - old_mem
    return chosen


def best_plan(
    candidates: Sequence[Candidate], current: ResourcePlan, min_gain: float
) -> Candidate | None:
    """For one job alone: the most efficient candidate that gains at least ``min_gain``
    samples/s; among equally good ones, one that leaves the PS as they are."""
    useful = [c for c in candidates if c.gain >= min_gain and c.plan != current]
    if not useful:
        return None

    def ps_changed(c: Candidate) -> bool:
        return ps_layout(c.plan) != ps_layout(current)

    return max(useful, key=lambda c: (round(c.efficiency, 6), not ps_changed(c)))


def choose_plan(
    candidates: Sequence[Candidate],
    current: ResourcePlan,
    throughput_now: float,
    min_rel_gain: float,
    tolerance: float = 0.01,
) -> Candidate | None:
    """For one job within its budget: a plan that gains nearly the most (within ``tolerance``
    of the best gain, and at least ``min_rel_gain`` of today's samples/s, so a job near its
    best stays put); among those one that leaves the PS alone if there is one (no pause), and
    of them the most efficient (``best_plan``): the cheapest near-best plan."""
    if not candidates:
        return None
    top = max(c.gain for c in candidates)
    min_gain = max(min_rel_gain * throughput_now, top - tolerance * abs(top))
    useful = [c for c in candidates if c.gain >= min_gain and c.plan != current]
    same_ps = [c for c in useful if ps_layout(c.plan) == ps_layout(current)]
    return best_plan(same_ps or useful, current, min_gain)
