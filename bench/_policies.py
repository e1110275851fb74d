"""The policies ``bench/simulator.py`` compares airflow-rover's autoscaler with (that one is
the master's own class: ``bench/_master_policy.py``), each as its paper or code describes it.

- ``Static``: one configuration for the whole job (the oracle: the world's best plan).
- ``DLRoverHeuristic``: what DLRover's local optimizer ships (``../shared/PEERS.md``;
  ``dlrover/python/master/resource/local_optimizer.py`` and ``job.py``), created cold as it
  creates a job (1 PS + 1 worker). Given a history of past jobs of the same scenario, it is
  created instead from the plan of DLRover's Brain service (``brain_creation_plan``, read from
  ``dlrover/go/brain/pkg/optimizer/implementation/``): PS from
  ``utils/optimize_algorithm.go::EstimateJobResourceByHistoricJobs`` (per job the mean of the
  central half, ``utils/math.go::ComputeMajorCluster``, of its total-PS-CPU samples; across
  jobs the same again; total x 1.5 over the busiest PS's mean use + 4 cores, at most 15 PS;
  memory the largest PS sample + 20%), the cold plan of
  ``optimizer/job_ps_create_resource_optimizer.go`` (4 PS x 12 cores) where the history gives
  none, and one worker from ``optalgorithm/optimize_job_worker_create_resource.go`` (the most
  a worker of a completed job used, at least 12 cores).
- ``Optimus`` (Peng et al., EuroSys'18): its async speed model
  ``f(p, w) = w / (t0 + t1*w/p + t2*w + t3*p)`` fitted with NNLS; each round it allocates
  greedily until the marginal gain runs out: from the current plan it adds the PS or worker
  with the largest cut of the predicted remaining time per core while that cut is positive
  and the budget and bounds allow, and applies the whole plan as one change (as Pollux's
  reimplementation does per GPU, ``petuum/adaptdl``, ``sched/adaptdl_sched/policy/optimus.py``).
- ``ElasticScheduler`` (ES, Or et al.): adds a fixed number of workers per interval while the
  scaling efficiency (new worker's throughput / old worker's) stays above 0.3; removes the
  last addition and stops when it does not.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls

from bench._brain import CreationPlan, PastRun, brain_creation_plan
from bench._simcore import Config, JobView, Report
from bench._world import Setting


def mean_steps(reports: Sequence[Report]) -> float:
    return statistics.fmean(r.steps_per_s for r in reports)


# -- the oracle -----------------------------------------------------------------------------------
class Static:
    """One configuration from time 0 to the end."""

    def __init__(self, name: str, config: Config) -> None:
        self.name = name
        self.config = config

    def initial(self) -> Config:
        return self.config

    def decide(self, view: JobView) -> Config | None:
        return None

    def next_check_s(self) -> float:
        return 1e9


# -- DLRover's shipped heuristic ------------------------------------------------------------------
PS_OVERLOAD = 0.9  # workers *= PS_OVERLOAD / max PS utilisation
PS_HOT = 0.9
PS_MAX_UTIL = 0.95  # no worker change above this
MIN_WORKER_SPEED_RATIO = 0.2
NODE_MAX_CPU = 32.0
LATEST_SAMPLES = 5
OPT_INTERVAL_S = 300.0
PS_CHANGE_INTERVAL_S = 3600.0


class DLRoverHeuristic:
    """DLRover's local resource optimizer (``PEERS.md``; ``local_optimizer.py``/``job.py``).

    Create: 1 PS + 1 worker of ``min(ceil(limit/5), 16)`` cores. Then one stage per plan, plans
    at least ``OPT_INTERVAL_S`` apart: worker-initial (workers *= 0.9 / max PS utilisation,
    worker CPU = mean used), PS-initial (PS count from the per-worker PS CPU), then running:
    hot PS (utilisation >= 0.9: cores *= max(1, max workers / workers), <= 32) at most every
    ``PS_CHANGE_INTERVAL_S``, else the worker rule again (no change above 0.95 utilisation or
    when new workers run < 0.2 as fast as the old ones).

    With a ``history`` (past jobs of the same scenario) it is created as DLRover's cluster
    mode creates a job, from Brain's plan (``brain_creation_plan``); the stages after it stay
    the local optimizer's.
    """

    def __init__(self, setting: Setting, history: Sequence[PastRun] | None = None) -> None:
        self.limit = setting.budget
        self.max_ps = setting.bounds.max_ps
        self.max_workers = setting.bounds.max_workers
        self.creation: CreationPlan | None = None
        if history is None:
            self.name = "dlrover-heuristic"
            cpu = float(min(math.ceil(self.limit / 5), 16))
            self.start = Config(1, cpu, (cpu,))
        else:
            self.name = "dlrover-heuristic-brain"
            self.creation = brain_creation_plan(history)
            self.start = self.creation.config(setting)
        self.stage = "worker_initial"
        self.last_plan_t = -math.inf
        self.last_ps_change_t = -math.inf
        self.observed: list[Report] = []  # every report seen: ``PastRun.of_reports`` of it

    def initial(self) -> Config:
        return self.start

    def next_check_s(self) -> float:
        return 30.0

    def decide(self, view: JobView) -> Config | None:
        self.observed = list(view.reports)
        samples = view.recent(LATEST_SAMPLES)
        if view.now - self.last_plan_t <= OPT_INTERVAL_S or not samples:
            return None
        plan: Config | None = None
        if self.stage == "worker_initial":
            plan = self._workers(view, samples)
            self.stage = "ps_initial"
        elif self.stage == "ps_initial":
            if view.now - self.last_ps_change_t > PS_CHANGE_INTERVAL_S:
                plan = self._ps_initial(view.config, samples)
                if plan is not None:
                    self.last_ps_change_t = view.now
            self.stage = "ps_running"
        else:
            if view.now - self.last_ps_change_t > PS_CHANGE_INTERVAL_S:
                plan = self._hot_ps(view.config, samples) or self._workers(view, samples)
                if plan is not None:
                    self.last_ps_change_t = view.now
            if plan is None:
                plan = self._workers(view, samples)
        if plan is None:
            return None
        self.last_plan_t = view.now
        return plan

    def _estimate(self, cfg: Config, samples: Sequence[Report]) -> tuple[float, float]:
        """(PS CPU per worker, worker CPU) used."""
        ps_total = statistics.fmean(sum(r.ps_cpu_used) for r in samples)
        worker = statistics.fmean(r.worker_cpu_used for r in samples)
        return ps_total / cfg.workers, worker

    def _workers(self, view: JobView, samples: Sequence[Report]) -> Config | None:
        cfg = view.config
        max_util = max(
            u / c for r in samples for u, c in zip(r.ps_cpu_used, cfg.ps_cpu, strict=True)
        )
        if max_util > PS_MAX_UTIL or max_util == 0:
            return None
        if self._speed_ratio(view.reports) < MIN_WORKER_SPEED_RATIO:
            return None
        n = cfg.workers
        factor = PS_OVERLOAD / max_util
        if factor > 1:
            n = int(n * factor)
        cpu = max(round(statistics.fmean(r.worker_cpu_used for r in samples), 1), 1.0)
        room = self.limit - sum(cfg.ps_cpu)
        # Workers beyond the job's bounds would stay pending: ask for no more than run.
        n = max(int(min(room / cpu, n, self.max_workers)), 1)
        return Config(n, cpu, cfg.ps_cpu)

    @staticmethod
    def _speed_ratio(reports: Sequence[Report]) -> float:
        """Speed of a newly added worker over an old one's (1 when it cannot tell)."""

        def nodes(r: Report) -> int:
            return r.config.workers + r.config.num_ps

        i = len(reports) - 1
        while i > 0 and nodes(reports[i - 1]) == nodes(reports[-1]):
            i -= 1
        if i == 0:
            return 1.0
        j = i - 1
        while j > 0 and nodes(reports[j - 1]) == nodes(reports[i - 1]):
            j -= 1
        post, pre = reports[i:], reports[j:i]
        post_w, pre_w = post[0].config.workers, pre[0].config.workers
        post_speed, pre_speed = mean_steps(post), mean_steps(pre)
        if pre_w == post_w or pre_speed == 0:
            return 1.0
        new_worker = (post_speed - pre_speed) / (post_w - pre_w)
        return new_worker / (pre_speed / pre_w)

    def _ps_initial(self, cfg: Config, samples: Sequence[Report]) -> Config | None:
        requested = max(cfg.ps_cpu)
        ps_per_worker, worker_cpu = self._estimate(cfg, samples)
        max_workers = self.limit / (ps_per_worker + worker_cpu)
        total_ps = self.limit - max_workers * worker_cpu
        count = min(max(math.ceil(total_ps / requested), 1), self.max_ps)
        return Config(cfg.workers, cfg.worker_cpu, (requested,) * count)

    def _hot_ps(self, cfg: Config, samples: Sequence[Report]) -> Config | None:
        used = [statistics.fmean(r.ps_cpu_used[j] for r in samples) for j in range(cfg.num_ps)]
        hot = [j for j in range(cfg.num_ps) if used[j] / cfg.ps_cpu[j] >= PS_HOT]
        if not hot:
            return None
        ps_per_worker, worker_cpu = self._estimate(cfg, samples)
        max_workers = int(self.limit / (ps_per_worker + worker_cpu))
        tune = max(1.0, max_workers / cfg.workers)
        for j in hot:
            tune = min(NODE_MAX_CPU / used[j], tune)
        cores = list(cfg.ps_cpu)
        for j in range(cfg.num_ps):
            opt = round(used[j] * tune, 1)
            if cores[j] < opt:
                cores[j] = opt
        if tuple(cores) == cfg.ps_cpu:
            return None
        return Config(cfg.workers, cfg.worker_cpu, tuple(cores))


# -- Optimus --------------------------------------------------------------------------------------
def optimus_speed(theta: np.ndarray, ps: int, workers: int) -> float:
    """Optimus's asynchronous speed model: ``f(p, w) = w / (t0 + t1*w/p + t2*w + t3*p)``."""
    return workers / float(theta @ np.array([1.0, workers / ps, workers, ps]))


@dataclass
class Optimus:
    """Optimus (Peng et al., EuroSys'18) for one job: fit the speed model, then allocate
    greedily, every unit at once; node sizes fixed (given the oracle's).

    Until it has three distinct (PS, workers) points it explores: one worker, then one PS, then
    workers. Then each round (``allocate``) adds, one unit at a time from the current plan,
    the PS or worker whose addition cuts the predicted remaining time the most per core, while
    that cut is positive and the budget and bounds allow, and applies the result as one
    change.
    """

    worker_cpu: float
    ps_cpu: float
    setting: Setting
    name: str = "optimus"
    speeds: dict[tuple[int, int], list[float]] = field(default_factory=dict)  # (p, w) -> T
    explored_ps: bool = False

    def initial(self) -> Config:
        return Config(1, self.worker_cpu, (self.ps_cpu,))

    def next_check_s(self) -> float:
        return 60.0

    def decide(self, view: JobView) -> Config | None:
        recent = view.recent(6)
        if len(recent) < 3:
            return None
        cfg = view.config
        w, p = cfg.workers, cfg.num_ps
        self.speeds[(p, w)] = [r.iteration_s for r in recent]
        if len(self.speeds) < 3:  # too few points to fit 4 parameters: explore both ways
            add_w = Config(w + 1, self.worker_cpu, cfg.ps_cpu)
            add_p = Config(w, self.worker_cpu, (*cfg.ps_cpu, self.ps_cpu))
            fits_w = self._fits(add_w)
            fits_p = self._fits(add_p)
            if not self.explored_ps and fits_p and len(self.speeds) == 2:
                self.explored_ps = True
                return add_p
            return add_w if fits_w else (add_p if fits_p else None)
        plan = self.allocate(self._fit(), cfg, view.remaining)
        return None if plan == cfg else plan

    def _fits(self, cfg: Config) -> bool:
        bounds = self.setting.bounds
        return (
            cfg.cores <= self.setting.budget + 1e-9
            and cfg.workers <= bounds.max_workers
            and cfg.num_ps <= bounds.max_ps
        )

    def allocate(self, theta: np.ndarray, current: Config, remaining: float) -> Config:
        """The greedy round: from ``current``, add the unit with the largest cut of the
        predicted remaining time (``remaining`` steps) per core while it is positive and fits."""
        plan = current
        while True:
            now_s = remaining / optimus_speed(theta, plan.num_ps, plan.workers)
            best: tuple[float, Config] | None = None
            for unit in (
                Config(plan.workers + 1, plan.worker_cpu, plan.ps_cpu),
                Config(plan.workers, plan.worker_cpu, (*plan.ps_cpu, self.ps_cpu)),
            ):
                if not self._fits(unit):
                    continue
                then_s = remaining / optimus_speed(theta, unit.num_ps, unit.workers)
                gain = (now_s - then_s) / (unit.cores - plan.cores)
                if gain > 0 and (best is None or gain > best[0]):
                    best = (gain, unit)
            if best is None:
                return plan
            plan = best[1]

    def _fit(self) -> np.ndarray:
        rows, y = [], []
        for (p, w), times in self.speeds.items():
            for t in times:
                rows.append(np.array([1.0, w / p, w, p]) / t)
                y.append(1.0)
        theta, _ = nnls(np.array(rows), np.array(y))
        return theta


# -- ES -------------------------------------------------------------------------------------------
@dataclass
class ElasticScheduler:
    """Workers only, ``step`` at a time, while each addition's scaling efficiency > 0.3."""

    base: Config  # worker size and the PS (never changed); starts with one worker
    step: int
    setting: Setting
    threshold: float = 0.3
    name: str = "es"
    previous: tuple[int, float] | None = None  # (workers, steps/s) before the last addition
    done: bool = False

    def initial(self) -> Config:
        return Config(1, self.base.worker_cpu, self.base.ps_cpu)

    def next_check_s(self) -> float:
        return 60.0

    def decide(self, view: JobView) -> Config | None:
        recent = view.recent(6)
        if self.done or len(recent) < 3:
            return None
        cfg, speed = view.config, mean_steps(recent)
        if self.previous is not None:
            w0, s0 = self.previous
            efficiency = ((speed - s0) / (cfg.workers - w0)) / (s0 / w0)
            if efficiency <= self.threshold:
                self.done = True
                return Config(w0, cfg.worker_cpu, cfg.ps_cpu)
        room = int((self.setting.budget - sum(cfg.ps_cpu)) // cfg.worker_cpu)
        n = min(cfg.workers + self.step, self.setting.bounds.max_workers, room)
        if n <= cfg.workers:
            self.done = True
            return None
        self.previous = (cfg.workers, speed)
        return Config(n, cfg.worker_cpu, cfg.ps_cpu)
