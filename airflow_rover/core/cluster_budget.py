"""What jobs that share a cluster budget tell each other: the registry's rows and the arbiter's
answers (``core.budget_arbiter`` decides; ``history.registry`` stores the rows).

A budget (``ClusterBudget``) is cores and memory that all the nodes of its jobs may hold
together. Every job that names it has one row: a waiting job (not launched: it holds nothing
and asks for its starting plan) or a running one (it holds its plan and may ask for its
master's pending proposal). A job's data workers are outside its plan: a row carries what they
hold (a running job's running ones, a waiting job's starting ones) beside it. Rows not
refreshed within their TTL are ignored (their trigger is gone): a dead triggerer never holds
the budget. Everything here is pure (no database, no Airflow).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from airflow_rover.core.optimizer import Budget
from airflow_rover.core.plans import PlanRecord, pending_plan
from airflow_rover.core.spec import ClusterBudget, DataWorkersConfig, ResourcePlan
from airflow_rover.core.states import JobState

DEFAULT_TTL_S = 60.0  # a row this old (or 3 polls old, if longer) no longer counts
ADMITTED_TTL_S = 300.0  # an admitted job's reservation, until its own trigger refreshes it


def ttl_for(poll_interval: float) -> float:
    """How long a job's registration counts without a refresh: a minute, or three polls."""
    return max(DEFAULT_TTL_S, 3.0 * poll_interval)


@dataclass(frozen=True)
class RunningJob:
    """One row of the registry: a job that shares a budget, what it holds, what it asks for.

    A ``waiting`` job has not started: it holds nothing and asks for ``plan`` (or ``min_plan``,
    when it may start smaller). A running job holds ``plan``; ``min_plan`` is the smallest
    plan the arbiter may shrink it to for a job of higher weight. ``data_workers``: (cores, MB)
    of its data workers, which no plan sizes and no plan change moves: held by a running job
    on top of its plan, asked for by a waiting one on top of the plan it starts with."""

    job_id: str
    budget: str
    plan: ResourcePlan
    remaining_samples: float
    samples_per_second: float
    updated_at: float
    ttl_s: float = DEFAULT_TTL_S
    proposal: PlanRecord | None = None  # the plan its master proposed and nobody applied yet
    weight: float = 1.0  # the job's ``autoscale.weight``: multiplies its priority
    waiting: bool = False
    min_plan: ResourcePlan | None = None
    waiting_since: float | None = None  # when a waiting job first asked (its place in line)
    data_workers: tuple[float, float] = (0.0, 0.0)

    def fresh(self, now: float) -> bool:
        return now - self.updated_at <= self.ttl_s

    @property
    def holds(self) -> ResourcePlan | None:
        """The plan the job holds in the budget: none while it waits."""
        return None if self.waiting else self.plan

    def needs(self, plan: ResourcePlan | None) -> tuple[float, float]:
        """(cores, MB) the job holds, or asks for, with ``plan``: its nodes and its data
        workers."""
        cpu, memory_mb = Budget.used(plan)
        return cpu + self.data_workers[0], memory_mb + self.data_workers[1]

    def admitted(self, plan: ResourcePlan) -> RunningJob:
        """The row of a waiting job once admitted with ``plan``: it holds the plan until its
        trigger, once the job runs, writes what the job really holds."""
        return replace(
            self, waiting=False, plan=plan, proposal=None, ttl_s=max(self.ttl_s, ADMITTED_TTL_S)
        )

    def reserved(self) -> RunningJob:
        """The row once its proposal is applied: it holds the proposed plan."""
        if self.proposal is None:
            return self
        return replace(self, plan=self.proposal.plan, proposal=None)


def waiting_row(
    job_id: str,
    budget: ClusterBudget,
    plan: ResourcePlan,
    now: float,
    waiting_since: float,
    min_plan: ResourcePlan | None = None,
    weight: float = 1.0,
    remaining_samples: float = 0.0,
    ttl_s: float = DEFAULT_TTL_S,
    data_workers: tuple[float, float] = (0.0, 0.0),
) -> RunningJob:
    """The registry row of a job waiting for ``budget``; its samples/s is left to the
    arbiter's estimate (its peers' rate per worker). ``data_workers``: what the data workers
    it starts with need (``data_workers_request``)."""
    return RunningJob(
        job_id=job_id,
        budget=budget.name,
        plan=plan,
        remaining_samples=remaining_samples,
        samples_per_second=0.0,
        updated_at=now,
        ttl_s=ttl_s,
        weight=weight,
        waiting=True,
        min_plan=min_plan,
        waiting_since=waiting_since,
        data_workers=data_workers,
    )


def data_workers_request(config: DataWorkersConfig) -> tuple[float, float]:
    """(cores, MB) the data workers a job starts with need (none when they are off)."""
    return config.start * config.cpu, float(config.start * config.memory_mb)


def data_workers_held(status: Mapping[str, Any], config: DataWorkersConfig) -> tuple[float, float]:
    """(cores, MB) a running job's data workers hold: those its master's status reports
    running (``data_workers.running``), each sized as the spec says; a status without the
    count (a master not reporting yet) counts those the job starts with."""
    running = (status.get("data_workers") or {}).get("running")
    if not isinstance(running, int | float) or isinstance(running, bool) or running < 0:
        return data_workers_request(config)
    return int(running) * config.cpu, float(int(running) * config.memory_mb)


def data_worker_cap(
    rows: Iterable[RunningJob],
    budget: ClusterBudget,
    job: RunningJob,
    config: DataWorkersConfig,
    now: float,
) -> int:
    """The most data workers ``job`` may run now: those it runs, plus as many as fit in what
    the budget has left once every fresh row's holding (and every waiting job's ask: a job
    that waits for room comes before data workers) is counted; within ``[min, max]``."""
    free = limits(budget)
    used_cpu = used_mb = 0.0
    for row in rows:
        if row.fresh(now) and row.job_id != job.job_id:
            cpu, mb = row.needs(row.plan)  # a waiting row: what it asks for
            used_cpu, used_mb = used_cpu + cpu, used_mb + mb
    cpu, mb = job.needs(job.plan)
    left_cpu, left_mb = free.cpu - used_cpu - cpu, free.memory_mb - used_mb - mb
    running = round(job.data_workers[0] / config.cpu) if config.cpu > 0 else 0
    more = min(left_cpu / config.cpu, left_mb / config.memory_mb)
    extra = 0 if more <= 0 else (config.max if math.isinf(more) else math.floor(more))
    return max(config.min, min(config.max, running + extra))


def throughput_of(status: Mapping[str, Any]) -> float:
    """The job's samples/s: its newest profile sample under today's plan (a rate measured
    after the plan's sampling period), else the master's current rate."""
    plan = status.get("plan")
    samples = (status.get("profile") or {}).get("throughput") or []
    for sample in reversed(samples):
        if isinstance(sample, Mapping) and sample.get("plan") == plan:
            rate = sample.get("samples_per_second")
            if isinstance(rate, int | float) and rate > 0:
                return float(rate)
    rate = status.get("throughput")
    return float(rate) if isinstance(rate, int | float) and rate > 0 else 0.0


def running_job(
    status: Mapping[str, Any],
    plans: Sequence[PlanRecord],
    budget: str,
    now: float,
    ttl_s: float = DEFAULT_TTL_S,
    data_workers: DataWorkersConfig | None = None,
) -> RunningJob | None:
    """The registry row of a job from its master's status and its plan records; None when the
    status names no job or no plan. Only a running job offers its proposal (the master applies
    plans only then). ``data_workers``: the spec's, which size the data workers it holds
    (``data_workers_held``); None: it has none."""
    job_id, plan = status.get("job_id"), status.get("plan")
    if not job_id or not isinstance(plan, Mapping):
        return None
    try:
        current = ResourcePlan.model_validate(plan)
    except ValidationError:
        return None
    progress = status.get("progress") or {}
    total, done = progress.get("samples_total"), progress.get("samples_done")
    remaining = (
        max(0.0, float(total) - float(done))
        if isinstance(total, int | float) and isinstance(done, int | float)
        else 0.0
    )
    proposal = pending_plan(plans) if status.get("state") == JobState.RUNNING else None
    return RunningJob(
        min_plan=smallest_plan(status, current),
        weight=weight_of(status),
        job_id=str(job_id),
        budget=budget,
        plan=current,
        remaining_samples=remaining,
        samples_per_second=throughput_of(status),
        updated_at=now,
        ttl_s=ttl_s,
        proposal=proposal,
        data_workers=(0.0, 0.0)
        if data_workers is None
        else data_workers_held(status, data_workers),
    )


def smallest_plan(status: Mapping[str, Any], plan: ResourcePlan) -> ResourcePlan:
    """``plan`` with the fewest workers the job's autoscale bounds allow (its PS keep their
    partitions: a PS change costs a reload, a worker change does not)."""
    low = (status.get("autoscale") or {}).get("min_workers")
    return with_fewest_workers(plan, int(low) if isinstance(low, int | float) and low >= 1 else 1)


def with_fewest_workers(plan: ResourcePlan, min_workers: int) -> ResourcePlan:
    """``plan`` down to ``min_workers`` workers (unchanged if it has no more)."""
    return plan.with_counts(num_workers=min(plan.num_workers, min_workers))


def weight_of(status: Mapping[str, Any]) -> float:
    """The job's ``autoscale.weight`` from its status; 1 when the status has none."""
    value = (status.get("autoscale") or {}).get("weight")
    return float(value) if isinstance(value, int | float) and value > 0 else 1.0


def proposal_gain(job: RunningJob) -> float:
    """Samples/s the job's proposal adds: the master's figure, else linear worker scaling."""
    proposal = job.proposal
    if proposal is None:
        return 0.0
    if proposal.expected_gain is not None:
        return proposal.expected_gain
    old, new = job.plan.num_workers, proposal.plan.num_workers
    if new == old:
        return 0.0
    return job.samples_per_second * (new / old - 1.0)


def limits(budget: ClusterBudget) -> Budget:
    """The budget as the optimizer's ``Budget`` (a limit left out is infinite)."""
    return Budget(
        cpu=budget.cpu if budget.cpu is not None else math.inf,
        memory_mb=float(budget.memory_mb) if budget.memory_mb is not None else math.inf,
    )


@dataclass(frozen=True)
class Verdict:
    """What the arbiter says about one running job's pending proposal."""

    job_id: str
    proposal_id: int
    allowed: bool
    reason: str
    gain: float
    score: float | None = None  # RE * WG * weight, when the proposal was contested
    plan: ResourcePlan | None = None  # the proposed plan


@dataclass(frozen=True)
class Admission:
    """What the arbiter says about a waiting job: start now with ``plan``, or wait."""

    job_id: str
    plan: ResourcePlan | None  # the plan it starts with; None: it waits
    reason: str
    score: float | None = None

    @property
    def admitted(self) -> bool:
        return self.plan is not None


@dataclass(frozen=True)
class Shrink:
    """An order to a running job: go down to ``plan`` to make room for ``for_job``."""

    job_id: str
    plan: ResourcePlan
    for_job: str
    reason: str


@dataclass(frozen=True)
class Decision:
    """The arbiter's answer for every fresh job of a budget: the running jobs' pending
    proposals, the waiting jobs, and the running jobs to shrink."""

    budget: str
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    admissions: dict[str, Admission] = field(default_factory=dict)
    shrinks: dict[str, Shrink] = field(default_factory=dict)
    cpu_used: float = 0.0  # by the fresh jobs' plans once the allowed changes are applied
    memory_mb_used: float = 0.0

    def allowed(self, job_id: str) -> bool:
        verdict = self.verdicts.get(job_id)
        return verdict is not None and verdict.allowed

    def admitted_plan(self, job_id: str) -> ResourcePlan | None:
        admission = self.admissions.get(job_id)
        return admission.plan if admission is not None else None

    @property
    def selected(self) -> set[str]:
        return {job_id for job_id, v in self.verdicts.items() if v.allowed}


def describe(cpu: float, memory_mb: float) -> str:
    """Cores and MB in words, leaving out an infinite (unlimited) one."""
    parts = []
    if math.isfinite(cpu):
        parts.append(f"{cpu:g} cores")
    if math.isfinite(memory_mb):
        parts.append(f"{memory_mb:g} MB")
    return " and ".join(parts) or "nothing"
