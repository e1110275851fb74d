"""The simulator's engine: a job trains under a policy in a world (``bench/_world.py``).

What a policy observes every ``REPORT_S`` seconds of steady training: the mean iteration time
(log-normal noise of the world's ``noise``), the CPU each worker and each PS uses (cores) and
the global steps/s. Scaling costs the world's time: a pod starts in ``pod_start_s`` and a
training process initialises in ``init_s``. New or resized workers join after both while the
old ones train on; removed workers leave at once; any PS change lets training go on while the
new PS pods start, then pauses it for ``init_s`` (checkpoint, re-partition, restore, every
worker reconnects). The job's first launch costs ``pod_start_s + init_s`` too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from airflow_rover.core.spec import ResourcePlan

if TYPE_CHECKING:
    from bench._world import World

POD_START_S = 20.0  # DLRover section 6.3: a pod starts in 20 s...
INIT_S = 100.0  # ...and a training process initialises in 100 s
REPORT_S = 10.0  # profiler report interval
CPU_NOISE = 0.05  # relative sd of a reported CPU use


@dataclass(frozen=True)
class Config:
    """What runs: ``workers`` workers of ``worker_cpu`` cores, one PS per entry of ``ps_cpu``."""

    workers: int
    worker_cpu: float
    ps_cpu: tuple[float, ...]

    @property
    def num_ps(self) -> int:
        return len(self.ps_cpu)

    @property
    def cores(self) -> float:
        return self.workers * self.worker_cpu + sum(self.ps_cpu)

    @classmethod
    def of(cls, plan: ResourcePlan) -> Config:
        return cls(plan.num_workers, float(plan.worker_cpu), (float(plan.ps_cpu),) * plan.num_ps)

    def plan(self, like: ResourcePlan | None = None) -> ResourcePlan:
        """As a uniform ``ResourcePlan`` (PS cores: the smallest PS, as launchers size PS)."""
        base = like or ResourcePlan()
        return base.model_copy(
            update={
                "num_workers": self.workers,
                "num_ps": self.num_ps,
                "worker_cpu": self.worker_cpu,
                "ps_cpu": min(self.ps_cpu),
            }
        )

    def describe(self) -> str:
        ps = sorted(set(self.ps_cpu))
        cores = "/".join(f"{c:g}" for c in ps)
        return f"{self.workers}w x {self.worker_cpu:g}c + {self.num_ps}ps x {cores}c"


# -- what the profiler reports --------------------------------------------------------------------
@dataclass(frozen=True)
class Report:
    """One profiler report: ``REPORT_S`` seconds of steady training under ``config``."""

    t: float
    config: Config
    iteration_s: float  # mean iteration time of a worker, seconds
    steps_per_s: float  # global steps per second of the job
    worker_cpu_used: float  # cores, mean over workers
    ps_cpu_used: tuple[float, ...]  # cores, per PS


def make_report(world: World, cfg: Config, t: float, rng: np.random.Generator) -> Report:
    noisy = world.iteration_s(cfg) * float(np.exp(rng.normal(0.0, world.noise)))
    worker, ps = world.cpu_used(cfg)
    ps_noise = np.exp(rng.normal(0.0, CPU_NOISE, size=cfg.num_ps))
    ps_used = np.minimum(np.array(ps) * ps_noise, np.array(cfg.ps_cpu))
    worker_used = min(worker * float(np.exp(rng.normal(0.0, CPU_NOISE))), cfg.worker_cpu)
    return Report(
        t=t,
        config=cfg,
        iteration_s=noisy,
        steps_per_s=cfg.workers / noisy,
        worker_cpu_used=worker_used,
        ps_cpu_used=tuple(float(x) for x in ps_used),
    )


# -- the job as a policy sees it ------------------------------------------------------------------
@dataclass
class JobView:
    """What a policy may read when it is asked for a decision."""

    now: float
    config: Config
    stable_since: float  # when ``config`` started training
    trained: float  # global steps so far
    total: float
    budget: float  # CPU cores the job may use
    reports: list[Report]  # every report so far, oldest first
    paused_s: float = 0.0  # how long the last change stopped training (a PS change)

    @property
    def remaining(self) -> float:
        return max(self.total - self.trained, 0.0)

    def recent(self, n: int | None = None) -> list[Report]:
        """Reports of the current configuration (the last ``n`` of them)."""
        mine = [r for r in self.reports if r.t > self.stable_since and r.config == self.config]
        return mine if n is None else mine[-n:]


class Policy(Protocol):
    name: str

    def initial(self) -> Config: ...

    def decide(self, view: JobView) -> Config | None:
        """A new configuration, or None to keep the current one."""
        ...

    def next_check_s(self) -> float:
        """Seconds until the policy wants to look again after a "no change"."""
        ...


# -- the engine -----------------------------------------------------------------------------------
@dataclass
class RunResult:
    policy: str
    workload: str
    jct_s: float
    final_plan_s: float  # when the configuration the job finished with started training
    final: Config
    changes: list[tuple[float, Config]] = field(default_factory=list)  # (ready time, config)
    idle_s: float = 0.0  # seconds of no training (launch and PS pauses)


def admit(world: World, cfg: Config) -> Config | None:
    """What the cluster lets run: ``cfg`` with workers beyond the budget left pending (not
    running) and node sizes the world lacks moved to its nearest; None if that is no plan of
    the world."""
    workers = min(cfg.workers, math.floor((world.budget - sum(cfg.ps_cpu)) / cfg.worker_cpu + 1e-9))
    if workers < 1:
        return None
    fitted = Config(workers, cfg.worker_cpu, cfg.ps_cpu)
    if world.runs(fitted):
        return fitted
    plans = world.plans()
    worker_sizes = sorted({c.worker_cpu for c in plans})
    ps_sizes = sorted({size for c in plans for size in c.ps_cpu})

    def nearest(sizes: list[float], value: float) -> float:
        return min(sizes, key=lambda size: (abs(size - value), size))

    snapped = Config(
        workers,
        nearest(worker_sizes, cfg.worker_cpu),
        tuple(nearest(ps_sizes, c) for c in cfg.ps_cpu),
    )
    return snapped if world.runs(snapped) and snapped.cores <= world.budget + 1e-9 else None


def steps_per_s(world: World, cfg: Config) -> float:
    """Global steps per second: one per worker iteration."""
    return cfg.workers / world.iteration_s(cfg)


def transition(
    now: float, old: Config, new: Config, start: float = POD_START_S, init: float = INIT_S
) -> list[tuple[float, Config | None]]:
    """Timeline of a change: ``(time, running config or None for paused)`` from ``now``."""
    if new.ps_cpu != old.ps_cpu:
        return [(now + start, None), (now + start + init, new)]
    if new.worker_cpu == old.worker_cpu and new.workers < old.workers:
        return [(now, new)]
    return [(now + start + init, new)]


def simulate(
    world: World, policy: Policy, seed: int, horizon_s: float = 7 * 24 * 3600.0
) -> RunResult:
    """Run one job under ``policy`` until its last step; deterministic for ``seed``."""
    rng = np.random.default_rng(seed)
    first = admit(world, policy.initial())
    if first is None:
        raise ValueError(f"{policy.name}: the initial configuration is no plan of {world.name}")
    launched = world.pod_start_s + world.init_s
    events: list[tuple[float, Config | None]] = [(launched, first)]
    running: Config | None = None
    config = first  # the configuration the policy knows about (running or being applied)
    stable_since = math.inf
    now, trained, idle, paused = 0.0, 0.0, 0.0, 0.0
    pause_started: float | None = None
    reports: list[Report] = []
    next_report = math.inf
    wake = math.inf
    changes: list[tuple[float, Config]] = []
    final_plan_s = launched

    def rate() -> float:
        return steps_per_s(world, running) if running is not None else 0.0

    while now < horizon_s:
        # The next thing that happens: an event of a change, a report, a decision, the end.
        t_event = events[0][0] if events else math.inf
        speed = rate()
        t_end = now + (world.total_steps - trained) / speed if speed > 0 else math.inf
        t_next = min(t_event, next_report, wake, t_end)
        if running is None:
            idle += t_next - now
        trained += speed * (t_next - now)
        now = t_next
        if now == t_end:
            return RunResult(policy.name, world.name, now, final_plan_s, config, changes, idle)
        if now == t_event:
            _, running = events.pop(0)
            if running is not None:
                stable_since = now
                next_report = now + REPORT_S
                if pause_started is not None:
                    paused, pause_started = now - pause_started, None
                if not events:  # the change is complete: watch it, then decide
                    changes.append((now, running))
                    final_plan_s = now
                    wake = now + policy.next_check_s()
            else:
                next_report = wake = math.inf
                if changes:  # a PS change, not the launch
                    pause_started = now
            continue
        if now == next_report:
            assert running is not None
            reports.append(make_report(world, running, now, rng))
            next_report = now + REPORT_S
            continue
        # A decision.
        view = JobView(
            now, config, stable_since, trained, world.total_steps, world.budget, reports, paused
        )
        target = policy.decide(view)
        fitted = admit(world, target) if target is not None else None
        if fitted is None or fitted == config:
            wake = now + policy.next_check_s()
            continue
        events = transition(now, config, fitted, world.pod_start_s, world.init_s)
        config = fitted
        wake = math.inf
        paused = 0.0
        if events[0][0] == now:  # workers removed: immediate
            _, running = events.pop(0)
            stable_since = now
            changes.append((now, fitted))
            final_plan_s = now
            wake = now + policy.next_check_s()
            next_report = now + REPORT_S
    raise RuntimeError(f"{policy.name} on {world.name}: not done after {horizon_s:.0f} s")
