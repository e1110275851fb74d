"""Durable copies of a job's committed checkpoints in a store, published so a reader never takes
a half-written one, and verified by checksum on the way back.

Publication mirrors the local commit (``master/checkpointer.py``): the PS parts first (large
ones as multipart uploads), then ``queue.json`` (the shard queue and every part's size and
SHA-256), then ``LATEST`` naming the checkpoint. A reader starts from ``LATEST`` and takes the
newest checkpoint at or before it whose manifest verifies and whose every part is there with
its recorded size; a download also hashes every part (``core.checkpoint_files``) and one that
fails is skipped, with the reason logged, for the one before it.

The master calls ``upload_checkpoint`` (or ``CheckpointMirror.submit``, which does it in the
background) once a checkpoint is committed locally; the store keeps the last ``keep``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_rover.core.checkpoint_files import (
    QUEUE_FILE,
    RECORD_KEY,
    CorruptCheckpoint,
    PartDigest,
    fsync_path,
    read_manifest,
    verify_checkpoint,
)
from airflow_rover.core.job_dir import checkpoint_number
from airflow_rover.core.shards import ShardQueue
from airflow_rover.storage.base import CheckpointStore, StorageError, tree_files

log = logging.getLogger(__name__)

LATEST = "LATEST"
DEFAULT_KEEP = 2


@dataclass(frozen=True)
class StoredCheckpoint:
    """A committed checkpoint in a store: where it is, how far training had got, and the
    checksums that prove its parts."""

    name: str
    uri: str
    samples: int  # samples of the shards done at the snapshot (the job's ``samples_done``)
    samples_total: int
    parts: dict[str, PartDigest] = field(default_factory=dict)
    manifest_sha256: str | None = None

    @property
    def number(self) -> int:
        return checkpoint_number(self.name) or 0

    def summary(self) -> dict[str, Any]:
        """The JSON-safe shape pushed to XCom (no credentials: the URI names the object)."""
        return {
            "name": self.name,
            "number": self.number,
            "uri": self.uri,
            "samples": self.samples,
            "samples_total": self.samples_total,
            "checksums": {name: d.sha256 for name, d in sorted(self.parts.items())},
            "bytes": sum(d.bytes for d in self.parts.values()),
            "manifest_sha256": self.manifest_sha256,
        }


def checkpoint_samples(queue: dict[str, Any]) -> tuple[int, int]:
    """Samples trained at a checkpoint and in the whole job, from its ``queue.json``: the
    samples of the shards DONE at the snapshot, the same count as the job's ``samples_done``
    (every push of a done shard reached the PS before the snapshot, so the parts hold them).
    Raises ValueError when the record holds no shard queue."""
    data = {k: v for k, v in queue.items() if k != RECORD_KEY}
    try:
        shards = ShardQueue.from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"{QUEUE_FILE} holds no shard queue ({type(exc).__name__}: {exc})"
        ) from None
    return shards.done_samples, shards.total_samples


def _manifest(raw: bytes) -> tuple[dict[str, PartDigest], dict[str, Any], str | None]:
    """The parts a ``queue.json`` lists (checked against its own digest by
    ``read_manifest``), its content, and its digest; raises ``CorruptCheckpoint``."""
    with tempfile.TemporaryDirectory(prefix="rover-manifest-") as tmp:
        Path(tmp, QUEUE_FILE).write_bytes(raw)
        parts = read_manifest(Path(tmp))
    data = json.loads(raw)
    record = data.get(RECORD_KEY) or {}
    return parts, data, record.get("sha256") if isinstance(record, dict) else None


def _check_listing(name: str, parts: dict[str, PartDigest], listing: dict[str, int]) -> None:
    """Every listed part is stored with its recorded size (cheap: no download)."""
    for part, want in sorted(parts.items()):
        size = listing.get(f"{name}/{part}")
        if size is None:
            raise CorruptCheckpoint(f"{part}: missing")
        if size != want.bytes:
            raise CorruptCheckpoint(f"{part}: {size} bytes, the manifest says {want.bytes}")


def inspect_checkpoint(store: CheckpointStore, name: str) -> StoredCheckpoint:
    """Checkpoint ``name`` as stored: its manifest verified, every part present with its
    recorded size, its samples; raises ``CorruptCheckpoint`` with the reason otherwise. Part
    contents are hashed only on download (``download_checkpoint``)."""
    raw = store.read_bytes(f"{name}/{QUEUE_FILE}")
    if raw is None:
        raise CorruptCheckpoint(f"{QUEUE_FILE} missing (never committed)")
    parts, data, digest = _manifest(raw)
    _check_listing(name, parts, store.list_objects(name))
    try:
        samples, total = checkpoint_samples(data)
    except ValueError as exc:
        raise CorruptCheckpoint(str(exc)) from None
    return StoredCheckpoint(name, store.uri_of(name), samples, total, parts, digest)


def _latest_name(store: CheckpointStore) -> str | None:
    raw = store.read_bytes(LATEST)
    return raw.decode("utf-8", errors="replace").strip() if raw is not None else None


def candidates(store: CheckpointStore) -> list[str]:
    """The checkpoints a reader may take, newest first: those at or before ``LATEST`` (none
    before anything was published), as ``JobDir.latest_checkpoint`` does locally."""
    named = _latest_name(store)
    if named is None:
        return []
    limit = checkpoint_number(named)
    names = [
        n for n in store.list_checkpoints() if limit is None or (checkpoint_number(n) or 0) <= limit
    ]
    return list(reversed(names))


def latest_remote_checkpoint(
    store: CheckpointStore, min_samples: int = 0
) -> StoredCheckpoint | None:
    """The newest published checkpoint in ``store`` that verifies (manifest, parts present
    with their sizes) and holds at least ``min_samples`` trained samples; None if there is
    none yet. One that does not verify is skipped with the reason logged."""
    for name in candidates(store):
        try:
            found = inspect_checkpoint(store, name)
        except CorruptCheckpoint as exc:
            log.warning("checkpoint %s in %s skipped: %s", name, store.uri, exc)
            continue
        if found.samples >= min_samples:
            return found
    return None


# -- upload ------------------------------------------------------------------------------------
def upload_checkpoint(
    local_checkpoint_dir: Path | str, store: CheckpointStore, keep: int = DEFAULT_KEEP
) -> StoredCheckpoint:
    """Store the committed local checkpoint ``local_checkpoint_dir`` (``.../ckpt-<n>``) and
    publish it: parts, then ``queue.json``, then ``LATEST``; then delete the stored
    checkpoints older than the last ``keep``. Idempotent: a checkpoint already stored whole is
    not uploaded again. ``LATEST`` never moves back to an older checkpoint.

    Raises ``CorruptCheckpoint`` if the local checkpoint does not verify (nothing is
    uploaded), ``StorageError`` if the store fails (``LATEST`` then still names the previous
    checkpoint), ValueError for a directory that is not a checkpoint or a bad ``keep``."""
    directory = Path(local_checkpoint_dir)
    name = directory.name
    number = checkpoint_number(name)
    if number is None or not directory.is_dir():
        raise ValueError(
            f"local_checkpoint_dir={str(directory)!r}: accepted: a committed checkpoint "
            "directory named ckpt-<n> (JobDir.checkpoint_dir)"
        )
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
        raise ValueError(f"keep={keep!r}: accepted: an integer >= 1 (checkpoints kept)")
    reason = verify_checkpoint(directory)
    if reason is not None:
        raise CorruptCheckpoint(f"{directory}: {reason}; not uploaded")
    raw = (directory / QUEUE_FILE).read_bytes()
    parts, data, digest = _manifest(raw)
    try:
        samples, total = checkpoint_samples(data)
    except ValueError as exc:
        raise CorruptCheckpoint(f"{directory}: {exc}; not uploaded") from None
    files = sorted(parts) if parts else [k for _, k in tree_files(directory, skip={QUEUE_FILE})]
    sizes = {f"{name}/{f}": (directory / f).stat().st_size for f in files}

    started = time.monotonic()
    stored = store.list_objects(name)
    if store.read_bytes(f"{name}/{QUEUE_FILE}") == raw and all(
        stored.get(k) == size for k, size in sizes.items()
    ):
        log.info("checkpoint %s already in %s", name, store.uri)
    else:
        if stored:  # a stale or partial upload under this name: uncommit it, then clear it
            store.delete(f"{name}/{QUEUE_FILE}")
            store.delete(name)
        for f in files:
            store.put_file(directory / f, f"{name}/{f}")
        listing = store.list_objects(name)
        wrong = sorted(k for k, size in sizes.items() if listing.get(k) != size)
        if wrong:
            raise StorageError(f"{store.uri}: {wrong} not stored whole; {name} not published")
        store.put_file(directory / QUEUE_FILE, f"{name}/{QUEUE_FILE}")
        log.info(
            "checkpoint %s stored in %s (%.1f MB in %.2f s)",
            name,
            store.uri,
            sum(sizes.values()) / 1e6,
            time.monotonic() - started,
        )
    _publish(store, name, number)
    _prune(store, number, keep)
    return StoredCheckpoint(name, store.uri_of(name), samples, total, parts, digest)


def _publish(store: CheckpointStore, name: str, number: int) -> None:
    """Point ``LATEST`` at ``name`` unless it names a newer checkpoint already."""
    current = _latest_name(store)
    current_number = checkpoint_number(current) if current else None
    if current_number is not None and current_number > number:
        log.warning(
            "checkpoint %s stored in %s but not published: LATEST names the newer %s",
            name,
            store.uri,
            current,
        )
        return
    if current != name:
        store.put_bytes(LATEST, name.encode())


def _prune(store: CheckpointStore, number: int, keep: int) -> None:
    """Keep ``number`` and the ``keep - 1`` newest committed checkpoints before it; delete
    every other checkpoint before it (committed or left half-uploaded). Newer ones (not ours
    to judge) stay. A failed delete is logged: it costs space, not correctness."""
    kept = 1
    older = [n for n in store.list_checkpoints() if (checkpoint_number(n) or 0) < number]
    for name in reversed(older):
        try:
            committed = f"{name}/{QUEUE_FILE}" in store.list_objects(name)
            if committed and kept < keep:
                kept += 1
                continue
            store.delete(f"{name}/{QUEUE_FILE}")  # uncommitted first: never seen half-deleted
            store.delete(name)
            log.info("checkpoint %s deleted from %s (keeping %d)", name, store.uri, keep)
        except StorageError as exc:
            log.warning("could not delete checkpoint %s from %s: %s", name, store.uri, exc)


# -- download ----------------------------------------------------------------------------------
def download_checkpoint(
    store: CheckpointStore,
    name: str,
    local_dir: Path | str,
    job_id: str | None = None,
    fingerprint: str | None = None,
) -> Path:
    """Copy stored checkpoint ``name`` into ``local_dir/name`` and verify every part's
    checksum before it appears there (it is assembled in a hidden sibling, then renamed).
    Returns the directory. Raises ``CorruptCheckpoint`` (the message says which part and
    why) when it is incomplete or does not verify; ``local_dir`` is then left as it was.
    Only the parts the manifest lists are read, each to a plain file of that directory.
    With ``job_id``: a checkpoint of another job (or of none), or with ``fingerprint`` one
    of this job that trained something else, raises ``ForeignCheckpoint``.

    ``local_dir`` may be a job's ``checkpoints/`` folder; naming the checkpoint in its
    ``LATEST`` (``JobDir.commit_checkpoint``) is the caller's decision."""
    if checkpoint_number(name) is None:
        raise ValueError(f"name={name!r}: accepted: a checkpoint name ckpt-<n>")
    local_dir = Path(local_dir)
    target = local_dir / name
    where = store.uri_of(name)
    raw = store.read_bytes(f"{name}/{QUEUE_FILE}")
    if raw is None:
        raise CorruptCheckpoint(f"{where}: {QUEUE_FILE} missing (never committed)")
    try:
        parts, data, _ = _manifest(raw)
        listing = store.list_objects(name)
        _check_listing(name, parts, listing)
    except CorruptCheckpoint as exc:
        raise CorruptCheckpoint(f"{where}: {exc}") from None
    if job_id is not None:
        check_owner(data, job_id, where, fingerprint)
    here = target / QUEUE_FILE
    if here.is_file() and here.read_bytes() == raw and verify_checkpoint(target) is None:
        return target  # already here, whole
    files = sorted(parts)
    tmp = local_dir / f".{name}.download-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        (tmp / QUEUE_FILE).write_bytes(raw)
        for f in files:
            store.get_file(f"{name}/{f}", _inside(tmp, f))
        reason = verify_checkpoint(tmp)
        if reason is not None:
            raise CorruptCheckpoint(f"{where}: {reason}")
        for path in tmp.rglob("*"):
            if path.is_file():
                fsync_path(path)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        fsync_path(local_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("checkpoint %s downloaded from %s to %s (verified)", name, store.uri, target)
    return target


def restore_latest_checkpoint(
    store: CheckpointStore, local_dir: Path | str, job_id: str, fingerprint: str | None = None
) -> Path | None:
    """Download the newest published checkpoint of job ``job_id`` that verifies into
    ``local_dir``; one that does not (a part missing, truncated, or failing its checksum) is
    skipped with the reason logged, for the one before it. None when no stored checkpoint
    verifies; ``ForeignCheckpoint`` when one of another job does (the store is another
    job's: nothing of it is resumed)."""
    for name in candidates(store):
        try:
            return download_checkpoint(store, name, local_dir, job_id, fingerprint)
        except ForeignCheckpoint:
            raise
        except CorruptCheckpoint as exc:
            log.warning("checkpoint %s skipped: %s", name, exc)
    return None


class ForeignCheckpoint(StorageError):
    """A checkpoint that is not the job's own: resuming it would train another job's model
    (or skip training, its queue being done)."""


def check_owner(
    queue: dict[str, Any], job_id: str, where: str, fingerprint: str | None = None
) -> None:
    """Raise ``ForeignCheckpoint`` unless the checkpoint's ``queue.json`` names ``job_id``
    and, where both are known, the same ``fingerprint`` (an earlier run of the job on other
    data or with another spec: its rows and queue are not this run's)."""
    owner = queue.get("job_id")
    if owner != job_id:
        whose = f"job {owner!r}" if owner else "no job (its queue.json names none)"
        raise ForeignCheckpoint(
            f"{where} is a checkpoint of {whose}, not of job {job_id!r}: a job resumes only "
            "its own; give each run its own output_dir and checkpoint_uri (e.g. with {{ ds }})"
        )
    trained = queue.get("fingerprint")
    if fingerprint is not None and trained is not None and trained != fingerprint:
        raise ForeignCheckpoint(
            f"{where} is a checkpoint of an earlier run of job {job_id!r} that trained other "
            f"data or another spec (fingerprint {trained}, this run {fingerprint}): a run "
            "resumes only what it trains itself"
        )


def _inside(directory: Path, name: str) -> Path:
    """``directory / name``, refused unless it stays a file of ``directory``."""
    path = (directory / name).resolve()
    if path.parent != directory.resolve():
        raise CorruptCheckpoint(f"{name!r}: not a file of {directory}")
    return path


# -- in the background -------------------------------------------------------------------------
class CheckpointMirror:
    """Uploads committed checkpoints to a store in a background thread, so the master's
    supervisor never waits for the network: ``submit`` after each local commit. Only the
    newest checkpoint waiting is uploaded (an older one not started yet is superseded); an
    upload that fails is logged and the next checkpoint is tried as usual."""

    def __init__(self, store: CheckpointStore, keep: int = DEFAULT_KEEP) -> None:
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"keep={keep!r}: accepted: an integer >= 1 (checkpoints kept)")
        self.store = store
        self.keep = keep
        self.last: StoredCheckpoint | None = None  # the last checkpoint stored
        self.last_error: str | None = None  # why the last upload failed (None: it did not)
        self._cond = threading.Condition()
        self._next: Path | None = None
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None

    def submit(self, directory: Path | str) -> None:
        """Upload the committed checkpoint ``directory`` soon; returns at once."""
        with self._cond:
            if self._closed:
                raise RuntimeError("CheckpointMirror is closed")
            if self._next is not None:
                log.info("checkpoint %s superseded before its upload", self._next.name)
            self._next = Path(directory)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="rover-checkpoint-mirror", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every submitted checkpoint is uploaded (or failed); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._next is None and not self._busy, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Finish what was submitted and stop the thread; False if it did not finish in time."""
        done = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        return done

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._next is not None or self._closed)
                if self._next is None:
                    return
                directory, self._next, self._busy = self._next, None, True
            try:
                self.last = upload_checkpoint(directory, self.store, self.keep)
                self.last_error = None
            except Exception as exc:  # never into the master: the local checkpoint stands
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "checkpoint %s not stored in %s: %s", directory.name, self.store.uri, exc
                )
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
