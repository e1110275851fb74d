"""Where a new master starts from: a fresh shard queue, or the one of the newest verified
checkpoint (a retry, a relaunched master), fetched from ``checkpoint_uri`` when the job
directory has none (a retry on another machine). The job's own checkpoint always wins over
the model it was told to continue (``init_from``): that model is loaded only into a job that
has no checkpoint yet, and its first checkpoint holds it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from airflow_rover.core.checkpoint_files import checkpoint_number
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.policies import LostUpdates
from airflow_rover.core.shards import ShardQueue
from airflow_rover.core.spec import JobSpec
from airflow_rover.data.reader import open_split
from airflow_rover.storage import CheckpointMirror, check_owner, restore_latest_checkpoint

LOST_UPDATES_KEY = "partial_recovery"  # in queue.json: the lost updates at the snapshot

log = logging.getLogger(__name__)


@dataclass
class StartingPoint:
    """The queue a master starts with and the checkpoint it comes from (None: a fresh job)."""

    queue: ShardQueue
    checkpoint: Path | None
    resumed_from: str | None  # the checkpoint whose queue it is
    lost: LostUpdates
    started_from: str = "scratch"  # what the PS load: "checkpoint ...", "init_from ...", "scratch"

    @property
    def checkpoint_number(self) -> int:
        return 0 if self.checkpoint is None else checkpoint_number(self.checkpoint.name) or 0


def starting_point(
    job_dir: JobDir, spec: JobSpec, mirror: CheckpointMirror | None
) -> StartingPoint:
    """The queue of the newest verified checkpoint (its shards all released to resume from
    the PS ledgers), else a fresh one. Updates partial recovery forgave before that checkpoint
    are lost in the model it holds (its ledgers count them as applied): they stay lost.
    A checkpoint of another job raises ``storage.ForeignCheckpoint``: a job resumes only its
    own (a directory or store shared by two runs would otherwise finish one with the
    other's model)."""
    fresh = fresh_queue(spec)
    checkpoint = job_dir.latest_checkpoint()
    if checkpoint is None and mirror is not None:  # e.g. a retry on another machine
        fetched = restore_latest_checkpoint(
            mirror.store, job_dir.checkpoints, spec.job_id, spec.fingerprint
        )
        if fetched is not None:
            job_dir.commit_checkpoint(fetched)
            checkpoint = job_dir.latest_checkpoint()
    if checkpoint is None or not (checkpoint / "queue.json").exists():
        return StartingPoint(fresh, checkpoint, None, LostUpdates(), fresh_start(spec))
    saved = job_dir.read_json(checkpoint / "queue.json") or {}
    check_owner(saved, spec.job_id, str(checkpoint), spec.fingerprint)
    queue = ShardQueue.from_dict(saved)
    queue.release_all()
    lost = LostUpdates.from_dict(saved.get(LOST_UPDATES_KEY))
    started = f"checkpoint {checkpoint}"
    if spec.init is not None:
        log.info("Resuming from the job's own %s, not from %s", started, spec.init.location)
    return StartingPoint(queue, checkpoint, str(checkpoint), lost, started)


def fresh_start(spec: JobSpec) -> str:
    """What a job without a checkpoint starts from (and the log line saying so)."""
    if spec.init is None:
        return "scratch"
    init = spec.init
    log.info("No checkpoint of this job yet: starting from %s (%s)", init.location, init.origin)
    return f"init_from {init.location} ({init.origin})"


def fresh_queue(spec: JobSpec) -> ShardQueue:
    t, r = spec.training, spec.recovery
    num_samples = open_split(spec, spec.train_data).num_samples
    return ShardQueue(num_samples, t.shard_size, t.epochs, t.batch_size, r.max_shard_failures)
