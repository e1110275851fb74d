"""Where the UI reads jobs from: the history store's launch index and ended records, the
running-jobs registry, and each running job's master through its hook (the job's token stays
here, on the server). A job's directory comes from its launch record, never from a request."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from airflow_rover.core.job_dir import JobDir
from airflow_rover.history.launches import Launch, LaunchIndex
from airflow_rover.history.registry import RunningJobRegistry
from airflow_rover.history.store import HistoryStore
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.hooks.history_store import HistoryStoreHook
from airflow_rover.plugins.job_views import (
    WAITING_FOR_BUDGET,
    JobPage,
    JobRow,
    job_page,
    job_row,
)

LOG_TAIL_BYTES = 8192
LOG_TAIL_LINES = 30
NODE_ID = re.compile(r"^[a-z]+(-[0-9]+)?$")  # ps-0, worker-3, evaluator, master


@cache
def _store(url: str) -> HistoryStore:
    """One store (and connection pool) per database for the api-server's lifetime."""
    return HistoryStore(url)


class JobSource:
    """Reads jobs for the UI from the history store at ``history_conn_id`` (default: the one
    the operator writes when it names none)."""

    def __init__(self, history_conn_id: str | None = None) -> None:
        self.history_conn_id = history_conn_id or None

    async def store(self) -> HistoryStore:
        url = await HistoryStoreHook(self.history_conn_id).async_get_url()
        return _store(url)

    async def rows(
        self, dag_ids: set[str] | None, dag_id: str | None = None, state: str | None = None
    ) -> list[JobRow]:
        """The jobs of the readable DAGs ``dag_ids`` (None: every DAG), newest first."""
        store = await self.store()
        rows = await asyncio.to_thread(_rows, store, dag_ids, dag_id)
        return [row for row in rows if state is None or row.state == state]

    async def launch(self, job_id: str) -> tuple[Launch | None, dict[str, Any] | None]:
        """The job's launch and ended record (None where there is none)."""
        store = await self.store()
        launch = await asyncio.to_thread(LaunchIndex(store).get, job_id)
        ended = await asyncio.to_thread(store.get_job, job_id)
        return launch, ended

    async def page(self, launch: Launch | None, ended: dict[str, Any] | None) -> JobPage:
        """The job page of the job ``launch`` and ``ended`` record: live from its master while
        it runs."""
        status: dict[str, Any] | None = None
        waiting = None
        if launch is not None and ended is None:
            waiting = await asyncio.to_thread(_waiting_reason, await self.store(), launch.job_id)
        if waiting is not None:
            status = {"state": WAITING_FOR_BUDGET, "message": waiting}
        elif launch is not None and Path(launch.job_dir).is_dir():
            status = await ElasticJobHook(launch.job_dir).async_get_status()
        held: dict[str, tuple[float, float]] = {}
        budget = launch.cluster_budget if launch else None
        if budget:
            store = await self.store()
            held = await asyncio.to_thread(_held, store, str(budget["name"]))
        logs = await asyncio.to_thread(log_tails, launch, status) if launch else {}
        return job_page(launch, ended, status, held, logs)

    def hook(self, launch: Launch) -> ElasticJobHook:
        return ElasticJobHook(launch.job_dir)


def _rows(store: HistoryStore, dag_ids: set[str] | None, dag_id: str | None) -> list[JobRow]:
    if dag_ids is not None and not dag_ids:
        return []
    launches = LaunchIndex(store).list(dag_ids, dag_id)
    ended = {job["job_id"]: job for job in store.list_jobs(dag_id=dag_id, limit=500)}
    waiting = {job.job_id for job in RunningJobRegistry(store).jobs() if job.waiting}
    rows = []
    for launch in launches:
        record = ended.pop(launch.job_id, None)
        job_dir = JobDir(Path(launch.job_dir))
        status = None if record else job_dir.read_json(job_dir.state_file)
        if record is None and launch.job_id in waiting:
            status = {"state": WAITING_FOR_BUDGET}
        rows.append(job_row(launch, record, status))
    for record in ended.values():  # jobs recorded before the index existed
        if dag_ids is None or record.get("dag_id") in dag_ids:
            rows.append(job_row(None, record, None))
    return sorted(rows, key=lambda r: r.started_at or 0.0, reverse=True)


def _waiting_reason(store: HistoryStore, job_id: str) -> str | None:
    """Why the job waits for its cluster budget (its last decision); None if it does not."""
    registry = RunningJobRegistry(store)
    if not any(job.job_id == job_id and job.waiting for job in registry.jobs()):
        return None
    decisions = registry.decisions(job_id=job_id)
    last = decisions[-1] if decisions else None
    return str(last["reason"]) if last and last["action"] == "wait" else "waiting for its budget"


def _held(store: HistoryStore, budget: str) -> dict[str, tuple[float, float]]:
    """(cores, MB) each of the budget's jobs holds, data workers included (a waiting job
    holds none)."""
    jobs = RunningJobRegistry(store).jobs(budget)
    return {job.job_id: job.needs(job.holds) for job in jobs if job.holds}


def log_tails(launch: Launch, status: Mapping[str, Any] | None) -> dict[str, str]:
    """The last lines of each node's log (and the master's): only the nodes the job's status
    names, in the job's ``logs/`` folder."""
    job_dir = JobDir(Path(launch.job_dir))
    names = ["master"] + [str(n.get("id")) for n in (status or {}).get("nodes") or ()]
    tails = {}
    for name in names:
        if not NODE_ID.match(name):
            continue
        path = job_dir.log_file(name)
        try:
            with path.open("rb") as f:
                f.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        tails[name] = "\n".join(text.splitlines()[-LOG_TAIL_LINES:])
    return tails
