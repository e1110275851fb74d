"""A 1,000-job trace on one shared CPU budget: weighted greedy against FIFO.

Jobs arrive as a Poisson process; each is Wide&Deep-like or xDeepFM-like (coefficients within
+-20% of ``bench/simulator.py``'s, parameters evenly spread) with a log-normal size. A job's
throughput is ``ThroughputModel`` with its true coefficients (the trace is about allocation, so
every job's model is exact), its candidate plans the Pareto front of (cost, steps/s) over the
bounds, thinned to at most ``FRONT_SIZE`` plans.

- FIFO: jobs start in arrival order, each with its fastest plan (what it would ask for alone);
  the head of the queue waits until its plan fits; running jobs keep their plans.
- Weighted greedy (DLRover-RM Eqn. 11-14): at every arrival and completion, every running job's
  candidates (gain by ``throughput_gain``, counting the change's cost) and every waiting job's
  (gain = its effective steps/s after the launch) go to ``core.optimizer.weighted_greedy`` with
  the budget; the chosen plans are applied (a new job launches in 120 s, a running job changes
  as ``bench/_simcore.transition`` says).

JCT = completion - arrival (waiting included). Deterministic for a seed.
"""

from __future__ import annotations

import heapq
import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from airflow_rover.core.optimizer import (
    Budget,
    Candidate,
    JobCandidates,
    Prices,
    ScalingCosts,
    throughput_gain,
    weighted_greedy,
)
from airflow_rover.core.spec import ResourcePlan
from airflow_rover.core.throughput import Coefficients, JobShape, ThroughputModel
from bench._simcore import INIT_S, POD_START_S, TIME_UNIT_S, Config, transition

CPU = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
MAX_WORKERS, MAX_PS, JOB_CPU = 32, 16, 200.0
FRONT_SIZE = 12
LAUNCH_S = POD_START_S + INIT_S
COSTS = ScalingCosts(worker_start_s=LAUNCH_S, ps_start_s=POD_START_S, ps_reload_s=INIT_S)
PRICES = Prices()
PAPER = Coefficients.paper().as_array()
KINDS = {  # per-term multipliers of the paper's coefficients (as bench/simulator.py)
    "wide_deep": np.array([1.0, 24.0, 1.0, 1.0, 1.0]),
    "xdeepfm": np.array([12.0, 1.0, 1.0, 1.0, 1.0]),
}
SHAPE = JobShape(batch_size=1, model_size=0.25, bandwidth=1.0, embedding_dim=1)
PLACEHOLDER = ResourcePlan(num_workers=1, num_ps=1, worker_cpu=1.0, ps_cpu=1.0)


@dataclass(eq=False)
class TraceJob:
    index: int
    arrival: float
    steps: float
    model: ThroughputModel  # seconds
    front: list[ResourcePlan]  # cheapest first
    front_thr: np.ndarray
    fastest: ResourcePlan
    plan: ResourcePlan | None = None  # what runs (or will, once the launch is over)
    running: ResourcePlan | None = None
    done_steps: float = 0.0
    last_t: float = 0.0
    events: list[tuple[float, ResourcePlan | None]] = field(default_factory=list)
    start: float = math.nan
    end: float = math.nan

    def rate(self) -> float:
        return self.model.throughput(self.running) if self.running is not None else 0.0

    def advance(self, t: float) -> None:
        """Train up to ``t``, applying the job's pending plan events on the way."""
        while True:
            nxt = self.events[0][0] if self.events else math.inf
            stop = min(t, nxt)
            self.done_steps += self.rate() * (stop - self.last_t)
            self.last_t = stop
            if nxt <= t:
                self.running = self.events.pop(0)[1]
            else:
                return

    def finish_time(self) -> float:
        """When the job ends if nothing changes (its pending events included)."""
        t, done, running = self.last_t, self.done_steps, self.running
        for when, plan in [*self.events, (math.inf, None)]:
            rate = self.model.throughput(running) if running is not None else 0.0
            if rate > 0 and done + rate * (when - t) >= self.steps:
                return t + (self.steps - done) / rate
            if when == math.inf:
                return math.inf
            done += rate * (when - t)
            t, running = when, plan
        return math.inf


def cores(plan: ResourcePlan) -> float:
    return plan.num_workers * plan.worker_cpu + plan.num_ps * plan.ps_cpu


def front(model: ThroughputModel) -> tuple[list[ResourcePlan], np.ndarray]:
    """The Pareto front of (cores, steps/s) over the bounds, thinned to FRONT_SIZE plans."""
    w, p, wc, pc = (
        a.ravel()
        for a in np.meshgrid(
            np.arange(1, MAX_WORKERS + 1, dtype=float),
            np.arange(1, MAX_PS + 1, dtype=float),
            np.array(CPU),
            np.array(CPU),
            indexing="ij",
        )
    )
    c = model.coefficients
    t = c.grad / wc + c.upd * w / (p * pc) + c.sync * SHAPE.model_size * w / (p * SHAPE.bandwidth)
    t = t + c.emb / p + c.bias
    thr, cost = w / t, w * wc + p * pc
    ok = cost <= JOB_CPU
    order = np.lexsort((-thr[ok], cost[ok]))
    idx = np.flatnonzero(ok)[order]
    keep, best = [], -1.0
    for i in idx:
        if thr[i] > best * 1.02:  # at least 2% more than the last kept plan
            keep.append(i)
            best = thr[i]
    if len(keep) > FRONT_SIZE:
        picks = np.unique(np.linspace(0, len(keep) - 1, FRONT_SIZE).round().astype(int))
        keep = [keep[j] for j in picks]
    plans = [
        ResourcePlan(
            num_workers=int(w[i]), num_ps=int(p[i]), worker_cpu=float(wc[i]), ps_cpu=float(pc[i])
        )
        for i in keep
    ]
    return plans, thr[keep]


def make_jobs(n: int, seed: int, mean_gap_s: float) -> list[TraceJob]:
    rng = np.random.default_rng(seed)
    t, jobs = 0.0, []
    for i in range(n):
        t += rng.exponential(mean_gap_s)
        kind = "wide_deep" if rng.random() < 0.5 else "xdeepfm"
        coef = PAPER * KINDS[kind] * rng.uniform(0.8, 1.2, size=5) * TIME_UNIT_S
        model = ThroughputModel(Coefficients(*map(float, coef)), SHAPE)
        steps = float(np.clip(rng.lognormal(np.log(60_000), 1.0), 5_000, 1_000_000))
        plans, thr = front(model)
        jobs.append(TraceJob(i, t, steps, model, plans, thr, plans[-1], last_t=t))
    return jobs


@dataclass
class TraceResult:
    jobs: int
    budget: float
    mean_gap_s: float
    stats: dict[str, dict[str, float]]


def _launch(job: TraceJob, plan: ResourcePlan, now: float) -> None:
    job.plan, job.start, job.last_t = plan, now, now
    job.events = [(now + LAUNCH_S, plan)]


def _change(job: TraceJob, plan: ResourcePlan, now: float) -> None:
    assert job.plan is not None
    steps = transition(now, Config.of(job.plan), Config.of(plan))
    job.events = [(t, plan if cfg is not None else None) for t, cfg in steps]
    job.plan = plan


def _fifo(waiting: list[TraceJob], free: float, now: float) -> float:
    while waiting and cores(waiting[0].fastest) <= free + 1e-9:
        job = waiting.pop(0)
        _launch(job, job.fastest, now)
        free -= cores(job.fastest)
    return free


def _greedy(running: list[TraceJob], waiting: list[TraceJob], budget: float, now: float) -> None:
    options: list[JobCandidates] = []
    for job in running:
        assert job.plan is not None
        if job.events:  # still applying its last plan: leave it alone
            options.append(JobCandidates(str(job.index), job.plan, 0.0, 0.0, ()))
            continue
        left = job.steps - job.done_steps
        cands = tuple(
            Candidate(
                plan, PRICES.cost(plan), throughput_gain(job.model, job.plan, plan, left, COSTS)
            )
            for plan in job.front
            if plan != job.plan
        )
        options.append(JobCandidates(str(job.index), job.plan, job.rate(), left, cands))
    for job in waiting:
        effective = job.steps / (LAUNCH_S + job.steps / job.front_thr)
        cands = tuple(
            Candidate(plan, PRICES.cost(plan), float(g))
            for plan, g in zip(job.front, effective, strict=True)
        )
        options.append(JobCandidates(str(job.index), PLACEHOLDER, 0.0, job.steps, cands))
    held = cores(PLACEHOLDER) * len(waiting)  # placeholders count in the sum: give them room
    chosen = weighted_greedy(options, Budget(cpu=budget + held, memory_mb=math.inf))
    by_id = {str(j.index): j for j in [*running, *waiting]}
    for job_id, plan in chosen.items():
        job = by_id[job_id]
        if job.plan is None:
            _launch(job, plan, now)
            waiting.remove(job)
        else:
            _change(job, plan, now)


def simulate_trace(jobs: list[TraceJob], budget: float, policy: str) -> list[float]:
    """Run the trace under ``policy`` ("fifo" or "weighted-greedy"); JCT of every job."""
    arrivals = [(j.arrival, j.index) for j in jobs]
    heapq.heapify(arrivals)
    waiting: list[TraceJob] = []
    running: list[TraceJob] = []
    now = 0.0
    while arrivals or waiting or running:
        t_arrival = arrivals[0][0] if arrivals else math.inf
        ends = [(j.finish_time(), j.index) for j in running]
        t_end, end_id = min(ends) if ends else (math.inf, -1)
        now = min(t_arrival, t_end)
        if now == math.inf:
            raise RuntimeError(f"{policy}: {len(waiting)} jobs wait and nothing runs")
        for job in running:
            job.advance(now)
        if now == t_end:
            job = jobs[end_id]
            job.end = now
            running.remove(job)
        else:
            waiting.append(jobs[heapq.heappop(arrivals)[1]])
        if policy == "fifo":
            free = budget - sum(cores(j.plan) for j in running if j.plan is not None)
            pending = list(waiting)
            _fifo(waiting, free, now)
            running += [j for j in pending if j not in waiting]
        else:
            pending = list(waiting)
            _greedy(running, waiting, budget, now)
            running += [j for j in pending if j not in waiting]
    return [j.end - j.arrival for j in jobs]


def run_trace(seed: int = 0, jobs: int = 1000, budget: float = 1000.0) -> TraceResult:
    mean_gap_s = 130.0
    stats: dict[str, dict[str, float]] = {}
    for policy in ("fifo", "weighted-greedy"):
        trace = make_jobs(jobs, seed, mean_gap_s)
        jct = simulate_trace(trace, budget, policy)
        waits = [j.start - j.arrival for j in trace]
        stats[policy] = {
            "mean": statistics.fmean(jct),
            "median": statistics.median(jct),
            "p95": float(np.percentile(jct, 95)),
            "wait": statistics.fmean(waits),
            "makespan": max(j.end for j in trace),
        }
    return TraceResult(jobs, budget, mean_gap_s, stats)
