"""The registry of running jobs that share a cluster budget, in the history store's database.

Tables (created on first use, like the history's: ``CREATE TABLE IF NOT EXISTS``):

- ``rover_running_jobs``: one row per running job that names a budget: the budget, the plan
  it holds, its pending proposal (id, plan, expected gain when the master gives one, rule),
  what its data workers hold beside the plan (cores, MB), its remaining samples and samples/s,
  ``updated_at`` and ``ttl_s``. The job's trigger upserts the row on every poll and deletes it
  when the job ends; a row older than its ``ttl_s`` is ignored (and purged), so a triggerer
  that died never holds the budget.
  A job waiting to start has a row too (``waiting``): it holds nothing and asks for its plan.
- ``rover_budget_locks``: one row per budget, updated first in every decision's transaction.
  That UPDATE takes the row's lock (PostgreSQL, MySQL) or the database's write lock (SQLite),
  so two triggers never decide on one budget at once.
- ``rover_budget_decisions``: what the arbiter decided for each job and why (admit, wait, grow,
  hold, shrink), a row each time a job's decision changes.

``decide`` (a running job's trigger) and ``admit`` (a waiting job's) register the job, read the
budget's fresh rows, ask the pure arbiter (``core.budget_arbiter.allocate``) and, when the
job's proposal is selected or the job admitted, record the plan as held before the transaction
ends: the next decision, by any trigger, already counts it. The trigger then applies the plan
(or the operator launches the job); the next poll's upsert writes whatever plan the master
really runs (a declined plan gives its reservation back).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import IntegrityError

from airflow_rover.core.budget_arbiter import allocate
from airflow_rover.core.cluster_budget import DEFAULT_TTL_S, Decision, RunningJob
from airflow_rover.core.plans import PlanRecord
from airflow_rover.core.spec import ClusterBudget, ResourcePlan
from airflow_rover.history.schema import add_missing_columns
from airflow_rover.history.store_tables import StoreTables

metadata = MetaData()  # apart from the history's: ``HistoryStore.ensure_schema`` is unchanged

running_jobs = Table(
    "rover_running_jobs",
    metadata,
    Column("job_id", String(200), primary_key=True),
    Column("budget", String(100), nullable=False),
    Column("plan", JSON, nullable=False),  # the ResourcePlan the job holds (or has reserved)
    Column("proposal_id", Integer),  # the master's pending proposal, if any
    Column("proposal_plan", JSON),
    Column("proposal_gain", Float),  # samples/s the master expects; NULL: the arbiter estimates
    Column("proposal_rule", String(50)),
    Column("remaining_samples", Float, nullable=False),
    Column("samples_per_second", Float, nullable=False),
    Column("ttl_s", Float, nullable=False),
    Column("updated_at", Float, nullable=False),  # seconds since the epoch
    Column("weight", Float),  # the job's autoscale.weight; NULL (older rows): 1
    Column("waiting", Boolean),  # not launched yet: holds nothing; NULL (older rows): running
    Column("min_plan", JSON),  # the smallest plan it may start at or be shrunk to
    Column("waiting_since", Float),
    Column("data_workers_cpu", Float),  # its data workers' cores beside the plan; NULL: none
    Column("data_workers_memory_mb", Float),
    Index("ix_rover_running_jobs_budget", "budget"),
)

budget_decisions = Table(
    "rover_budget_decisions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("budget", String(100), nullable=False),
    Column("at", Float, nullable=False),
    Column("job_id", String(200), nullable=False),
    Column("action", String(20), nullable=False),  # admit, wait, grow, hold, shrink
    Column("plan", JSON),  # the plan admitted, proposed or shrunk to
    Column("reason", Text, nullable=False),
    Index("ix_rover_budget_decisions_job", "budget", "job_id"),
)

budget_locks = Table(
    "rover_budget_locks",
    metadata,
    Column("budget", String(100), primary_key=True),
    Column("holder", String(200)),  # the job whose trigger decided last
    Column("at", Float),
)

_local_locks: dict[tuple[str, str], threading.Lock] = {}
_local_locks_guard = threading.Lock()


def _local_lock(url: URL, budget: str) -> threading.Lock:
    """One lock per database and budget in this process (the triggers of one triggerer run in
    threads here; the database lock orders processes)."""
    key = (url.render_as_string(hide_password=True), budget)
    with _local_locks_guard:
        return _local_locks.setdefault(key, threading.Lock())


class RunningJobRegistry(StoreTables):
    """Read and write the running-jobs registry in ``store``'s database."""

    metadata = metadata

    def upgrade(self) -> None:
        """Its rows are short-lived, so a NULL in a column added here is read as the default."""
        add_missing_columns(self.engine, running_jobs)

    # -- rows --------------------------------------------------------------------------------
    def register(self, job: RunningJob) -> None:
        """Insert or replace the job's row."""
        self.ensure_schema()
        try:
            with self.engine.begin() as conn:
                _upsert(conn, job)
        except IntegrityError:  # a concurrent first insert of the same job: now it exists
            with self.engine.begin() as conn:
                _upsert(conn, job)

    def remove(self, job_id: str) -> bool:
        """Delete the job's row (its job ended); False if there was none."""
        self.ensure_schema()
        with self.engine.begin() as conn:
            result = conn.execute(delete(running_jobs).where(running_jobs.c.job_id == job_id))
        return bool(result.rowcount)

    def remove_waiting(self, job_id: str) -> bool:
        """Delete the job's row if it still waits (an admitted job's reservation stays)."""
        self.ensure_schema()
        with self.engine.begin() as conn:
            result = conn.execute(
                delete(running_jobs)
                .where(running_jobs.c.job_id == job_id)
                .where(running_jobs.c.waiting.is_(True))
            )
        return bool(result.rowcount)

    def jobs(
        self, budget: str | None = None, now: float | None = None, include_stale: bool = False
    ) -> list[RunningJob]:
        """The rows of ``budget`` (every budget: None), by job id; fresh ones only unless
        ``include_stale``."""
        self.ensure_schema()
        now = time.time() if now is None else now
        with self.engine.connect() as conn:
            return _rows(conn, budget, None if include_stale else now)

    def purge(self, now: float | None = None) -> int:
        """Delete every row older than its TTL; returns how many."""
        self.ensure_schema()
        now = time.time() if now is None else now
        with self.engine.begin() as conn:
            return _purge(conn, now)

    # -- deciding ----------------------------------------------------------------------------
    def decide(self, job: RunningJob, budget: ClusterBudget, now: float | None = None) -> Decision:
        """Register the running ``job`` and decide on the budget, holding its lock; if the
        job's proposal is selected its row holds the proposed plan from now on."""

        def hold(conn: Connection, decision: Decision) -> None:
            if decision.allowed(job.job_id):
                _upsert(conn, job.reserved())

        return self._decide(job, budget, now, hold)

    def admit(self, job: RunningJob, budget: ClusterBudget, now: float | None = None) -> Decision:
        """Register the waiting ``job`` and decide on the budget, holding its lock; if the
        job is admitted its row holds the admitted plan from now on (see
        ``RunningJob.admitted``): launch it."""

        now = time.time() if now is None else now
        asking = replace(job, waiting=True)

        def hold(conn: Connection, decision: Decision) -> None:
            plan = decision.admitted_plan(job.job_id)
            if plan is not None:
                _upsert(conn, replace(asking, updated_at=now).admitted(plan))

        return self._decide(asking, budget, now, hold)

    def decisions(
        self, budget: str | None = None, job_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The recorded decisions, oldest first, of one budget or job (or all)."""
        self.ensure_schema()
        query = select(budget_decisions).order_by(budget_decisions.c.id)
        if budget is not None:
            query = query.where(budget_decisions.c.budget == budget)
        if job_id is not None:
            query = query.where(budget_decisions.c.job_id == job_id)
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def _decide(
        self,
        job: RunningJob,
        budget: ClusterBudget,
        now: float | None,
        hold: Callable[[Connection, Decision], None],
    ) -> Decision:
        self.ensure_schema()
        now = time.time() if now is None else now
        job = replace(job, budget=budget.name)
        with _local_lock(self.store.url, budget.name):
            self._ensure_lock_row(budget.name)
            with self.engine.begin() as conn:
                conn.execute(
                    update(budget_locks)
                    .where(budget_locks.c.budget == budget.name)
                    .values(holder=job.job_id, at=now)
                )
                _upsert(conn, job)
                _purge(conn, now)
                decision = allocate(_rows(conn, budget.name, now), budget, now)
                hold(conn, decision)
                _record(conn, decision, job.job_id, now)
        return decision

    def _ensure_lock_row(self, budget: str) -> None:
        with self.engine.connect() as conn:
            exists = conn.execute(
                select(budget_locks.c.budget).where(budget_locks.c.budget == budget)
            ).first()
        if exists:
            return
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(budget_locks).values(budget=budget, holder=None, at=None))
        except IntegrityError:  # a concurrent first decision created it
            pass


def _upsert(conn: Connection, job: RunningJob) -> None:
    proposal = job.proposal
    row: dict[str, Any] = {
        "budget": job.budget,
        "plan": job.plan.model_dump(),
        "proposal_id": proposal.id if proposal else None,
        "proposal_plan": proposal.plan.model_dump() if proposal else None,
        "proposal_gain": proposal.expected_gain if proposal else None,
        "proposal_rule": proposal.rule if proposal else None,
        "remaining_samples": job.remaining_samples,
        "samples_per_second": job.samples_per_second,
        "ttl_s": job.ttl_s,
        "updated_at": job.updated_at,
        "weight": job.weight,
        "waiting": job.waiting,
        "min_plan": job.min_plan.model_dump() if job.min_plan else None,
        "waiting_since": job.waiting_since,
        "data_workers_cpu": job.data_workers[0],
        "data_workers_memory_mb": job.data_workers[1],
    }
    where = running_jobs.c.job_id == job.job_id
    if conn.execute(select(running_jobs.c.job_id).where(where)).first():
        conn.execute(update(running_jobs).where(where).values(**row))
    else:
        conn.execute(insert(running_jobs).values(job_id=job.job_id, **row))


def _actions(decision: Decision, job_id: str) -> list[tuple[str, str, Any, str]]:
    """(job, action, plan, reason) for what ``decision`` says of ``job_id`` and the shrinks
    it orders (other jobs' own triggers record the rest)."""
    out: list[tuple[str, str, Any, str]] = []
    verdict = decision.verdicts.get(job_id)
    if verdict is not None:
        action = "grow" if verdict.allowed else "hold"
        plan = verdict.plan.model_dump() if verdict.plan is not None else None
        out.append((job_id, action, plan, verdict.reason))
    admission = decision.admissions.get(job_id)
    if admission is not None:
        plan = admission.plan.model_dump() if admission.plan is not None else None
        out.append((job_id, "admit" if admission.admitted else "wait", plan, admission.reason))
    for shrink in decision.shrinks.values():
        out.append((shrink.job_id, "shrink", shrink.plan.model_dump(), shrink.reason))
    return out


def _record(conn: Connection, decision: Decision, job_id: str, now: float) -> None:
    """Insert the decisions that differ (action or plan) from each job's last one."""
    entries = _actions(decision, job_id)
    if not entries:
        return
    jobs = sorted({entry[0] for entry in entries})
    newest = (
        select(func.max(budget_decisions.c.id))
        .where(budget_decisions.c.budget == decision.budget)
        .where(budget_decisions.c.job_id.in_(jobs))
        .group_by(budget_decisions.c.job_id)
    )
    last = {
        r["job_id"]: (r["action"], r["plan"])
        for r in conn.execute(
            select(budget_decisions).where(budget_decisions.c.id.in_(newest))
        ).mappings()
    }
    for job, action, plan, reason in entries:
        if last.get(job) == (action, plan):
            continue
        conn.execute(
            insert(budget_decisions).values(
                budget=decision.budget, at=now, job_id=job, action=action, plan=plan, reason=reason
            )
        )
        last[job] = (action, plan)


def _purge(conn: Connection, now: float) -> int:
    stale = running_jobs.c.updated_at + running_jobs.c.ttl_s < now
    return int(conn.execute(delete(running_jobs).where(stale)).rowcount)


def _rows(conn: Connection, budget: str | None, fresh_at: float | None) -> list[RunningJob]:
    query = select(running_jobs).order_by(running_jobs.c.job_id)
    if budget is not None:
        query = query.where(running_jobs.c.budget == budget)
    if fresh_at is not None:
        query = query.where(running_jobs.c.updated_at + running_jobs.c.ttl_s >= fresh_at)
    return [_job(r) for r in conn.execute(query).mappings()]


def _job(row: Any) -> RunningJob:
    proposal = None
    if row["proposal_id"] is not None and row["proposal_plan"] is not None:
        proposal = PlanRecord(
            id=int(row["proposal_id"]),
            plan=ResourcePlan.model_validate(row["proposal_plan"]),
            expected_gain=row["proposal_gain"],
            rule=row["proposal_rule"],
        )
    return RunningJob(
        job_id=row["job_id"],
        budget=row["budget"],
        plan=ResourcePlan.model_validate(row["plan"]),
        remaining_samples=float(row["remaining_samples"]),
        samples_per_second=float(row["samples_per_second"]),
        updated_at=float(row["updated_at"]),
        ttl_s=float(row["ttl_s"] if row["ttl_s"] is not None else DEFAULT_TTL_S),
        proposal=proposal,
        weight=float(row["weight"]) if row["weight"] is not None else 1.0,
        waiting=bool(row["waiting"]),
        min_plan=ResourcePlan.model_validate(row["min_plan"]) if row["min_plan"] else None,
        waiting_since=row["waiting_since"],
        data_workers=(
            float(row["data_workers_cpu"] or 0.0),
            float(row["data_workers_memory_mb"] or 0.0),
        ),
    )
