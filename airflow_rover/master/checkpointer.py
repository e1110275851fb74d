"""Checkpoints of a running job: flash snapshots on the PS, committed once every part is durable.

Every ``interval_s`` while training the master asks each PS to copy its partition (rows,
optimizer state, dense weights, batch ledger) into shared memory; training waits only for that
copy. The PS persist their parts in the background; on later supervisor ticks the checkpointer
asks whether every part is durable and then writes ``queue.json`` (the shard queue as it was at
the snapshot, every part's checksum) and ``LATEST``. A part that fails, a PS relaunched without
its snapshot, or ``PERSIST_TIMEOUT_S`` without completion abandons the checkpoint: the previous
one stays the latest. The last two committed checkpoints are kept.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from airflow_rover.core.checkpoint_files import PartDigest, checkpoint_record
from airflow_rover.core.job_dir import JobDir, atomic_write_json, checkpoint_number
from airflow_rover.rpc.ps_client import PSClient

log = logging.getLogger(__name__)

PERSIST_TIMEOUT_S = 600.0  # a checkpoint not durable by then is given up
CHECKPOINT_POLL_S = 0.02


@dataclass(frozen=True)
class PendingCheckpoint:
    """A checkpoint whose snapshot is taken and whose parts are being persisted."""

    directory: Path
    number: int
    queue: dict[str, Any]  # the shard queue when the snapshot was taken
    started: float
    pause_s: float = 0.0  # the longest a PS held its pushes for the snapshot


@dataclass(frozen=True)
class CheckpointTimes:
    """What a committed checkpoint cost: the training pause, and how long until durable."""

    pause_s: float
    durable_s: float
    bytes: int


class Checkpointer:
    """Takes, tracks and commits one job's checkpoints (one in progress at a time)."""

    def __init__(
        self,
        job_dir: JobDir,
        interval_s: float,
        ps_client: Callable[[], PSClient],
        queue_state: Callable[[], dict[str, Any]],
        number: int = 0,
        on_commit: Callable[[Path, CheckpointTimes], None] | None = None,
    ) -> None:
        self.job_dir = job_dir
        self.interval_s = interval_s
        self._ps_client = ps_client
        self._queue_state = queue_state
        self.number = number  # the last committed checkpoint (0: none)
        self.pending: PendingCheckpoint | None = None
        self._last_started = time.time()
        self._on_commit = on_commit  # e.g. copy it to durable storage, re-plan the interval

    def tick(self) -> None:
        """On a supervisor tick: move a checkpoint in progress on, or start one when due. Never
        waits for a disk: a snapshot is a copy into the PS's shared memory."""
        if self.pending is not None:
            self._poll_checkpoint()
            return
        interval = self.interval_s
        if interval <= 0 or time.time() - self._last_started < interval:
            return
        self._start_checkpoint()

    def start_soon(self) -> None:
        """Make the next tick start a checkpoint (when checkpoints are on): after a PS resize,
        so that a restore rarely needs a checkpoint of the old job_dir."""
        self._last_started = -float("inf")

    def checkpoint(self) -> Path | None:
        """Take a checkpoint and wait until it is committed (the end of training; tools): every
        PS snapshots its partition (rows, optimizer state, dense weights, batch ledger) and
        persists it, then ``queue.json`` with every part's checksum commits it, then ``LATEST``
        names it. Returns its directory, or None if it failed (the previous one stands)."""
        while self.pending is not None:  # the periodic one in progress first
            if self._poll_checkpoint(patient=False) is None and self.pending:
                time.sleep(CHECKPOINT_POLL_S)
        if not self._start_checkpoint():
            return None
        while self.pending is not None:
            committed = self._poll_checkpoint(patient=False)
            if committed is not None:
                return committed
            time.sleep(CHECKPOINT_POLL_S)
        return None

    def _start_checkpoint(self) -> bool:
        """Snapshot every PS into its shared memory (training waits only for that copy) and
        keep the queue as it is now; the parts are persisted in the background."""
        self._last_started = time.time()
        dirs = self.job_dir.checkpoint_dirs()
        newest = checkpoint_number(dirs[-1].name) if dirs else None
        number = max(self.number, newest or 0) + 1  # never reuse an abandoned one's name
        directory = self.job_dir.checkpoint_dir(number)
        queue = self._queue_state()
        started = time.time()
        try:
            client = self._ps_client()
            try:
                snapshots = client.flash_save(directory, owner=os.getpid())
            finally:
                client.close()
        except Exception as exc:  # a PS going away: the previous checkpoint stands
            log.warning("checkpoint %s failed: %s", directory.name, _rpc_error(exc))
            return False
        pause = max((s.pause_s for s in snapshots), default=0.0)
        self.pending = PendingCheckpoint(directory, number, queue, started, pause)
        log.info(
            "checkpoint %s: snapshot taken (%.1f MB; pushes paused %s ms)",
            directory.name,
            sum(s.bytes for s in snapshots) / 1e6,
            "/".join(f"{s.pause_s * 1e3:.1f}" for s in snapshots),
        )
        return True

    def _poll_checkpoint(self, patient: bool = True) -> Path | None:
        """Commit the checkpoint in progress once every PS reports its part persisted; give it
        up if a part failed, its PS was relaunched without it, or it takes too long. A PS that
        does not answer is asked again on a later tick (``patient``: it may be recovering),
        or, when the caller waits for the commit, gives the checkpoint up at once."""
        pending = self.pending
        if pending is None:
            return None
        waited = time.time() - pending.started
        try:
            client = self._ps_client()
            try:
                parts = client.persist_status(pending.directory)
            finally:
                client.close()
        except Exception as exc:  # a PS away (recovering): ask again later
            if not patient or waited > PERSIST_TIMEOUT_S:
                self._abandon_checkpoint(f"no answer for {waited:.0f} s ({_rpc_error(exc)})")
            return None
        for i, part in enumerate(parts):
            if part.state == "failed":
                self._abandon_checkpoint(f"ps-{i} could not persist its part: {part.error}")
                return None
            if part.state == "unknown":
                self._abandon_checkpoint(f"ps-{i} no longer has its snapshot (relaunched)")
                return None
        if any(part.state != "done" for part in parts):
            if waited > PERSIST_TIMEOUT_S:
                self._abandon_checkpoint(f"not persisted after {waited:.0f} s")
            return None
        digests = {f"ps-{i}.npz": p.digest for i, p in enumerate(parts) if p.digest is not None}
        try:
            return self._commit_checkpoint(pending, digests)
        except OSError as exc:  # queue.json or LATEST not written: the previous one stands
            self._abandon_checkpoint(f"could not commit it: {exc}")
            return None

    def _commit_checkpoint(self, pending: PendingCheckpoint, parts: dict[str, PartDigest]) -> Path:
        """``queue.json`` (the queue at the snapshot, every part's checksum), then ``LATEST``;
        keep this one and the one before it."""
        directory = pending.directory
        atomic_write_json(directory / "queue.json", checkpoint_record(pending.queue, parts))
        self.job_dir.commit_checkpoint(directory)
        self.pending = None
        previous = self.number
        self.number = pending.number
        for old in self.job_dir.checkpoint_dirs():
            number = checkpoint_number(old.name) or 0
            if number < pending.number and number != previous:
                shutil.rmtree(old, ignore_errors=True)
        size = sum(p.bytes for p in parts.values())
        durable = time.time() - pending.started
        log.info(
            "checkpoint %s committed (%.1f MB, durable %.2f s after the snapshot)",
            directory.name,
            size / 1e6,
            durable,
        )
        if self._on_commit is not None:
            try:
                self._on_commit(directory, CheckpointTimes(pending.pause_s, durable, size))
            except Exception:  # the checkpoint stands; what follows a commit must not undo it
                log.exception("after committing %s", directory.name)
        return directory

    def _abandon_checkpoint(self, reason: str) -> None:
        pending = self.pending
        self.pending = None
        if pending is not None:
            log.warning("checkpoint %s abandoned: %s", pending.directory.name, reason)


def _rpc_error(exc: Exception) -> str:
    if isinstance(exc, grpc.RpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc)
