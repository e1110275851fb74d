"""Which jobs were launched, by which task, and where their directories are: the index the UI
lists running jobs from (the history's ``rover_jobs`` holds a job only once it has ended).

Table ``rover_launched_jobs`` (created on first use, like the history's): one row per job id,
rewritten by every launch of that job (a retry that submits it again). The UI finds a job's
directory here, never from a request.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
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
    insert,
    select,
)
from sqlalchemy.exc import IntegrityError

from airflow_rover.history.store_tables import StoreTables

metadata = MetaData()  # apart from the history's: ``HistoryStore.ensure_schema`` is unchanged

launched_jobs = Table(
    "rover_launched_jobs",
    metadata,
    Column("job_id", String(200), primary_key=True),
    Column("dag_id", String(250), nullable=False),
    Column("task_id", String(250), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("map_index", Integer, nullable=False),
    Column("try_number", Integer),
    Column("job_dir", Text, nullable=False),
    Column("launcher", String(50), nullable=False),
    Column("model", String(500)),
    Column("checkpoint_policy", String(50)),
    Column("plan_approval", Boolean, nullable=False),
    Column("cluster_budget", JSON),  # the ClusterBudget the job shares, as a dict
    Column("launched_at", Float, nullable=False),
    Index("ix_rover_launched_jobs_dag", "dag_id", "launched_at"),
)


@dataclass(frozen=True)
class Launch:
    """One launch of a job by a task instance."""

    job_id: str
    dag_id: str
    task_id: str
    run_id: str
    job_dir: str
    launcher: str
    map_index: int = -1
    try_number: int | None = None
    model: str | None = None
    checkpoint_policy: str | None = None
    plan_approval: bool = False
    cluster_budget: dict[str, Any] | None = None
    launched_at: float = field(default_factory=time.time)


class LaunchIndex(StoreTables):
    """Read and write the launched-jobs index in ``store``'s database."""

    metadata = metadata

    def record(self, launch: Launch) -> None:
        """Insert or replace the row of ``launch.job_id``."""
        self.ensure_schema()
        row = asdict(launch)
        for _ in range(2):  # a concurrent first insert of the same job: replace it
            try:
                with self.engine.begin() as conn:
                    conn.execute(
                        delete(launched_jobs).where(launched_jobs.c.job_id == launch.job_id)
                    )
                    conn.execute(insert(launched_jobs).values(**row))
                return
            except IntegrityError:
                continue

    def get(self, job_id: str) -> Launch | None:
        self.ensure_schema()
        with self.engine.connect() as conn:
            row = conn.execute(
                select(launched_jobs).where(launched_jobs.c.job_id == job_id)
            ).mappings()
            first = row.first()
        return None if first is None else Launch(**first)

    def list(
        self, dag_ids: set[str] | None = None, dag_id: str | None = None, limit: int = 200
    ) -> list[Launch]:
        """The latest launches first, of the DAGs in ``dag_ids`` (None: any) and ``dag_id``."""
        self.ensure_schema()
        query = select(launched_jobs)
        if dag_ids is not None:
            query = query.where(launched_jobs.c.dag_id.in_(sorted(dag_ids)))
        if dag_id is not None:
            query = query.where(launched_jobs.c.dag_id == dag_id)
        query = query.order_by(launched_jobs.c.launched_at.desc()).limit(limit)
        with self.engine.connect() as conn:
            return [Launch(**row) for row in conn.execute(query).mappings()]
