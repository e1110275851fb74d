"""``CheckpointTrigger``: wait until a job has a durable checkpoint at or past a number of samples.

It carries a pointer to the checkpoints (a job directory, or a store URI and connection id), the
sample count and polling settings; its deadline is absolute, so a trigger re-created after a
triggerer restart waits exactly as the first one would have. Every ending is an event with the
keys ``status`` (success / failed / timeout / error), ``job_id``, ``message`` and ``checkpoint``
(``StoredCheckpoint.summary()`` on success, else None); unexpected errors become ``error``
events.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.states import TERMINAL_STATES
from airflow_rover.hooks.checkpoint_store import CheckpointStoreHook
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.storage.base import CheckpointStore
from airflow_rover.storage.checkpoints import latest_remote_checkpoint

# A job that ended may still be uploading its last checkpoint to a remote store: wait this
# long after its ``finished_at`` before calling the milestone missed.
UPLOAD_GRACE_S = 120.0


def checkpoint_store_uri(job_dir: str | None, checkpoint_uri: str | None) -> str:
    """Where the checkpoints are: ``checkpoint_uri``, else the job's own ``checkpoints/``."""
    if checkpoint_uri:
        return checkpoint_uri
    if job_dir:
        return str(JobDir(Path(job_dir)).checkpoints)
    raise ValueError("give job_dir (the job's own checkpoints) or checkpoint_uri")


def checkpoint_event(
    status: str,
    job: dict[str, Any] | None,
    message: str,
    checkpoint: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The fixed event shape shared by the trigger and the sensor's check-before-defer."""
    return {
        "status": status,
        "job_id": (job or {}).get("job_id"),
        "message": message,
        "checkpoint": checkpoint,
    }


def check_checkpoint(
    store: CheckpointStore,
    min_samples: int,
    job: dict[str, Any] | None,
    grace_s: float = 0.0,
    now: float | None = None,
) -> dict[str, Any] | None:
    """The one decision (blocking: run it in a thread from async code): a success event when
    a published checkpoint that verifies holds ``min_samples``; a failed event when the job
    (its status read *before* the store, so a checkpoint committed before it ended is seen)
    ended without one, ``grace_s`` after it finished; None to keep waiting."""
    found = latest_remote_checkpoint(store, min_samples)
    if found is not None:
        return checkpoint_event(
            "success",
            job,
            f"{found.name}: {found.samples} samples (>= {min_samples}) at {found.uri}",
            found.summary(),
        )
    if job is None or job.get("state") not in TERMINAL_STATES:
        return None
    finished = job.get("finished_at")
    now = time.time() if now is None else now
    if grace_s > 0 and isinstance(finished, int | float) and now < finished + grace_s:
        return None  # its last upload may still be on the way
    newest = latest_remote_checkpoint(store)
    have = f"newest {newest.name} with {newest.samples} samples" if newest else "no checkpoint"
    return checkpoint_event(
        "failed",
        job,
        f"job {job.get('job_id')} ended ({job.get('state')}: {job.get('message', '')}) without "
        f"a checkpoint at or past {min_samples} samples in {store.uri} ({have})",
    )


class CheckpointTrigger(BaseTrigger):
    """Poll the checkpoints of ``job_dir`` (or those at ``checkpoint_uri``, read with
    connection ``aws_conn_id``) every ``poll_interval`` seconds until one holds
    ``min_samples``; the job in ``job_dir`` ending first fails the wait; ``deadline`` (Unix
    time) times it out."""

    def __init__(
        self,
        min_samples: int,
        job_dir: str | None = None,
        checkpoint_uri: str | None = None,
        aws_conn_id: str | None = None,
        poll_interval: float = 30.0,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        self.min_samples = int(min_samples)
        self.job_dir = job_dir or None
        self.checkpoint_uri = checkpoint_uri or None
        self.aws_conn_id = aws_conn_id or None
        self.poll_interval = float(poll_interval)
        self.deadline = float(deadline) if deadline is not None else None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", {
            "min_samples": self.min_samples,
            "job_dir": self.job_dir,
            "checkpoint_uri": self.checkpoint_uri,
            "aws_conn_id": self.aws_conn_id,
            "poll_interval": self.poll_interval,
            "deadline": self.deadline,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        grace = UPLOAD_GRACE_S if self.checkpoint_uri else 0.0  # a job dir's commit is local
        try:
            uri = checkpoint_store_uri(self.job_dir, self.checkpoint_uri)
            store = await CheckpointStoreHook(self.aws_conn_id).async_get_store(uri)
            hook = ElasticJobHook(self.job_dir) if self.job_dir else None
            while True:
                job = await hook.async_get_status() if hook is not None else None
                event = await asyncio.to_thread(
                    check_checkpoint, store, self.min_samples, job, grace
                )
                if event is not None:
                    yield TriggerEvent(event)
                    return
                now = time.time()
                if self.deadline is not None and now >= self.deadline:
                    yield TriggerEvent(
                        checkpoint_event(
                            "timeout",
                            job,
                            f"no checkpoint at or past {self.min_samples} samples in "
                            f"{store.uri} before the sensor's timeout",
                        )
                    )
                    return
                self.log.info(
                    "No checkpoint at or past %d samples in %s yet (job %s)",
                    self.min_samples,
                    store.uri,
                    (job or {}).get("state", "not watched"),
                )
                wait = self.poll_interval
                if self.deadline is not None:
                    wait = max(0.0, min(wait, self.deadline - now))
                await asyncio.sleep(wait)
        except Exception as exc:  # report, never crash the triggerer
            where = self.checkpoint_uri or self.job_dir
            self.log.exception("Waiting for a checkpoint in %s failed", where)
            yield TriggerEvent(checkpoint_event("error", None, f"{type(exc).__name__}: {exc}"))
