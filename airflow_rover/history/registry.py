"""The registry of running jobs that share a cluster budget, in the history store's database.

Tables (created on first use, like the history's: ``CREATE TABLE IF NOT EXISTS``):

- ``rover_running_jobs``: one row per running job that names a budget: the budget, the plan
  it holds, its pending proposal (id, plan, expected gain when the master gives one, rule), its
  remaining samples and samples/s, ``updated_at`` and ``ttl_s``. The job's trigger upserts the
  row on every poll and deletes it when the job ends; a row older than its ``ttl_s`` is ignored
  (and purged), so a triggerer that died never holds the budget.
- ``rover_budget_locks``: one row per budget, updated first in every decision's transaction.
  That UPDATE takes the row's lock (PostgreSQL, MySQL) or the database's write lock (SQLite),
  so two triggers never decide on one budget at once.

``decide`` registers a job, reads the budget's fresh rows, asks the pure arbiter
(``core.cluster_budget.arbitrate``) and, when the job's proposal is selected, records the
proposed plan as the job's plan before the transaction ends: the next decision, by any
trigger, already counts it. The trigger then applies the plan; the next poll's upsert writes
whatever plan the master really runs (a declined plan gives its reservation back).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

from sqlalchemy import (
    JSON,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    delete,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from airflow_rover.core.cluster_budget import (
    DEFAULT_TTL_S,
    Decision,
    RunningJob,
    arbitrate,
)
from airflow_rover.core.plans import PlanRecord
from airflow_rover.core.spec import ClusterBudget, ResourcePlan
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
    Index("ix_rover_running_jobs_budget", "budget"),
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
        _add_missing_columns(self.engine)

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
        """Register ``job`` and decide on the budget's pending proposals, holding the budget's
        lock; if ``job``'s proposal is selected its row holds the proposed plan from now on."""
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
                decision = arbitrate(_rows(conn, budget.name, now), budget, now)
                if decision.allowed(job.job_id):
                    _upsert(conn, job.reserved())
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
    }
    where = running_jobs.c.job_id == job.job_id
    if conn.execute(select(running_jobs.c.job_id).where(where)).first():
        conn.execute(update(running_jobs).where(where).values(**row))
    else:
        conn.execute(insert(running_jobs).values(job_id=job.job_id, **row))


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
    )


def _add_missing_columns(engine: Engine) -> None:
    """Add the columns a registry created by an older version lacks (its rows are
    short-lived, so a NULL in them is read as the default)."""
    present = {c["name"] for c in inspect(engine).get_columns(running_jobs.name)}
    for column in running_jobs.columns:
        if column.name not in present and column.nullable:
            kind = column.type.compile(dialect=engine.dialect)
            try:
                with engine.begin() as conn:
                    conn.execute(
                        text(f"ALTER TABLE {running_jobs.name} ADD COLUMN {column.name} {kind}")
                    )
            except DBAPIError:  # another process added it meanwhile
                if column.name not in {
                    c["name"] for c in inspect(engine).get_columns(running_jobs.name)
                }:
                    raise
