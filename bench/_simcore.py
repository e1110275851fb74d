"""The simulated world of ``bench/simulator.py``: what a PS training job really does.

Ground truth (what the policies never see directly). One iteration of one worker takes

    T = a_grad*m/lw + max_j [ a_upd*w*s_j/c_j + a_emb*m*D*s_j + a_sync*(M*s_j)/(B/w) ] + b

in units of ``TIME_UNIT_S``: a worker waits for its slowest PS (push and pull go to every PS),
and PS ``j`` holds the share ``s_j`` of the parameters and has ``c_j`` cores. With an even
split (``s_j = 1/p``) and equal PS this is exactly DLRover-RM's Eqn. 1-5, i.e.
``airflow_rover.core.throughput.ThroughputModel``. Work is counted in batches (one batch = one
global step of ``m = 1`` unit of the paper's batch of 512) and the embedding width in units of
the reference width (``D = 1``): the paper's coefficients only make sense on such normalised
features (with raw m = 512 and D = 16 the update term would be ~0 and the lookup term ~20 s).

Hot PS: TensorFlow places parameters a whole tensor at a time, so one large tensor (share
``hot_share`` of the parameters) lands on PS 0, which then holds ``h + (1 - h)/p`` of the
model. More cores on the PS shrink its update time (the fix); more PS of the same size only
shrink the ``(1 - h)/p`` part.

What a policy observes every ``REPORT_S`` seconds of steady training: the mean iteration time
(log-normal noise ``noise``), the CPU each worker and each PS uses (cores; a PS is busy
``a_upd*w*s_j/c_j`` of each iteration, a worker ``a_grad*m/lw``) and the global steps/s.

Scaling costs real time (DLRover section 6.3): a pod starts in ``POD_START_S`` (20 s) and a
training process initialises in ``INIT_S`` (100 s). New or resized workers join after both
while the old ones train on; removed workers leave at once; any PS change lets training go on
while the new PS pods start, then pauses it for ``INIT_S`` (checkpoint, re-partition, restore,
every worker reconnects). The job's first launch costs ``POD_START_S + INIT_S`` too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from airflow_rover.core.spec import ResourcePlan
from airflow_rover.core.throughput import Coefficients, JobShape

TIME_UNIT_S = 0.01  # the model's iteration time unit (the paper's coefficients give ~50-200)
POD_START_S = 20.0
INIT_S = 100.0
SAMPLE_S = 60.0  # how long a policy watches a new configuration before it judges it
REPORT_S = 10.0  # profiler report interval


@dataclass(frozen=True)
class Workload:
    """A job's true behaviour and size."""

    name: str
    truth: Coefficients  # in TIME_UNIT_S
    shape: JobShape
    hot_share: float = 0.0  # share of the parameters in the one big tensor on PS 0
    total_steps: float = 200_000.0
    noise: float = 0.05  # relative sd of one iteration-time report
    cpu_noise: float = 0.05
    label: str = ""

    def shares(self, p: int) -> np.ndarray:
        s = np.full(p, (1.0 - self.hot_share) / p)
        s[0] += self.hot_share
        return s


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


def ps_times(wl: Workload, cfg: Config) -> np.ndarray:
    """Seconds-per-unit each PS needs per iteration (update + lookups + sync), per PS."""
    c, sh = wl.truth, wl.shape
    s = wl.shares(cfg.num_ps)
    cores = np.array(cfg.ps_cpu)
    w = cfg.workers
    return (
        c.upd * w * s / cores
        + c.emb * sh.batch_size * sh.embedding_dim * s
        + c.sync * sh.model_size * s * w / sh.bandwidth
    )


def iteration_time(wl: Workload, cfg: Config) -> float:
    """True mean iteration time of one worker, in TIME_UNIT_S."""
    c, sh = wl.truth, wl.shape
    return float(c.grad * sh.batch_size / cfg.worker_cpu + ps_times(wl, cfg).max() + c.bias)


def steps_per_s(wl: Workload, cfg: Config) -> float:
    return cfg.workers * wl.shape.batch_size / (iteration_time(wl, cfg) * TIME_UNIT_S)


def grid_throughput(
    wl: Workload,
    max_workers: int,
    max_ps: int,
    cpu_choices: Sequence[float],
) -> tuple[np.ndarray, ...]:
    """Every uniform plan of the bounds at once: (w, p, worker cpu, ps cpu, steps/s)."""
    w, p, wc, pc = np.meshgrid(
        np.arange(1, max_workers + 1, dtype=float),
        np.arange(1, max_ps + 1, dtype=float),
        np.array(cpu_choices, dtype=float),
        np.array(cpu_choices, dtype=float),
        indexing="ij",
    )
    w, p, wc, pc = (a.ravel() for a in (w, p, wc, pc))
    c, sh, h = wl.truth, wl.shape, wl.hot_share
    s0 = h + (1 - h) / p  # PS 0 is the busiest (equal cores, largest share)
    ps = (
        c.upd * w * s0 / pc
        + c.emb * sh.batch_size * sh.embedding_dim * s0
        + c.sync * sh.model_size * s0 * w / sh.bandwidth
    )
    t = c.grad * sh.batch_size / wc + ps + c.bias
    return w, p, wc, pc, w * sh.batch_size / (t * TIME_UNIT_S)


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


def make_report(wl: Workload, cfg: Config, t: float, rng: np.random.Generator) -> Report:
    c, sh = wl.truth, wl.shape
    t_iter = iteration_time(wl, cfg)
    noisy = t_iter * float(np.exp(rng.normal(0.0, wl.noise)))
    s = wl.shares(cfg.num_ps)
    busy = c.upd * cfg.workers * s / np.array(cfg.ps_cpu) / t_iter  # share of each PS's time
    ps_noise = np.exp(rng.normal(0.0, wl.cpu_noise, size=cfg.num_ps))
    ps_used = np.minimum(busy * ps_noise, 1.0) * np.array(cfg.ps_cpu)
    worker_busy = c.grad * sh.batch_size / cfg.worker_cpu / t_iter
    worker_used = min(worker_busy * float(np.exp(rng.normal(0.0, wl.cpu_noise))), 1.0)
    return Report(
        t=t,
        config=cfg,
        iteration_s=noisy * TIME_UNIT_S,
        steps_per_s=cfg.workers * sh.batch_size / (noisy * TIME_UNIT_S),
        worker_cpu_used=worker_used * cfg.worker_cpu,
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

    @property
    def remaining(self) -> float:
        return max(self.total - self.trained, 0.0)

    def recent(self, n: int | None = None) -> list[Report]:
        """Reports of the current configuration (the last ``n`` of them)."""
        mine = [r for r in self.reports if r.t > self.stable_since and r.config == self.config]
        return mine if n is None else mine[-n:]


@dataclass(frozen=True)
class Limits:
    """The job's bounds, the same for every policy: node counts and cores per node."""

    max_workers: int = 32
    max_ps: int = 16
    max_cpu: float = 32.0


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


def admit(cfg: Config, budget: float, limits: Limits) -> Config | None:
    """What the cluster lets run: nodes within the job's bounds (counts, cores per node) and
    its CPU quota; workers beyond the quota stay pending (not running)."""
    cap = limits.max_cpu
    ps = tuple(min(c, cap) for c in cfg.ps_cpu[: limits.max_ps])
    worker_cpu = min(cfg.worker_cpu, cap)
    workers = min(cfg.workers, limits.max_workers)
    room = budget - sum(ps)
    workers = min(workers, math.floor(room / worker_cpu + 1e-9))
    if workers < 1:
        return None
    return Config(workers, worker_cpu, ps)


def transition(now: float, old: Config, new: Config) -> list[tuple[float, Config | None]]:
    """Timeline of a change: ``(time, running config or None for paused)`` from ``now``."""
    if new.ps_cpu != old.ps_cpu:
        return [(now + POD_START_S, None), (now + POD_START_S + INIT_S, new)]
    if new.worker_cpu == old.worker_cpu and new.workers < old.workers:
        return [(now, new)]
    return [(now + POD_START_S + INIT_S, new)]


def simulate(
    wl: Workload,
    policy: Policy,
    budget: float,
    seed: int,
    limits: Limits | None = None,
    horizon_s: float = 7 * 24 * 3600.0,
) -> RunResult:
    """Run one job under ``policy`` until its last step; deterministic for ``seed``."""
    rng = np.random.default_rng(seed)
    limits = limits or Limits()
    first = admit(policy.initial(), budget, limits)
    if first is None:
        raise ValueError(f"{policy.name}: the initial configuration does not fit the budget")
    events: list[tuple[float, Config | None]] = [(POD_START_S + INIT_S, first)]
    running: Config | None = None
    config = first  # the configuration the policy knows about (running or being applied)
    stable_since = math.inf
    now, trained, idle = 0.0, 0.0, 0.0
    reports: list[Report] = []
    next_report = math.inf
    wake = math.inf
    changes: list[tuple[float, Config]] = []
    final_plan_s = POD_START_S + INIT_S

    def rate() -> float:
        return steps_per_s(wl, running) if running is not None else 0.0

    while now < horizon_s:
        # The next thing that happens: an event of a change, a report, a decision, the end.
        t_event = events[0][0] if events else math.inf
        speed = rate()
        t_end = now + (wl.total_steps - trained) / speed if speed > 0 else math.inf
        t_next = min(t_event, next_report, wake, t_end)
        if running is None:
            idle += t_next - now
        trained += speed * (t_next - now)
        now = t_next
        if now == t_end:
            return RunResult(policy.name, wl.name, now, final_plan_s, config, changes, idle)
        if now == t_event:
            _, running = events.pop(0)
            if running is not None:
                stable_since = now
                next_report = now + REPORT_S
                if not events:  # the change is complete: watch it, then decide
                    changes.append((now, running))
                    final_plan_s = now
                    wake = now + SAMPLE_S
            else:
                next_report = wake = math.inf
            continue
        if now == next_report:
            assert running is not None
            reports.append(make_report(wl, running, now, rng))
            next_report = now + REPORT_S
            continue
        # A decision.
        view = JobView(now, config, stable_since, trained, wl.total_steps, budget, reports)
        target = policy.decide(view)
        fitted = admit(target, budget, limits) if target is not None else None
        if fitted is None or fitted == config:
            wake = now + policy.next_check_s()
            continue
        events = transition(now, config, fitted)
        config = fitted
        wake = math.inf
        if events[0][0] == now:  # workers removed: immediate
            _, running = events.pop(0)
            stable_since = now
            changes.append((now, fitted))
            final_plan_s = now
            wake = now + SAMPLE_S
            next_report = now + REPORT_S
    raise RuntimeError(f"{policy.name} on {wl.name}: not done after {horizon_s:.0f} s")
