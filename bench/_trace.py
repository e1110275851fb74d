"""A 1,000-job trace on one shared CPU budget: the cluster arbiter against FIFO.

Jobs arrive as a Poisson process; each is Wide&Deep-like or xDeepFM-like (coefficients within
+-20% of ``bench/simulator.py``'s, parameters evenly spread) with a log-normal size. A job's
throughput is ``ThroughputModel`` with its true coefficients (the trace is about allocation, so
every job's model is exact), its candidate plans the Pareto front of (cost, steps/s) over the
bounds, thinned to at most ``FRONT_SIZE`` plans.

- FIFO: jobs start in arrival order, each with its fastest plan (what it would ask for alone);
  the head of the queue waits until its plan fits; running jobs keep their plans.
- Arbiter: at every arrival, completion and end of a launch or plan change, the registry rows
  the jobs' triggers would write go to ``core.budget_arbiter.allocate`` (the code the live
  triggers call). A waiting job asks for its fastest plan and may start with one worker; a
  running job offers the proposal its master would make (``best_plan`` over its front, gain by
  ``throughput_gain``, at least ``MIN_MODEL_GAIN`` more steps/s), none while a change is under
  way. Admitted jobs launch (120 s), allowed proposals and shrinks change plans as
  ``bench/_simcore.transition`` says.

JCT = completion - arrival (waiting included). Deterministic for a seed.
"""

from __future__ import annotations

import heapq
import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from airflow_rover.core.budget_arbiter import allocate
from airflow_rover.core.cluster_budget import RunningJob, smallest_plan
from airflow_rover.core.optimizer import (
    Candidate,
    Prices,
    ScalingCosts,
    best_plan,
    throughput_gain,
)
from airflow_rover.core.plans import PlanRecord
from airflow_rover.core.spec import ClusterBudget, ResourcePlan
from airflow_rover.core.throughput import (
    REFERENCE_BATCH,
    REFERENCE_DIM,
    Coefficients,
    JobShape,
    ThroughputModel,
)
from airflow_rover.master.autoscaler import MIN_MODEL_GAIN
from bench._simcore import INIT_S, POD_START_S, Config, transition
from bench.worlds.dlrover_rm import TIME_UNIT_S

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
SHAPE = JobShape(REFERENCE_BATCH, model_size=0.25, bandwidth=1.0, embedding_dim=REFERENCE_DIM)
BUDGET_NAME = "trace"
POLICIES = ("fifo", "arbiter")


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
        steps *= REFERENCE_BATCH  # counted in samples, as the model's throughput
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


def _row(job: TraceJob, now: float) -> RunningJob:
    """The registry row a running job's trigger writes: the plan it holds, its samples/s, and
    the proposal its master would make (none while a change is under way)."""
    assert job.plan is not None
    left = job.steps - job.done_steps
    proposal = None
    if not job.events:
        cands = [
            Candidate(
                plan, PRICES.cost(plan), throughput_gain(job.model, job.plan, plan, left, COSTS)
            )
            for plan in job.front
        ]
        best = best_plan(cands, job.plan, MIN_MODEL_GAIN * job.model.throughput(job.plan))
        if best is not None:
            proposal = PlanRecord(id=1, plan=best.plan, expected_gain=best.gain)
    return RunningJob(
        job_id=str(job.index),
        budget=BUDGET_NAME,
        plan=job.plan,
        remaining_samples=left,
        samples_per_second=job.model.throughput(job.plan),
        updated_at=now,
        proposal=proposal,
        min_plan=smallest_plan({}, job.plan),
    )


def _waiting_row(job: TraceJob, now: float) -> RunningJob:
    """The row of a job not launched: it asks for the plan it would run alone (what its warm
    start picks) and may start with one worker (``autoscale.admit_at_minimum``, min_workers 1)."""
    return RunningJob(
        job_id=str(job.index),
        budget=BUDGET_NAME,
        plan=job.fastest,
        remaining_samples=job.steps,
        samples_per_second=job.model.throughput(job.fastest),
        updated_at=now,
        waiting=True,
        min_plan=smallest_plan({}, job.fastest),
        waiting_since=job.arrival,
    )


def _arbiter(running: list[TraceJob], waiting: list[TraceJob], budget: float, now: float) -> None:
    """One decision of ``core.budget_arbiter.allocate`` over every job, applied: shrinks and
    allowed proposals change running jobs, admitted jobs launch with their admitted plan."""
    rows = [_row(j, now) for j in running] + [_waiting_row(j, now) for j in waiting]
    decision = allocate(rows, ClusterBudget(name=BUDGET_NAME, cpu=budget), now, PRICES)
    by_id = {str(j.index): j for j in [*running, *waiting]}
    for shrink in decision.shrinks.values():
        _change(by_id[shrink.job_id], shrink.plan, now)
    for verdict in decision.verdicts.values():
        if verdict.allowed and verdict.plan is not None:
            _change(by_id[verdict.job_id], verdict.plan, now)
    for admission in decision.admissions.values():
        if admission.plan is not None:
            job = by_id[admission.job_id]
            _launch(job, admission.plan, now)
            waiting.remove(job)


def simulate_trace(jobs: list[TraceJob], budget: float, policy: str) -> list[float]:
    """Run the trace under ``policy`` ("fifo" or "arbiter"); JCT of every job. Decisions are
    taken at every arrival, completion, and end of a launch or plan change."""
    if policy not in POLICIES:
        raise ValueError(f"policy: {policy!r}; accepted: {', '.join(POLICIES)}")
    arrivals = [(j.arrival, j.index) for j in jobs]
    heapq.heapify(arrivals)
    waiting: list[TraceJob] = []
    running: list[TraceJob] = []
    now = 0.0
    while arrivals or waiting or running:
        t_arrival = arrivals[0][0] if arrivals else math.inf
        ends = [(j.finish_time(), j.index) for j in running]
        t_end, end_id = min(ends) if ends else (math.inf, -1)
        t_change = min((j.events[0][0] for j in running if j.events), default=math.inf)
        now = min(t_arrival, t_end, t_change)
        if now == math.inf:
            raise RuntimeError(f"{policy}: {len(waiting)} jobs wait and nothing runs")
        for job in running:
            job.advance(now)
        if now == t_end:
            job = jobs[end_id]
            job.end = now
            running.remove(job)
        elif now == t_arrival:
            waiting.append(jobs[heapq.heappop(arrivals)[1]])
        pending = list(waiting)
        if policy == "fifo":
            free = budget - sum(cores(j.plan) for j in running if j.plan is not None)
            _fifo(waiting, free, now)
        else:
            _arbiter(running, waiting, budget, now)
        running += [j for j in pending if j not in waiting]
    return [j.end - j.arrival for j in jobs]


def run_trace(seed: int = 0, jobs: int = 1000, budget: float = 1000.0) -> TraceResult:
    mean_gap_s = 130.0
    stats: dict[str, dict[str, float]] = {}
    for policy in POLICIES:
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
