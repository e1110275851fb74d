"""What the master says of the job: its status (``GET /status``), mirrored to ``state.json`` so
the outcome stays readable after the master has exited, and the job's throughput."""

from __future__ import annotations

import collections
import os
import time
from typing import Any, Protocol

from airflow_rover.core.job_dir import JobDir, atomic_write_json
from airflow_rover.core.policies import LostUpdates
from airflow_rover.core.states import JobState
from airflow_rover.master.autoscaler import Autoscaler, Profiler
from airflow_rover.master.checkpointing import Checkpoints
from airflow_rover.master.data_workers import DataWorkerRoom
from airflow_rover.master.job_core import JobCore
from airflow_rover.master.nodes import NodeInfo
from airflow_rover.master.recovery import NodeRecovery
from airflow_rover.master.throughput_history import ThroughputHistory
from airflow_rover.master.wrap_up import WrapUp
from airflow_rover.rpc import master_api

THROUGHPUT_WINDOW_S = 10.0
TRAINING = frozenset({JobState.RUNNING, JobState.RECOVERING})  # a rate is reported only then
STATE_MIRROR_INTERVAL_S = 2.0


class Throughput:
    """Samples/s the workers trained over the last ``THROUGHPUT_WINDOW_S``.

    Only what a worker process trained after its first progress report to this master counts:
    that first count may hold samples trained before it (a relaunched master hears from
    workers that trained on; any node's first report covers its start-up), which would read
    as trained in the instant between two workers' first reports. A relaunched worker is a
    new ``NodeInfo``: its first report is its own starting line.
    """

    def __init__(self) -> None:
        self._log: collections.deque[tuple[float, int]] = collections.deque()
        self.trained = 0  # samples trained since each worker process's first report

    def report(self, node: NodeInfo, samples: int, now: float | None = None) -> None:
        """Count a worker's progress report (before ``node.samples`` takes ``samples``)."""
        if node.reported:
            self.trained += max(0, samples - node.samples)
        node.reported = True
        self.record(now)

    def record(self, now: float | None = None) -> None:
        """A point of the window; the newest point at or before its start stays as its anchor,
        so counts reported after a gap are spread over the time they took."""
        now = time.time() if now is None else now
        self._log.append((now, self.trained))
        while len(self._log) > 1 and self._log[1][0] <= now - THROUGHPUT_WINDOW_S:
            self._log.popleft()

    def rate(self) -> float:
        if len(self._log) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self._log[0], self._log[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0


class StateMirror:
    """Writes the status to ``state.json`` (atomically) on every phase change and now and
    then, as long as no newer master (a relaunch) took the job directory over."""

    def __init__(self, job_dir: JobDir) -> None:
        self.job_dir = job_dir
        self._last = 0.0

    def owns_job_dir(self) -> bool:
        """False once another master (a relaunch) has announced itself in this job dir."""
        announced = self.job_dir.master_info()
        return not announced or announced.get("pid") == os.getpid()

    def due(self, force: bool = False) -> bool:
        """Whether to write the status now (it is built only then)."""
        due = force or time.time() - self._last >= STATE_MIRROR_INTERVAL_S
        return due and self.owns_job_dir()

    def write(self, status: dict[str, Any]) -> None:
        atomic_write_json(self.job_dir.state_file, status)
        self._last = time.time()


class ReportingJob(JobCore, Protocol):
    """What the status reads of the job beyond its core."""

    throughput: Throughput
    throughput_history: ThroughputHistory
    wrap_up: WrapUp
    started_at: float
    finished_at: float | None
    autoscaler: Autoscaler
    profiler: Profiler
    recovery: NodeRecovery
    checkpointing: Checkpoints
    resumed_from: str | None
    started_from: str
    initial_rows: dict[str, master_api.InitialRows]
    samples_resumed: int
    lost: LostUpdates
    data_workers: DataWorkerRoom

    @property
    def pls(self) -> float: ...


def job_status(job: ReportingJob) -> dict[str, Any]:
    """The job's status: its state, progress, nodes, plans, profile and result."""
    done, total = job.queue.done_samples, job.queue.total_samples
    return {
        "job_id": job.spec.job_id,
        "state": str(job.state),
        "message": job.message,
        "progress": {
            "samples_done": done,
            "samples_resumed": job.samples_resumed,  # done before this master, in a checkpoint
            "samples_total": total,
            "fraction": round(done / total, 6),
            "shards": job.queue.counts(),
        },
        "throughput": round(job.throughput.rate(), 1) if job.state in TRAINING else 0.0,
        "throughput_history": job.throughput_history.to_json(),  # since this master started
        "plan": job.spec.plan.model_dump(),
        "nodes": job.nodes.to_dicts(),
        "evaluation": job.wrap_up.evaluation,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "duration_s": round((job.finished_at or time.time()) - job.started_at, 3),
        "recovery": recovery_summary(job),
        "plans": [p.to_json() for p in job.autoscaler.plans],
        "plan_approval": job.spec.autoscale.plan_approval,  # proposals wait for a person
        # on/off, bounds, weight in a shared budget; started warm (from which jobs) or cold
        "autoscale": {**job.autoscaler.settings(), **job.autoscaler.prior.describe()},
        "profile": job.autoscaler.report(job.profiler),
        "result": job.wrap_up.result,
        # set when the job failed in a way no retry can fix (``master.crash_watch``)
        "failure": job.recovery.crashes.failure,
        **({"data_workers": job.data_workers.status()} if job.data_workers.enabled else {}),
    }


def recovery_summary(job: ReportingJob) -> dict[str, Any]:
    """What the job recovered from, how its checkpoints went, what it lost."""
    return {
        **job.recovery.summary(),
        "resumed_from": job.resumed_from,
        "started_from": job.started_from,
        "initial_rows": initial_rows(job.initial_rows),
        "quarantined": job.queue.quarantined_shards(),
        **job.checkpointing.report(),
        "lost_batches": job.lost.batches,
        "lost_samples": job.lost.samples,
        "pls": round(job.pls, 6),
    }


def initial_rows(by_ps: dict[str, master_api.InitialRows]) -> dict[str, int] | None:
    """The rows the PS took of ``init_from`` and those they left out as not seen within
    ``evict_after_days``, all PS together (None: the job did not start from a model)."""
    if not by_ps:
        return None
    rows = by_ps.values()
    return {"loaded": sum(r.loaded for r in rows), "evicted": sum(r.evicted for r in rows)}
