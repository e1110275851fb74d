"""The job history store (the paper's "config DB"): every ended job, its plans and its profile.

SQLAlchemy Core on any SQLAlchemy URL (SQLite by default, see ``hooks.history_store``; a bare
``postgresql://`` uses psycopg2, see ``engine_url``). The schema
is created on first use (``CREATE TABLE IF NOT EXISTS``; safe to repeat and to race). Tables:

- ``rover_jobs``: one row per job id: dag/task/run/try, model, feature config (tables and a
  signature), dataset size, training settings, initial and final plan, metrics, outcome, and
  what its autoscaler measured (scaling costs, hot share; NULL where it did not). A store made
  before a column existed gets it on first use.
- ``rover_job_plans``: the job's plan history: the initial plan, then every proposal
  (``at``, ``plan``, ``rule``, ``reason``, ``state``, ``applied``).
- ``rover_job_throughput``: throughput samples (``at``, ``plan``, samples/s, step time).
- ``rover_job_nodes``: per node: role, steps, samples, step time, restarts, peak memory (MB),
  CPU used.
- ``rover_job_data_workers``: a job with data workers: their mode, bounds, counts and the last
  window's figures; ``rover_job_data_worker_decisions``: their scaling decisions (``at``,
  ``previous``, ``count``, ``rule``, ``reason``). A store made before them gets them on first
  use; its older jobs have none.

``record_job`` is an upsert keyed by job id: a retry, or ``execute_complete`` run again, rewrites
the job's rows instead of adding a second record. Nothing secret is stored (``records.scrub``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import ValidationError
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import IntegrityError

from airflow_rover.core.autoscale_prior import cost_medians, job_shape, prior_from
from airflow_rover.core.policies import FailureHistory
from airflow_rover.core.prior_config import COSTS, AutoscalePrior
from airflow_rover.core.spec import ResourcePlan
from airflow_rover.core.throughput import BusyShare, JobShape
from airflow_rover.core.warm_start import (
    DEFAULT_K,
    DEFAULT_MIN_SIMILARITY,
    DEFAULT_MU,
    JobTraits,
    Match,
    PastJob,
    Refinement,
    WarmStart,
    refine,
    top_k_similar,
    warm_start,
)
from airflow_rover.history.records import MEASURED, JobRecord
from airflow_rover.history.schema import add_missing_columns, create_tables

log = logging.getLogger(__name__)

MAX_CANDIDATES = 1000  # most recent successful jobs that warm start scores
# The PostgreSQL driver this project installs (psycopg2-binary, as Airflow's postgres extra).
POSTGRES_DRIVER = "postgresql+psycopg2"
metadata = MetaData()

jobs = Table(
    "rover_jobs",
    metadata,
    Column("job_id", String(200), primary_key=True),
    Column("dag_id", String(250)),
    Column("task_id", String(250)),
    Column("run_id", String(250)),
    Column("map_index", Integer, nullable=False, default=-1),
    Column("try_number", Integer),
    Column("model", String(500), nullable=False),
    Column("feature_signature", String(32)),
    Column("features", JSON),  # the FeatureConfig, as a dict
    Column("tables", JSON),  # [[name, dim, vocab_size], ...], sorted: what similarity reads
    Column("num_dense", Integer),
    Column("embedding_params", BigInteger),
    Column("dataset_samples", BigInteger),  # training samples per epoch
    Column("train_data", Text),
    Column("training", JSON),
    Column("outcome", String(20), nullable=False),  # succeeded | failed | stopped
    Column("message", Text),
    Column("initial_plan", JSON, nullable=False),
    Column("final_plan", JSON, nullable=False),
    Column("samples_trained", BigInteger),
    Column("samples_per_second", Float),
    Column("train_seconds", Float),
    Column("duration_s", Float),
    Column("auc", Float),
    Column("logloss", Float),
    Column("result", JSON),
    # what the job's autoscaler measured itself (NULL: it did not): a similar job's prior
    Column("worker_start_s", Float),
    Column("ps_start_s", Float),
    Column("ps_reload_s", Float),
    Column("hot_share", Float),
    Column("started_at", Float),  # seconds since the epoch, like the master's status
    Column("finished_at", Float),
    Column("recorded_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Index("ix_rover_jobs_model", "model"),
    Index("ix_rover_jobs_dag_task", "dag_id", "task_id"),
    Index("ix_rover_jobs_outcome_finished", "outcome", "finished_at"),
)

plans = Table(
    "rover_job_plans",
    metadata,
    Column("job_id", String(200), ForeignKey("rover_jobs.job_id"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("at", Float),
    Column("plan", JSON, nullable=False),
    Column("rule", String(50)),
    Column("reason", Text),
    Column("state", String(20)),  # initial | proposed | declined | applied
    Column("applied", Boolean, nullable=False),
)

throughput = Table(
    "rover_job_throughput",
    metadata,
    Column("job_id", String(200), ForeignKey("rover_jobs.job_id"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("at", Float),
    Column("plan", JSON),
    Column("samples_per_second", Float),
    Column("step_time_ms", Float),
    Column("worker_busy", Float),  # the share of an iteration a worker's cores were busy
    Column("ps_busy", Float),  # the busiest PS's, per core
)

nodes = Table(
    "rover_job_nodes",
    metadata,
    Column("job_id", String(200), ForeignKey("rover_jobs.job_id"), primary_key=True),
    Column("node_id", String(100), primary_key=True),
    Column("role", String(30)),
    Column("steps", BigInteger),
    Column("samples", BigInteger),
    Column("step_time_ms", Float),
    Column("restarts", Integer),
    Column("exit_code", Integer),
    Column("peak_memory_mb", Float),
    Column("cpu_used", Float),  # cores, as last sampled
)

data_workers = Table(
    "rover_job_data_workers",
    metadata,
    Column("job_id", String(200), ForeignKey("rover_jobs.job_id"), primary_key=True),
    Column("mode", String(10)),  # fixed | auto
    Column("target", Integer),
    Column("running", Integer),
    Column("min", Integer),
    Column("max", Integer),
    Column("input_wait", Float),  # the last window's, as fractions and samples/s
    Column("ready_fill", Float),
    Column("samples_per_s", Float),
)

data_worker_decisions = Table(
    "rover_job_data_worker_decisions",
    metadata,
    Column("job_id", String(200), ForeignKey("rover_jobs.job_id"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("at", Float),
    Column("previous", Integer),
    Column("count", Integer),
    Column("rule", String(50)),
    Column("reason", Text),
)

CHILD_TABLES = (plans, throughput, nodes, data_workers, data_worker_decisions)


def safe_url(url: str | URL) -> str:
    """The URL as text with its password hidden: the only form that may be logged."""
    return make_url(url).render_as_string(hide_password=True)


def engine_url(url: str | URL) -> URL:
    """``url`` as the engine opens it: a PostgreSQL URL that names no driver (``postgresql://``,
    ``postgres://``) gets psycopg2, the driver installed with this project; SQLAlchemy 2.1's
    own default for it is psycopg 3, which is not. A URL naming its driver is kept."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        return parsed.set(drivername=POSTGRES_DRIVER)
    return parsed


class HistoryStore:
    """Read and write the job history at ``url`` (any SQLAlchemy URL)."""

    def __init__(self, url: str | URL) -> None:
        self.url = engine_url(url)
        connect_args: dict[str, Any] = {}
        if self.url.get_backend_name() == "sqlite":
            connect_args["timeout"] = 30  # concurrent writers wait for the file lock
            database = self.url.database
            if database and database != ":memory:" and not database.startswith("file:"):
                Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        self.engine: Engine = create_engine(self.url, connect_args=connect_args)
        self._schema_ready = False

    def __repr__(self) -> str:
        return f"HistoryStore({safe_url(self.url)!r})"

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.engine.dispose()

    # -- schema ------------------------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Create the tables that do not exist yet (idempotent; a concurrent creator wins)."""
        if self._schema_ready:
            return
        create_tables(self.engine, metadata)
        add_missing_columns(self.engine, jobs)
        add_missing_columns(self.engine, throughput)
        self._schema_ready = True

    # -- writing -----------------------------------------------------------------------------
    def record_job(self, record: JobRecord) -> None:
        """Insert or replace the record of ``record.job_id`` (with its plans, throughput samples
        and nodes) in one transaction."""
        self.ensure_schema()
        try:
            with self.engine.begin() as conn:
                self._upsert(conn, record)
        except IntegrityError:  # a concurrent first insert of the same job: now it exists
            with self.engine.begin() as conn:
                self._upsert(conn, record)

    def _upsert(self, conn: Connection, record: JobRecord) -> None:
        now = time.time()
        row = _job_row(record, now)
        exists = conn.execute(select(jobs.c.job_id).where(jobs.c.job_id == record.job_id)).first()
        for table in CHILD_TABLES:
            conn.execute(delete(table).where(table.c.job_id == record.job_id))
        if exists:
            conn.execute(update(jobs).where(jobs.c.job_id == record.job_id).values(**row))
        else:
            conn.execute(insert(jobs).values(job_id=record.job_id, recorded_at=now, **row))
        if record.plans:
            conn.execute(
                insert(plans),
                [{"job_id": record.job_id, "seq": i, **p} for i, p in enumerate(record.plans)],
            )
        if record.throughput:
            conn.execute(
                insert(throughput),
                [{"job_id": record.job_id, "seq": i, **s} for i, s in enumerate(record.throughput)],
            )
        if record.data_workers is not None:
            conn.execute(insert(data_workers).values(job_id=record.job_id, **record.data_workers))
        if record.data_worker_decisions:
            conn.execute(
                insert(data_worker_decisions),
                [
                    {"job_id": record.job_id, "seq": i, **d}
                    for i, d in enumerate(record.data_worker_decisions)
                ],
            )
        if record.nodes:
            columns = set(nodes.c.keys())
            conn.execute(
                insert(nodes),
                [
                    {
                        "job_id": record.job_id,
                        **{k: n.get(k) for k in columns if k != "job_id"},
                    }
                    for n in record.nodes
                ],
            )

    # -- reading -----------------------------------------------------------------------------
    def get_job(self, job_id: str) -> dict[str, Any] | None:
        """The job's row with ``plans``, ``throughput`` and ``nodes`` lists and its
        ``data_workers`` section as the status had it (None without data workers); None if
        unknown."""
        self.ensure_schema()
        with self.engine.connect() as conn:
            row = conn.execute(select(jobs).where(jobs.c.job_id == job_id)).mappings().first()
            if row is None:
                return None
            job = dict(row)
            for name, table in (("plans", plans), ("throughput", throughput)):
                rows = conn.execute(
                    select(table).where(table.c.job_id == job_id).order_by(table.c.seq)
                ).mappings()
                job[name] = [_without(r, "job_id", "seq") for r in rows]
            rows = conn.execute(
                select(nodes).where(nodes.c.job_id == job_id).order_by(nodes.c.node_id)
            ).mappings()
            job["nodes"] = [_without(r, "job_id") for r in rows]
            job["data_workers"] = _data_workers(conn, job_id)
        return job

    def list_jobs(
        self,
        dag_id: str | None = None,
        task_id: str | None = None,
        outcome: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """Job rows, most recently finished first, optionally of one DAG / task / outcome."""
        self.ensure_schema()
        query = select(jobs)
        if dag_id is not None:
            query = query.where(jobs.c.dag_id == dag_id)
        if task_id is not None:
            query = query.where(jobs.c.task_id == task_id)
        if outcome is not None:
            query = query.where(jobs.c.outcome == outcome)
        query = query.order_by(jobs.c.finished_at.desc(), jobs.c.job_id).limit(limit)
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def last_success(
        self, dag_id: str, task_id: str, map_index: int = -1, other_than_run: str | None = None
    ) -> dict[str, Any] | None:
        """The most recently finished successful job of the task (``map_index``), leaving out
        run ``other_than_run`` (the run asking): where ``init_from="previous"`` starts."""
        self.ensure_schema()
        query = select(jobs).where(
            jobs.c.dag_id == dag_id,
            jobs.c.task_id == task_id,
            jobs.c.map_index == map_index,
            jobs.c.outcome == "succeeded",
        )
        if other_than_run is not None:
            query = query.where(jobs.c.run_id != other_than_run)
        query = query.order_by(jobs.c.finished_at.desc(), jobs.c.job_id).limit(1)
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        return None if row is None else dict(row)

    def failure_history(self, dag_id: str, task_id: str, limit: int = 20) -> list[FailureHistory]:
        """How long the task's last ``limit`` runs trained, on how many PS, and how many PS
        failures each had: what ``mtbf_from_history`` turns into the failure rate the
        checkpoint policy plans with."""
        self.ensure_schema()
        query = (
            select(jobs.c.job_id, jobs.c.train_seconds, jobs.c.final_plan)
            .where(jobs.c.dag_id == dag_id, jobs.c.task_id == task_id)
            .where(jobs.c.train_seconds.is_not(None))
            .order_by(jobs.c.finished_at.desc(), jobs.c.job_id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            runs = conn.execute(query).mappings().all()
            ids = [r["job_id"] for r in runs]
            restarts = conn.execute(
                select(nodes.c.job_id, nodes.c.restarts).where(
                    nodes.c.job_id.in_(ids), nodes.c.role == "ps"
                )
            ).all()
        failures: dict[str, int] = {}
        for job_id, count in restarts:
            failures[job_id] = failures.get(job_id, 0) + int(count or 0)
        return [
            FailureHistory(
                seconds=float(r["train_seconds"]),
                num_ps=int((r["final_plan"] or {}).get("num_ps", 1)),
                ps_failures=failures.get(r["job_id"], 0),
            )
            for r in runs
            if r["train_seconds"] > 0
        ]

    def candidates(self, limit: int = MAX_CANDIDATES) -> list[PastJob]:
        """The most recent successful jobs, as warm start compares them."""
        self.ensure_schema()
        query = (
            select(
                jobs.c.job_id,
                jobs.c.model,
                jobs.c.tables,
                jobs.c.num_dense,
                jobs.c.dataset_samples,
                jobs.c.dag_id,
                jobs.c.task_id,
                jobs.c.final_plan,
                jobs.c.finished_at,
            )
            .where(jobs.c.outcome == "succeeded")
            .order_by(jobs.c.finished_at.desc(), jobs.c.job_id)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [
            PastJob(
                job_id=r["job_id"],
                traits=JobTraits(
                    model=r["model"],
                    tables=tuple((str(n), int(d), int(v)) for n, d, v in r["tables"] or ()),
                    num_dense=r["num_dense"],
                    dataset_samples=r["dataset_samples"],
                    dag_id=r["dag_id"],
                    task_id=r["task_id"],
                ),
                plan=r["final_plan"] or {},
                finished_at=r["finished_at"] or 0.0,
            )
            for r in rows
        ]

    def similar_jobs(
        self,
        traits: JobTraits,
        k: int = DEFAULT_K,
        min_similarity: float = DEFAULT_MIN_SIMILARITY,
        max_candidates: int = MAX_CANDIDATES,
    ) -> list[Match]:
        """The top ``k`` successful jobs most similar to ``traits`` (``core.warm_start``)."""
        return top_k_similar(traits, self.candidates(max_candidates), k, min_similarity)

    def warm_start(
        self,
        traits: JobTraits,
        cold_start: ResourcePlan | None = None,
        k: int = DEFAULT_K,
        mu: float = DEFAULT_MU,
        min_similarity: float = DEFAULT_MIN_SIMILARITY,
        max_candidates: int = MAX_CANDIDATES,
        refinement: Refinement | None = None,
        shape: JobShape | None = None,
    ) -> WarmStart:
        """Algorithm 1 over this history: the smoothed plan, or ``cold_start`` without history;
        with ``refinement``, moved by the model the matched jobs' throughput samples fit
        (``core.warm_start.refine``). The autoscaler's prior comes from the matched jobs: their
        samples fitted for ``shape`` (default the refinement's; neither: no coefficients),
        hot shares and measured scaling costs."""
        past = self.candidates(max_candidates) if k > 0 else []
        decision = warm_start(traits, past, cold_start, k, mu, min_similarity)
        if decision.source != "history":
            return decision
        ids = [m.job.job_id for m in decision.matches]
        samples, busy = self.samples(ids)
        shape = shape or (refinement.shape if refinement is not None else None)
        decision = replace(decision, prior=self.prior(ids, samples, shape, busy))
        if refinement is None:
            return decision
        return refine(decision, samples, refinement, busy=busy)

    def prior(
        self,
        job_ids: list[str],
        samples: list[tuple[ResourcePlan, float]],
        shape: JobShape | None,
        busy: Sequence[BusyShare] = (),
    ) -> AutoscalePrior | None:
        """The autoscaler's prior from these jobs' ``samples`` (fitted for ``shape``; None:
        not fitted) and what they measured; None when they left nothing to start from."""
        hot_shares: list[float] = []
        costs: list[dict[str, float | None]] = []
        with self.engine.connect() as conn:
            columns = [jobs.c[name] for name in MEASURED]
            rows = conn.execute(select(*columns).where(jobs.c.job_id.in_(job_ids))).mappings()
            for row in rows:
                if row["hot_share"] is not None:
                    hot_shares.append(float(row["hot_share"]))
                costs.append({name: row[name] for name in COSTS})
        if shape is None:  # no job shape to fit the samples for: hot share and costs only
            shape, samples, busy = job_shape(1, 1), [], ()
        prior = prior_from(shape, samples, hot_shares, costs, job_ids, busy)
        if prior.coefficients is None and not hot_shares and prior.costs is None:
            return None
        measured = cost_medians(costs)  # a cost none of them timed stays out: the default
        values = prior.to_config().model_dump()
        return AutoscalePrior(**{**values, **{name: measured.get(name) for name in COSTS}})

    def observations(self, job_ids: list[str]) -> list[tuple[ResourcePlan, float]]:
        """(plan, seconds per worker iteration) of every throughput sample of these jobs."""
        return self.samples(job_ids)[0]

    def busy_shares(self, job_ids: list[str]) -> list[BusyShare]:
        """What the nodes kept busy at each throughput sample of these jobs that says
        (samples recorded before busy shares were kept have none)."""
        return self.samples(job_ids)[1]

    def samples(
        self, job_ids: list[str]
    ) -> tuple[list[tuple[ResourcePlan, float]], list[BusyShare]]:
        """``observations`` and ``busy_shares`` of these jobs, from one read of their samples."""
        t = throughput.c
        query = select(t.plan, t.step_time_ms, t.worker_busy, t.ps_busy).where(
            t.job_id.in_(job_ids)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        times: list[tuple[ResourcePlan, float]] = []
        busy: list[BusyShare] = []
        for plan, step_ms, worker, ps in rows:
            if not (step_ms and step_ms > 0):
                continue
            try:
                seen = ResourcePlan.model_validate(plan)
            except ValidationError:  # a plan recorded by another version: not comparable
                continue
            seconds = float(step_ms) / 1000.0
            times.append((seen, seconds))
            if worker is not None and ps is not None:
                busy.append(BusyShare(seen, seconds, float(worker), float(ps)))
        return times, busy


def _job_row(record: JobRecord, now: float) -> dict[str, Any]:
    """The ``rover_jobs`` row of ``record`` but ``job_id`` and ``recorded_at`` (set on insert)."""
    traits = record.traits
    return {
        "dag_id": record.dag_id,
        "task_id": record.task_id,
        "run_id": record.run_id,
        "map_index": record.map_index,
        "try_number": record.try_number,
        "model": record.model,
        "feature_signature": traits.feature_signature,
        "features": record.features.model_dump(mode="json") if record.features else None,
        "tables": [list(t) for t in traits.tables] or None,
        "num_dense": traits.num_dense,
        "embedding_params": traits.embedding_params if traits.tables else None,
        "dataset_samples": record.dataset_samples,
        "train_data": record.train_data,
        "training": record.training,
        "outcome": record.outcome,
        "message": record.message,
        "initial_plan": record.initial_plan,
        "final_plan": record.final_plan,
        "samples_trained": record.samples_trained,
        "samples_per_second": record.samples_per_second,
        "train_seconds": record.train_seconds,
        "duration_s": record.duration_s,
        "auc": record.auc,
        "logloss": record.logloss,
        "result": record.result,
        **{name: record.measured.get(name) for name in MEASURED},
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "updated_at": now,
    }


def _without(row: Any, *keys: str) -> dict[str, Any]:
    return {k: v for k, v in dict(row).items() if k not in keys}


def _data_workers(conn: Connection, job_id: str) -> dict[str, Any] | None:
    """The job's ``data_workers`` section, decisions included; None if it had none."""
    row = conn.execute(select(data_workers).where(data_workers.c.job_id == job_id)).mappings()
    found = row.first()
    if found is None:
        return None
    decisions = conn.execute(
        select(data_worker_decisions)
        .where(data_worker_decisions.c.job_id == job_id)
        .order_by(data_worker_decisions.c.seq)
    ).mappings()
    return {
        **_without(found, "job_id"),
        "decisions": [_without(d, "job_id", "seq") for d in decisions],
    }
