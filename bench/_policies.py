"""The policies ``bench/simulator.py`` compares, each as its paper or code describes it.

- ``Static``: one configuration for the whole job; the oracle is the best static plan of the
  bounds and budget (exhaustive search over the true model, started at time 0).
- ``AirflowRover``: airflow-rover's optimizer, the real ``airflow_rover.core`` modules: fit
  ``ThroughputModel`` (NNLS) online from the iteration times it observes, candidates from
  ``pareto_plans`` (NSGA-II), the choice by ``best_plan``, and ``post_scaling.hot_ps`` on the
  per-PS CPU the profiler reports. Cold start: 1 worker + 2 PS, prior = the paper's
  coefficients (shape only, scaled to the first observation). Warm start: the plan of
  ``core.warm_start`` over similar past jobs, prior = their fitted coefficients.
- ``DLRoverHeuristic``: what DLRover's local optimizer ships (``../shared/PEERS.md``).
- ``Optimus``: its own async speed model ``f(p, w) = w / (t0 + t1*w/p + t2*w + t3*p)`` fitted
  with NNLS; adds the one PS or worker with the best marginal gain per core each interval.
- ``ElasticScheduler`` (ES, Or et al.): adds a fixed number of workers per interval while the
  scaling efficiency (new worker's throughput / old worker's) stays above 0.3; removes the
  last addition and stops when it does not.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import nnls

from airflow_rover.core.optimizer import (
    Candidate,
    PlanBounds,
    Prices,
    ScalingCosts,
    best_plan,
    pareto_plans,
    throughput_gain,
)
from airflow_rover.core.post_scaling import JobProfile, NodeProfile, hot_ps
from airflow_rover.core.spec import ResourcePlan
from airflow_rover.core.throughput import Coefficients, JobShape, ThroughputModel
from bench._simcore import (
    INIT_S,
    POD_START_S,
    Config,
    JobView,
    Limits,
    Report,
    Workload,
    grid_throughput,
)

CPU_CHOICES = (1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0)


@dataclass(frozen=True)
class Setting:
    """What every policy of a run shares: the job's CPU budget and the plans it may have."""

    budget: float = 200.0
    bounds: PlanBounds = field(
        default_factory=lambda: PlanBounds(max_workers=32, max_ps=16, cpu_choices=CPU_CHOICES)
    )
    prices: Prices = field(default_factory=Prices)
    # What a change costs (the simulator's truth, see _simcore): workers join after pod start
    # + init while the others train; a PS change trains on for the pod start, then pauses.
    costs: ScalingCosts = field(
        default_factory=lambda: ScalingCosts(
            worker_start_s=POD_START_S + INIT_S, ps_start_s=POD_START_S, ps_reload_s=INIT_S
        )
    )

    @property
    def max_cpu(self) -> float:
        return max(self.bounds.cpu_choices)

    @property
    def limits(self) -> Limits:
        return Limits(self.bounds.max_workers, self.bounds.max_ps, self.max_cpu)


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


def oracle_config(wl: Workload, setting: Setting) -> Config:
    """The uniform plan of the bounds with the most steps/s within the budget (exhaustive)."""
    b = setting.bounds
    w, p, wc, pc, thr = grid_throughput(wl, b.max_workers, b.max_ps, b.cpu_choices)
    ok = w * wc + p * pc <= setting.budget + 1e-9
    i = int(np.argmax(np.where(ok, thr, -1.0)))
    return Config(int(w[i]), float(wc[i]), (float(pc[i]),) * int(p[i]))


# -- airflow-rover --------------------------------------------------------------------------------
@dataclass
class Decision:
    t: float
    plan: ResourcePlan
    reason: str


class AirflowRover:
    """Fit, propose (NSGA-II), choose, and fix hot PS; one plan per ``min_interval_s`` at most.

    The choice: among the Pareto candidates within the budget, those gaining at least
    ``gain_tolerance`` of the best predicted gain (and ``min_rel_gain`` of today's throughput,
    so a near-optimal job stays put); a worker-only change among them if there is one (no PS
    reload), else ``best_plan`` (the most efficient, i.e. the cheapest near-best plan).
    """

    def __init__(
        self,
        name: str,
        shape: JobShape,
        setting: Setting,
        start: ResourcePlan,
        prior: Coefficients | None = None,
        prior_weight: float = 0.01,
        seed: int = 0,
        min_interval_s: float = 180.0,
        check_s: float = 60.0,
        min_rel_gain: float = 0.03,
        gain_tolerance: float = 0.99,
        generations: int = 40,
        population: int = 40,
    ) -> None:
        self.name = name
        self.shape = shape
        self.setting = setting
        self.start = start
        self.prior = prior
        self.prior_weight = prior_weight
        self.seed = seed
        self.min_interval_s = min_interval_s
        self.check_s = check_s
        self.min_rel_gain = min_rel_gain
        self.gain_tolerance = gain_tolerance
        self.generations = generations
        self.population = population
        self.last_plan_t = -math.inf
        self.ps_floor = 0.0  # PS cores the hot-PS rule asked for: no plan goes below
        self.model: ThroughputModel | None = None
        self.observations: list[tuple[ResourcePlan, float]] = []
        self.decisions: list[Decision] = []

    def initial(self) -> Config:
        return Config.of(self.start)

    def next_check_s(self) -> float:
        return self.check_s

    def _prior(self, first: Sequence[Report]) -> Coefficients:
        if self.prior is not None:
            return self.prior
        # Cold: the paper's coefficients give the shape, the first observation the scale.
        paper = ThroughputModel(Coefficients.paper(), self.shape)
        plan = first[0].config.plan(self.start)
        scale = statistics.fmean(r.iteration_s for r in first) / paper.iteration_time(plan)
        self.prior = Coefficients(*(float(v) * scale for v in Coefficients.paper().as_array()))
        return self.prior

    def _learn_hot_share(self, recent: Sequence[Report]) -> None:
        """The busiest PS's share of the PS CPU tells how much load no PS count spreads."""
        if recent and recent[-1].config.num_ps >= 2:
            loads = [
                statistics.fmean(r.ps_cpu_used[j] for r in recent)
                for j in range(recent[-1].config.num_ps)
            ]
            self.shape = replace(self.shape, hot_share=JobShape.hot_share_from(loads))

    def fit(self, reports: Sequence[Report]) -> ThroughputModel:
        first = [r for r in reports if r.config == reports[0].config]
        self.observations = [(r.config.plan(self.start), r.iteration_s) for r in reports]
        self.model = ThroughputModel.fit(
            self.shape, self.observations, prior=self._prior(first), prior_weight=self.prior_weight
        )
        return self.model

    def _profile(self, current: ResourcePlan, recent: Sequence[Report]) -> JobProfile:
        cfg = recent[-1].config
        ps = [
            NodeProfile(f"ps-{j}", "ps", statistics.fmean(r.ps_cpu_used[j] for r in recent), 0.0)
            for j in range(cfg.num_ps)
        ]
        workers = [
            NodeProfile(
                f"worker-{i}",
                "worker",
                statistics.fmean(r.worker_cpu_used for r in recent),
                0.0,
                step_time_ms=1000 * statistics.fmean(r.iteration_s for r in recent),
            )
            for i in range(cfg.workers)
        ]
        return JobProfile(
            current,
            tuple(ps + workers),
            max_workers=self.setting.bounds.max_workers,
            max_cpu=self.setting.max_cpu,
        )

    def _within(self, plan: ResourcePlan) -> bool:
        cores = plan.num_workers * plan.worker_cpu + plan.num_ps * plan.ps_cpu
        return cores <= self.setting.budget + 1e-9 and plan.ps_cpu >= self.ps_floor

    def decide(self, view: JobView) -> Config | None:
        recent = view.recent(6)
        if view.now - self.last_plan_t < self.min_interval_s or len(recent) < 3:
            return None
        current = view.config.plan(self.start)
        self._learn_hot_share(recent)
        model = self.fit(view.reports)
        hot = hot_ps(self._profile(current, recent))
        if hot is not None:
            self.ps_floor = max(self.ps_floor, hot.plan.ps_cpu)
        feasible = self._candidates(model, current, view.remaining, self.setting.costs)
        choice = self._choose(feasible, current, mean_steps(recent))
        if choice is None or choice == current:
            return None
        reason = hot.reason if hot is not None else "model"
        self.decisions.append(Decision(view.now, choice, reason))
        self.last_plan_t = view.now
        return Config.of(choice)

    def refine_start(self, model: ThroughputModel, total: float) -> ResourcePlan:
        """Before the launch every plan costs the same to start, so the history's model may
        move the smoothed plan for free: Algorithm 1 blends the similar jobs' layouts field by
        field (5 x 24 and 4 x 32 cores make 5 x 28, a layout none of them ran)."""
        free = ScalingCosts(worker_start_s=0.0, ps_start_s=0.0, ps_reload_s=0.0)
        feasible = self._candidates(model, self.start, total, free)
        choice = self._choose(feasible, self.start, model.throughput(self.start))
        if choice is not None:
            self.start = choice
        return self.start

    def _candidates(
        self, model: ThroughputModel, current: ResourcePlan, remaining: float, costs: ScalingCosts
    ) -> list[Candidate]:
        """The Pareto plans within the budget, repaired to the PS floor when there is one."""
        candidates = pareto_plans(
            model,
            current,
            remaining,
            self.setting.bounds,
            self.setting.prices,
            costs,
            seed=self.seed + len(self.decisions),
            generations=self.generations,
            population=self.population,
        )
        if self.ps_floor > 0:  # the hot-PS rule's floor: fewer, bigger PS of the same capacity
            repaired = {self._repair(c.plan) for c in candidates} | {self._repair(current)}
            candidates = [
                Candidate(
                    plan,
                    self.setting.prices.cost(plan),
                    throughput_gain(model, current, plan, remaining, costs),
                )
                for plan in sorted(repaired, key=lambda p: tuple(p.model_dump().values()))
            ]
        return [c for c in candidates if self._within(c.plan)]

    def _repair(self, plan: ResourcePlan) -> ResourcePlan:
        """``plan`` with PS of at least ``ps_floor`` cores: as many PS cores in fewer PS, and
        workers trimmed to the budget."""
        if plan.ps_cpu >= self.ps_floor:
            return plan
        num_ps = max(1, round(plan.num_ps * plan.ps_cpu / self.ps_floor))
        room = self.setting.budget - num_ps * self.ps_floor
        workers = max(1, min(plan.num_workers, int(room // plan.worker_cpu)))
        return plan.model_copy(
            update={"num_ps": num_ps, "ps_cpu": self.ps_floor, "num_workers": workers}
        )

    def _choose(
        self, feasible: Sequence[Candidate], current: ResourcePlan, now_thr: float
    ) -> ResourcePlan | None:
        if not feasible:
            return None
        if current.ps_cpu < self.ps_floor:
            # The hot-PS rule says the PS must grow: the best plan that does it, gain or not.
            return max(feasible, key=lambda c: c.gain).plan
        top = max(c.gain for c in feasible)
        min_gain = max(self.min_rel_gain * now_thr, top - (1 - self.gain_tolerance) * abs(top))
        useful = [c for c in feasible if c.gain >= min_gain]
        same_ps = [
            c for c in useful if (c.plan.num_ps, c.plan.ps_cpu) == (current.num_ps, current.ps_cpu)
        ]
        chosen = best_plan(same_ps or useful, current, min_gain)
        return chosen.plan if chosen is not None else None


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
    """

    name = "dlrover-heuristic"

    def __init__(self, setting: Setting) -> None:
        self.limit = setting.budget
        self.max_ps = setting.bounds.max_ps
        cpu = float(min(math.ceil(self.limit / 5), 16))
        self.start = Config(1, cpu, (cpu,))
        self.stage = "worker_initial"
        self.last_plan_t = -math.inf
        self.last_ps_change_t = -math.inf

    def initial(self) -> Config:
        return self.start

    def next_check_s(self) -> float:
        return 30.0

    def decide(self, view: JobView) -> Config | None:
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
        n = max(int(min(room / cpu, n)), 1)
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
@dataclass
class Optimus:
    """One PS or one worker per interval, whichever its fitted speed model says gains more per
    core (Peng et al., EuroSys'18, async model); node sizes fixed (given the oracle's)."""

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
        add_w = Config(w + 1, self.worker_cpu, cfg.ps_cpu)
        add_p = Config(w, self.worker_cpu, (*cfg.ps_cpu, self.ps_cpu))
        fits_w = add_w.cores <= self.setting.budget and w < self.setting.bounds.max_workers
        fits_p = add_p.cores <= self.setting.budget and p < self.setting.bounds.max_ps
        if len(self.speeds) < 3:  # too few points to fit 4 parameters: explore both ways
            if not self.explored_ps and fits_p and len(self.speeds) == 2:
                self.explored_ps = True
                return add_p
            return add_w if fits_w else (add_p if fits_p else None)
        theta = self._fit()

        def f(pp: int, ww: int) -> float:
            return ww / float(theta @ np.array([1.0, ww / pp, ww, pp]))

        gain_w = (f(p, w + 1) - f(p, w)) / self.worker_cpu if fits_w else -math.inf
        gain_p = (f(p + 1, w) - f(p, w)) / self.ps_cpu if fits_p else -math.inf
        if max(gain_w, gain_p) <= 0:
            return None
        return add_w if gain_w >= gain_p else add_p

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
