"""Flash checkpoints of a parameter server: shared memory first, the durable copy in background.

A checkpoint copies the PS's state into its **slot**, one file in shared memory
(``JobDir.flash_dir``, ``/dev/shm`` by default) kept for the PS process's whole life and
reused by every checkpoint: its pages are allocated and mapped once (allocating tmpfs pages costs
more than the copy itself), and grown ahead by the persister when a snapshot fills it past
``1 / HEADROOM``, so the copy runs at memory speed and pushes wait only for it. The Save RPC
returns then; a persister thread does the rest off the training path: it sorts the arrays the
snapshot names (the ledger's keys, copied in log order), writes the slot to the durable
checkpoint directory as a checksummed ``.npz`` (``core.checkpoint_files.write_npz``: hashing,
fsync, rename) and the master commits the checkpoint once every PS reports its part persisted.

A slot is ``ps-<index>-<pid>.data`` with its metadata ``ps-<index>-<pid>.json`` (the arrays'
places, the durable target, the master that asked, whether it is persisted): only the process
``pid`` writes it, so a PS that is still exiting never shares a file with its replacement. The
metadata is removed before a copy starts and written back after it ends, so a slot without
metadata is never read. A clean exit removes the slot; a crash leaves it, an **orphan**: the
next PS of that index (``choose_restore``) restores from it when it holds exactly the committed
checkpoint's part, or a newer snapshot taken for the master still running (whose checkpoint may
be waiting for that part: the relaunched PS persists it), and removes it afterwards.

The job's folder is this user's alone (``core.private_dir``: 0700, never a link, refused when
found open to others) and its files are 0600; a slot is restored only once ``slot_problem``
finds its target inside the job and every array inside the slot.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import mmap
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from airflow_rover.core.checkpoint_files import (
    CorruptCheckpoint,
    PartDigest,
    read_manifest,
    write_npz,
)
from airflow_rover.core.job_dir import ENV_FLASH_DIR, JobDir, checkpoint_number, flash_dir_for
from airflow_rover.core.private_dir import ensure_private_dir, is_private_dir

log = logging.getLogger(__name__)

SLOT_FORMAT = 1
HEADROOM = 1.25  # a slot grows to 1.25x what it must hold: rows keep being created
ALIGN = 64
CLOSE_WAIT_S = 30.0
STALE_SLOT_S = 3600.0  # a crashed PS's slot older than this is nobody's any more

PERSISTING, DONE, FAILED = "persisting", "done", "failed"


_PRIVATE_FILE = os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def _raw(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


class ShmSlot:
    """One PS's file in shared memory, mapped once and reused, with its metadata file."""

    def __init__(self, directory: Path, index: int, pid: int | None = None) -> None:
        self.directory = directory
        self.index = index
        self.pid = os.getpid() if pid is None else pid
        self.data_path = directory / f"ps-{index}-{self.pid}.data"
        self.meta_path = directory / f"ps-{index}-{self.pid}.json"
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self.capacity = 0

    def _open(self) -> int:
        if self._fd is None:
            for attempt in range(3):  # another PS of the job may remove the empty folder
                ensure_private_dir(self.directory)
                try:
                    self._fd = os.open(self.data_path, _PRIVATE_FILE | os.O_RDWR, 0o600)
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise
            assert self._fd is not None
            size = os.fstat(self._fd).st_size
            if size:
                self._map_file(size)
        return self._fd

    def _map_file(self, size: int) -> None:
        if self._map is not None:
            self._map.close()
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # page tables filled now
        self._map = mmap.mmap(self._open(), size, flags=flags)
        self.capacity = size

    def reserve(self, nbytes: int) -> None:
        """Make the slot hold at least ``nbytes``, its pages allocated and mapped (slow: do it
        before pausing anything)."""
        fd = self._open()
        if nbytes <= self.capacity:
            return
        size = _round_up(max(int(nbytes * HEADROOM), 1 << 20), 1 << 20)
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, size)
            else:  # pragma: no cover - macOS
                os.ftruncate(fd, size)
        except OSError as exc:
            os.ftruncate(fd, self.capacity)  # give back what was allocated
            raise ValueError(
                f"no room for a {size / 1e6:.0f} MB snapshot in {self.directory.parent} "
                f"({exc.strerror}); point ${ENV_FLASH_DIR} at a folder with room"
            ) from exc
        self._map_file(size)

    def write(self, arrays: Iterable[tuple[str, np.ndarray]], offset: int) -> list[list[Any]]:
        """Copy ``arrays`` into the slot from ``offset`` on; returns their places
        ``[name, dtype, shape, offset, nbytes]``."""
        placed: list[list[Any]] = []
        for name, array in arrays:
            raw = _raw(array)
            offset = _round_up(offset, ALIGN)
            if offset + raw.size > self.capacity:
                self.reserve(offset + raw.size)  # rare: rows created since the estimate
            assert self._map is not None
            dst = np.frombuffer(self._map, dtype=np.uint8, count=raw.size, offset=offset)
            np.copyto(dst, raw)
            del dst
            placed.append([name, array.dtype.str, list(array.shape), offset, raw.size])
            offset += raw.size
        return placed

    def invalidate(self) -> None:
        self.meta_path.unlink(missing_ok=True)

    def publish(self, meta: dict[str, Any]) -> None:
        ensure_private_dir(self.directory)
        tmp = self.meta_path.with_name(f".{self.meta_path.name}.tmp")
        fd = os.open(tmp, _PRIVATE_FILE | os.O_WRONLY | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(meta))
        os.replace(tmp, self.meta_path)

    def read_meta(self) -> dict[str, Any] | None:
        """The metadata of a complete snapshot in the slot, or None (also when the folder is
        one other users could have written)."""
        if not is_private_dir(self.directory):
            return None
        try:
            meta = json.loads(self.meta_path.read_text())
            size = self.data_path.stat().st_size
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or meta.get("format") != SLOT_FORMAT:
            return None
        if int(meta.get("end", 0)) > size:
            return None
        return meta

    def arrays(self, meta: dict[str, Any]) -> dict[str, np.ndarray]:
        """Zero-copy views of the snapshot ``meta`` describes (drop them before the slot is
        written again or closed)."""
        self._open()
        if self._map is None or int(meta["end"]) > self.capacity:
            raise ValueError("the slot is smaller than its metadata says")
        out: dict[str, np.ndarray] = {}
        for name, dtype, shape, offset, nbytes in meta["arrays"]:
            flat = np.frombuffer(self._map, dtype=np.uint8, count=nbytes, offset=offset)
            out[name] = flat.view(np.dtype(dtype)).reshape(shape)
        return out

    def close(self) -> None:
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view still alive: unmapped at exit
                self._map.close()
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.capacity = 0

    def remove(self) -> None:
        self.close()
        self.meta_path.unlink(missing_ok=True)
        self.data_path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # another PS of the job still has its slot there
            self.directory.rmdir()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def orphan_slots(directory: Path, index: int) -> list[ShmSlot]:
    """Slots of PS ``index`` left by processes that are gone (they crashed), newest first."""
    if not is_private_dir(directory):
        return []
    pids = set()
    for path in directory.glob(f"ps-{index}-*.*"):
        pid = path.stem.rsplit("-", 1)[1]
        if pid.isdigit() and int(pid) != os.getpid():
            pids.add(int(pid))
    slots = [ShmSlot(directory, index, pid) for pid in pids if not _alive(pid)]

    def taken_at(slot: ShmSlot) -> float:
        meta = slot.read_meta()
        return float(meta.get("taken_at", 0.0)) if meta else 0.0

    return sorted(slots, key=taken_at, reverse=True)


def sweep_stale_slots(root: Path, max_age_s: float = STALE_SLOT_S) -> None:
    """Give back the slots of processes gone for more than ``max_age_s`` in every job's folder
    under ``root`` (a job killed outright, whose PS never ran again)."""
    now = time.time()
    for directory in root.glob("airflow-rover-*"):
        if not is_private_dir(directory):  # another user's, or a link to elsewhere: not ours
            continue
        for path in directory.glob("ps-*-*.*"):
            pid = path.stem.rsplit("-", 1)[1]
            with contextlib.suppress(OSError):
                if (
                    pid.isdigit()
                    and now - path.stat().st_mtime > max_age_s
                    and not _alive(int(pid))
                ):
                    path.unlink()
        with contextlib.suppress(OSError):
            directory.rmdir()


@dataclass
class Persist:
    """The durable write of one snapshot, as the master's status poll sees it."""

    target: Path
    state: str
    digest: PartDigest | None = None
    error: str = ""
    seconds: float = 0.0


def _grow_ahead(slot: ShmSlot, end: int) -> None:
    """Leave the slot room for the state to grow by ``HEADROOM`` past the snapshot that ends at
    ``end``, so the next Save call finds its pages allocated and mapped (growing takes longer
    than the copy; here it runs in the persister). Best effort: without room, the next save
    grows it or says why."""
    try:
        slot.reserve(math.ceil(end * HEADROOM))
    except (ValueError, OSError, BufferError) as exc:  # BufferError: a view still maps it
        log.warning("the flash slot %s was not grown ahead: %s", slot.data_path, exc)


@dataclass(frozen=True)
class SnapshotTimes:
    bytes: int
    pause_s: float  # pushes waited this long (the copy under the apply lock)
    save_s: float  # the whole Save call: slot check, copy, ledger, metadata


class FlashCheckpointer:
    """One PS's slot and its persister: ``begin`` -> ``copy`` (under the PS's lock) ->
    ``finish`` (starts the durable write); ``status`` answers the master's poll."""

    def __init__(self, slot: ShmSlot) -> None:
        self.slot = slot
        self._job: Persist | None = None
        self._thread: threading.Thread | None = None
        self._meta: dict[str, Any] | None = None
        self._end = 0
        self._started = 0.0
        self.last: SnapshotTimes | None = None
        atexit.register(self.close)

    @classmethod
    def for_job(cls, checkpoints: Path, index: int) -> FlashCheckpointer:
        directory = flash_dir_for(checkpoints)
        sweep_stale_slots(directory.parent)
        ensure_private_dir(directory)  # refused here, at start, rather than at the first save
        return cls(ShmSlot(directory, index))

    def busy(self) -> bool:
        return self._job is not None and self._job.state == PERSISTING

    def begin(self, estimate_bytes: int) -> None:
        """Before the pause: refuse while the last snapshot is still being persisted (the slot
        holds it), grow the slot to the estimate, and mark the slot's content invalid."""
        if self.busy():
            assert self._job is not None
            raise ValueError(f"the previous checkpoint ({self._job.target}) is still persisting")
        self._started = time.perf_counter()
        self.slot.reserve(estimate_bytes)
        self.slot.invalidate()
        self._meta = {"format": SLOT_FORMAT, "arrays": []}
        self._end = 0

    def copy(self, arrays: Iterable[tuple[str, np.ndarray]]) -> None:
        """Copy arrays into the slot (the caller decides what lock this runs under)."""
        if self._meta is None:
            raise RuntimeError("copy() outside begin() / finish()")
        placed = self.slot.write(arrays, self._end)
        self._meta["arrays"].extend(placed)
        if placed:
            self._end = placed[-1][3] + placed[-1][4]

    def finish(
        self, target: Path, owner: int, pause_s: float, sort: Iterable[str] = ()
    ) -> SnapshotTimes:
        """Publish the snapshot in the slot and start writing it to ``target``; the 1-D arrays
        named in ``sort`` (sets held in any order: the ledger's keys) are written sorted."""
        if self._meta is None:
            raise RuntimeError("finish() without begin()")
        meta = {
            **self._meta,
            "end": self._end,
            "target": str(target),
            "owner": owner,
            "taken_at": time.time(),
            "persisted": None,
            "sort": list(sort),
        }
        self._meta = None
        self.slot.publish(meta)
        self.last = SnapshotTimes(self._end, pause_s, time.perf_counter() - self._started)
        self._persist_in_background(meta)
        return self.last

    def adopt(self, slot: ShmSlot, meta: dict[str, Any]) -> None:
        """After a restore from an orphan ``slot``: report its persist as done, or persist it
        now (the PS that took it died before its durable copy was written); then remove it."""
        persisted = meta.get("persisted")
        if persisted:
            digest = PartDigest(persisted["sha256"], int(persisted["bytes"]))
            self._job = Persist(Path(meta["target"]), DONE, digest)
            slot.remove()
        else:
            self._persist_in_background(meta, slot)

    def _persist_in_background(self, meta: dict[str, Any], slot: ShmSlot | None = None) -> None:
        self._job = Persist(Path(meta["target"]), PERSISTING)
        self._thread = threading.Thread(
            target=self._persist,
            args=(slot or self.slot, meta, self._job, slot is not None),
            name="flash-persist",
            daemon=True,
        )
        self._thread.start()

    def _persist(self, slot: ShmSlot, meta: dict[str, Any], job: Persist, adopted: bool) -> None:
        start = time.perf_counter()
        try:
            arrays = slot.arrays(meta)
            for name in meta.get("sort", []):
                if name in arrays and arrays[name].ndim == 1:
                    arrays[name] = np.sort(arrays[name])
            try:
                digest = write_npz(job.target, arrays.items())
            finally:
                del arrays
            meta["persisted"] = {"sha256": digest.sha256, "bytes": digest.bytes}
            if not adopted:
                slot.publish(meta)
                _grow_ahead(slot, int(meta["end"]))
        except Exception as exc:
            job.error = f"{type(exc).__name__}: {exc}"
            job.state = FAILED
            log.error("persisting %s failed: %s", job.target, job.error)
            return
        finally:
            if adopted:
                slot.remove()
        job.seconds = time.perf_counter() - start
        job.digest = digest
        job.state = DONE
        log.info("persisted %s (%.1f MB in %.2f s)", job.target, digest.bytes / 1e6, job.seconds)

    def status(self, target: Path) -> Persist | None:
        job = self._job
        return job if job is not None and job.target == target else None

    def wait(self, timeout_s: float | None = None) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def close(self) -> None:
        """On a clean exit: let a running persist end, then give the shared memory back."""
        self.wait(CLOSE_WAIT_S)
        self.slot.remove()


@dataclass(frozen=True)
class RestoreChoice:
    checkpoint: Path | None  # the newest verified checkpoint (``JobDir.latest_checkpoint``)
    slot: ShmSlot | None  # restore from this orphan slot instead, when set
    slot_meta: dict[str, Any] | None
    why: str
    orphans: list[ShmSlot]  # every orphan slot found (the caller removes the unused ones)
    newer: bool = False  # the slot holds a snapshot newer than ``checkpoint`` (case b)


def choose_restore(job_dir: JobDir, index: int) -> RestoreChoice:
    """Where a (re)starting PS takes its partition from.

    The durable checkpoint is the one every process agrees on (``latest_checkpoint``). The
    newest orphan slot of this PS index is used instead when it holds (a) that checkpoint's part
    byte for byte (its persisted digest is the one the manifest lists: shared memory is faster
    to read), or (b) a newer snapshot taken for the master that is still running: this PS alone
    died, the other PS and the master's queue are live, and the ledgers reconcile them
    (``docs/fault-tolerance.md``). A new master resumes its queue from the durable checkpoint,
    so (b) never applies to it."""
    chosen = job_dir.latest_checkpoint()
    orphans = orphan_slots(job_dir.flash_dir, index)
    meta = orphans[0].read_meta() if orphans else None
    if meta is None:
        return RestoreChoice(chosen, None, None, "no snapshot in shared memory", orphans)
    slot = orphans[0]
    part = f"ps-{index}.npz"
    problem = slot_problem(meta, orphans[0], job_dir.checkpoints, part)
    if problem:
        log.warning("PS %d: the snapshot in %s is not used: %s", index, slot.meta_path, problem)
        return RestoreChoice(chosen, None, None, f"shared memory refused: {problem}", orphans)
    persisted = meta.get("persisted") or {}
    if chosen is not None and persisted:
        try:
            listed = read_manifest(chosen).get(part)
        except CorruptCheckpoint:
            listed = None
        if listed is not None and listed.sha256 == persisted.get("sha256"):
            why = f"shared memory holds {chosen.name}/{part}"
            return RestoreChoice(chosen, slot, meta, why, orphans)
    target = Path(str(meta.get("target", "")))
    number = checkpoint_number(target.parent.name)
    current = job_dir.master_info().get("pid")
    committed = checkpoint_number(chosen.name) or 0 if chosen is not None else 0
    newer = number is not None and number > committed
    if newer and current is not None and meta.get("owner") == current:
        state = "persisted" if persisted else "not persisted yet"
        why = f"shared memory holds a newer snapshot ({target.parent.name}, {state})"
        return RestoreChoice(chosen, slot, meta, why, orphans, newer=True)
    why = "the snapshot in shared memory is not usable here"
    return RestoreChoice(chosen, None, None, why, orphans)


_ARRAY_KINDS = "biuf"  # what a PS holds: ids, counters, weights; never objects


def slot_problem(meta: dict[str, Any], slot: ShmSlot, checkpoints: Path, part: str) -> str:
    """Why the snapshot ``meta`` describes must not be restored into PS part ``part`` of the
    job checkpointed in ``checkpoints`` ("" when nothing is wrong): its durable target must be
    that part of one of the job's checkpoints, and every array must lie inside the snapshot
    with a plain numeric type and the byte count its shape says."""
    target = Path(str(meta.get("target", "")))
    if (
        target.name != part
        or checkpoint_number(target.parent.name) is None
        or target.parent.parent.resolve() != checkpoints.resolve()
    ):
        return f"its target {str(target)!r} is not {part} of a checkpoint in {checkpoints}"
    try:
        end = min(int(meta["end"]), slot.data_path.stat().st_size)
        for name, dtype, shape, offset, nbytes in meta["arrays"]:
            kind = np.dtype(dtype)
            if kind.kind not in _ARRAY_KINDS:
                return f"array {name!r} has type {dtype!r}, not a number type"
            numbers = [offset, nbytes, *shape]
            if not all(type(n) is int and n >= 0 for n in numbers):
                return f"array {name!r}: offset, size and shape must be whole numbers"
            if math.prod(shape) * kind.itemsize != nbytes:
                return f"array {name!r}: shape {shape} does not match its {nbytes} bytes"
            if offset + nbytes > end:
                return f"array {name!r} ends past the snapshot"
    except (KeyError, TypeError, ValueError, OSError) as exc:
        return f"unreadable metadata ({type(exc).__name__}: {exc})"
    return ""
