"""Checkpoint files that prove they are whole: checksummed ``.npz`` parts and the manifest.

A PS partition is a standard ``.npz`` (``np.load`` reads it) whose zip archive comment is
``rover-sha256:<64 hex>``: the SHA-256 of every byte of the file before those 64 hex digits.
A file is therefore checked without unpacking it (one streaming hash), and a part written
half-way, truncated or with any byte changed fails the check. Parts are written to a hidden
temporary sibling, fsynced, then renamed, so the name only ever holds a complete file.

The master commits a checkpoint by writing ``queue.json``: the shard queue at the snapshot, plus
under ``"checkpoint"`` every part's size and SHA-256 and one SHA-256 over the queue and that
list. ``verify_checkpoint`` checks all of it; ``JobDir.latest_checkpoint`` uses it to pick
the newest checkpoint whose every part verifies.

Why SHA-256 and not a cheaper sum: with SHA-NI it hashes at ~1.8 GB/s on one core, faster than
a durable write (write + fsync ~1 GB/s here), and it runs off the training path (the persister
thread, and a restore's check); see ``bench/flash_checkpoint.py``.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import mmap
import os
import struct
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from airflow_rover.core.npz_view import NotPlain, arrays_from_map

DIGEST_TAG = b"rover-sha256:"
_HEX = 64
_PLACEHOLDER = b"0" * _HEX
CHUNK = 8 << 20
QUEUE_FILE = "queue.json"
RECORD_KEY = "checkpoint"
CHECKPOINT_PREFIX = "ckpt-"


def checkpoint_number(name: str) -> int | None:
    """``ckpt-000012`` -> 12; None for anything else."""
    digits = name[len(CHECKPOINT_PREFIX) :]
    if not name.startswith(CHECKPOINT_PREFIX) or not digits.isdigit():
        return None
    return int(digits)


class CorruptCheckpoint(ValueError):
    """A checkpoint file that is missing, incomplete or fails its checksum."""


@dataclass(frozen=True)
class PartDigest:
    sha256: str
    bytes: int


class _DigestSink:
    """A write-only, non-seekable stream for ``zipfile``: passes bytes through to ``fh`` and
    hashes all of them except the last ``_HEX`` (the digest's place in the archive comment)."""

    def __init__(self, fh: Any) -> None:
        self._fh = fh
        self._hash = hashlib.sha256()
        self._tail = b""
        self._pos = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        self._fh.write(view)
        self._pos += n
        if n >= _HEX:
            self._hash.update(self._tail)
            self._hash.update(view[: n - _HEX])
            self._tail = bytes(view[n - _HEX :])
        else:
            joined = self._tail + bytes(view)
            self._hash.update(joined[:-_HEX])
            self._tail = joined[-_HEX:]
        return n

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        self._fh.flush()

    def finish(self) -> str:
        if self._tail != _PLACEHOLDER:
            raise RuntimeError("the archive did not end with its digest placeholder")
        return self._hash.hexdigest()


def _raw_bytes(array: np.ndarray) -> memoryview:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


_NO_DIRECTORY_FSYNC = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP})


def fsync_path(path: Path) -> None:
    """Flush a file or a directory entry to disk, so a rename never exposes unwritten data.
    Raises what the disk reports, except a file system that cannot fsync a directory at all
    (EINVAL, ENOTSUP: its renames are not made durable this way)."""
    is_dir = path.is_dir()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if is_dir else os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if not (is_dir and exc.errno in _NO_DIRECTORY_FSYNC):
            raise
    finally:
        os.close(fd)


def write_npz(
    path: Path, arrays: Iterable[tuple[str, np.ndarray]], durable: bool = True
) -> PartDigest:
    """Write ``arrays`` as a checksummed ``.npz`` at ``path``: temporary sibling, fsync,
    rename, fsync of the directory. Returns the file's digest and size. ``durable=False``
    leaves both fsyncs to the caller (``sync_file``, off the hot path): the name still only
    ever holds a complete file for other processes, and the checksum catches a file a
    machine crash cut short."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        sink = _DigestSink(fh)
        with zipfile.ZipFile(sink, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:  # type: ignore[call-overload]
            archive.comment = DIGEST_TAG + _PLACEHOLDER
            for name, array in arrays:
                with archive.open(f"{name}.npy", "w", force_zip64=True) as entry:
                    array = np.require(array, requirements="C")  # the header says C order
                    header = np.lib.format.header_data_from_array_1_0(array)
                    np.lib.format.write_array_header_1_0(entry, header)
                    raw = _raw_bytes(array)
                    for start in range(0, len(raw), CHUNK):
                        entry.write(raw[start : start + CHUNK])
        digest = sink.finish()
        fh.seek(-_HEX, os.SEEK_END)
        fh.write(digest.encode())
        fh.flush()
        if durable:
            os.fsync(fh.fileno())
        size = fh.tell()
    os.replace(tmp, path)
    if durable:
        fsync_path(path.parent)
    return PartDigest(digest, size)


def sync_file(path: Path) -> None:
    """Make a ``write_npz(..., durable=False)`` file durable: the file, then its directory."""
    fsync_path(path)
    fsync_path(path.parent)


def read_digest(path: Path) -> PartDigest:
    """Hash ``path`` and check it against the digest it carries; raises ``CorruptCheckpoint``
    with the reason when it is missing, truncated or changed."""
    with _verified(path) as (_, _, digest):
        return digest


@contextmanager
def _verified(path: Path) -> Iterator[tuple[Any, mmap.mmap, PartDigest]]:
    """``path`` open and mapped, once its digest checks out (``CorruptCheckpoint`` if not)."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{path.name}: missing") from None
    except OSError as exc:
        raise CorruptCheckpoint(f"{path.name}: unreadable ({exc})") from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        trailer = len(DIGEST_TAG) + _HEX
        if size < trailer:
            raise CorruptCheckpoint(f"{path.name}: truncated ({size} bytes)")
        fh.seek(size - trailer)
        tail = fh.read(trailer)
        if not tail.startswith(DIGEST_TAG):
            raise CorruptCheckpoint(f"{path.name}: no checksum (not a complete checkpoint part)")
        recorded = tail[len(DIGEST_TAG) :].decode("ascii", errors="replace")
        digest = hashlib.sha256()
        with mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                for start in range(0, size - _HEX, CHUNK):  # zero-copy; hashing drops the GIL
                    digest.update(view[start : min(start + CHUNK, size - _HEX)])
            finally:
                view.release()
            actual = digest.hexdigest()
            if actual != recorded:
                raise CorruptCheckpoint(
                    f"{path.name}: checksum mismatch (content sha256 {actual[:12]}..., "
                    f"recorded {recorded[:12]}...)"
                )
            yield fh, mapped, PartDigest(actual, size)


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of a part ``write_npz`` wrote, once its checksum is checked (raises
    ``CorruptCheckpoint``; ``OSError`` or ``ValueError`` for a file ``np.load`` rejects).
    The arrays are copied out of the mapping just hashed (``core.npz_view``)."""
    with _verified(path) as (fh, mapped, _):
        try:
            return arrays_from_map(fh, mapped)
        except (NotPlain, zipfile.BadZipFile, struct.error):
            pass
    with np.load(path) as archive:
        return {name: archive[name] for name in archive.files}


def read_npz_parts(
    paths: Sequence[Path],
) -> Iterator[tuple[Path, dict[str, np.ndarray] | Exception]]:
    """``read_npz`` of each path, in order, on the process's part readers (a thread a core).

    For chains of CPR partial saves: hashing, the zip's CRC checks and the reads release the
    GIL, so 20 partial saves of a PS read in about 115 ms on 2 cores against 170 ms one after
    the other. A part that cannot be read comes back as its exception, in its place.
    """

    def read(path: Path) -> dict[str, np.ndarray] | Exception:
        try:
            return read_npz(path)
        except (OSError, ValueError) as exc:  # CorruptCheckpoint is a ValueError
            return exc

    if len(paths) == 1:
        yield paths[0], read(paths[0])
        return
    yield from zip(paths, _part_readers().map(read, paths), strict=True)


@functools.cache
def _part_readers() -> ThreadPoolExecutor:
    """One pool for every parallel read of parts: a restore does not wait for threads to
    start (2 ms each on a loaded host, a tenth of a small chain's restore)."""
    return ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="part-reader")


# A forked child has none of the parent's threads: it starts a pool of its own.
os.register_at_fork(after_in_child=_part_readers.cache_clear)


def _record_digest(queue: dict[str, Any], parts: dict[str, Any]) -> str:
    canonical = json.dumps({"queue": queue, "parts": parts}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def checkpoint_record(queue: dict[str, Any], parts: dict[str, PartDigest]) -> dict[str, Any]:
    """What the master writes to ``queue.json`` to commit a checkpoint: the queue (top level,
    as ``ShardQueue.from_dict`` reads it) and the manifest of the PS parts under
    ``"checkpoint"``."""
    listed = {name: {"sha256": d.sha256, "bytes": d.bytes} for name, d in sorted(parts.items())}
    return {
        **queue,
        RECORD_KEY: {"format": 1, "parts": listed, "sha256": _record_digest(queue, listed)},
    }


def check_part_name(name: object) -> str:
    """A part's name as a manifest may list it: one plain file name in the checkpoint's
    directory (``ps-0.npz``), never a path that could lead out of it."""
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or name.startswith(".")
        or any(c in name for c in ("/", "\\", "\0"))
    ):
        raise CorruptCheckpoint(f"{QUEUE_FILE}: {name!r} is not a part name (a plain file name)")
    return name


def read_manifest(directory: Path) -> dict[str, PartDigest]:
    """The parts a committed checkpoint lists (``queue.json`` checked against its own
    digest); raises ``CorruptCheckpoint``. A ``queue.json`` without that record is refused:
    checksums cannot be switched off by deleting it."""
    try:
        data = json.loads((directory / QUEUE_FILE).read_text())
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{QUEUE_FILE} missing (never committed)") from None
    except (OSError, ValueError) as exc:
        raise CorruptCheckpoint(f"{QUEUE_FILE} unreadable ({exc})") from None
    if not isinstance(data, dict):
        raise CorruptCheckpoint(f"{QUEUE_FILE} is not an object")
    record = data.pop(RECORD_KEY, None)
    if record is None:
        raise CorruptCheckpoint(f"{QUEUE_FILE} has no checksum record ({RECORD_KEY!r})")
    try:
        parts = record["parts"]
        if _record_digest(data, parts) != record["sha256"]:
            raise CorruptCheckpoint(f"{QUEUE_FILE}: checksum mismatch")
        return {
            check_part_name(n): PartDigest(str(p["sha256"]), int(p["bytes"]))
            for n, p in parts.items()
        }
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        if isinstance(exc, CorruptCheckpoint):
            raise
        raise CorruptCheckpoint(f"{QUEUE_FILE}: malformed manifest ({exc!r})") from None


def _check_part(directory: Path, name: str, want: PartDigest) -> None:
    path = directory / name
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{name}: missing") from None
    if size != want.bytes:
        raise CorruptCheckpoint(f"{name}: {size} bytes, the manifest says {want.bytes}")
    got = read_digest(path)
    if got.sha256 != want.sha256:
        raise CorruptCheckpoint(f"{name}: not the part the manifest names (other sha256)")


def verify_checkpoint(directory: Path) -> str | None:
    """None if ``directory`` is a committed checkpoint whose every part verifies, else why
    not. Parts are hashed in parallel (hashing releases the GIL)."""
    try:
        parts = read_manifest(directory)
    except CorruptCheckpoint as exc:
        return str(exc)
    if not parts:
        return f"{QUEUE_FILE} lists no part"
    futures = [
        _part_readers().submit(_check_part, directory, n, d) for n, d in sorted(parts.items())
    ]
    for future in futures:
        try:
            future.result()
        except CorruptCheckpoint as exc:
            return str(exc)
    return None
