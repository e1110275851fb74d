"""The record or line offsets of a TFRecord or CSV file, found once per file and kept: every
process of a job (preflight, the master, each worker, the evaluator) opens the dataset, and
without a kept index each would read every file from end to end.

An index is kept beside its file (``.<name>.rover-index.npz``: hidden, so no reader lists it)
where the data's folder is writable, else in the job's folder (``ROVER_DATA_INDEX_DIR``, or
``data-index`` in the job directory of a node): always there for files on S3. It holds the
file's identity (local: path, size and modification time; S3: URI, size and ETag), so a
rewritten file is scanned again; one that does not load, names another identity or another
kind, or whose offsets do not end at the file's size is rebuilt, never trusted. It is written to
a temporary file and renamed, so a process never reads one half written.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from airflow_rover.core.job_dir import ENV_JOB_DIR
from airflow_rover.data.sources import S3_SCHEME, local_path

log = logging.getLogger(__name__)

ENV_INDEX_DIR = "ROVER_DATA_INDEX_DIR"
JOB_INDEX_FOLDER = "data-index"
SUFFIX = ".rover-index.npz"
VERSION = 1

Index = dict[str, np.ndarray]  # "offsets" (int64, ending at the file's size) and the kind's own


def job_index_dir(job_root: str | os.PathLike[str]) -> Path:
    """Where the indexes of a job whose data cannot hold them are kept."""
    return Path(job_root) / JOB_INDEX_FOLDER


def cached_index(path: str, kind: str, build: Callable[[], Index]) -> Index:
    """``path``'s index of ``kind`` (``tfrecord``, ``csv``): a kept one that matches the file,
    else ``build()``, kept for the next process."""
    identity, size = file_identity(path)
    places = _places(path)
    for place in places:
        found = _load(place, kind, identity, size)
        if found is not None:
            return found
    index = build()
    for place in places:
        if _store(place, kind, identity, index):
            break
    return index


def file_identity(path: str) -> tuple[str, int]:
    """What tells a rewritten file from the same one, and its size."""
    if path.startswith(S3_SCHEME):
        from airflow_rover.data.s3_files import head_object

        head = head_object(path)
        return f"{head.uri}:{head.size}:{head.etag}", head.size
    stat = os.stat(local_path(path))
    return f"{os.path.abspath(local_path(path))}:{stat.st_size}:{stat.st_mtime_ns}", stat.st_size


def _places(path: str) -> list[Path]:
    """Where ``path``'s index may be kept, in order: beside it (local files), the job's folder."""
    places = []
    if not path.startswith(S3_SCHEME):
        file = Path(local_path(path))
        places.append(file.with_name(f".{file.name}{SUFFIX}"))
    folder = os.environ.get(ENV_INDEX_DIR) or (
        str(job_index_dir(os.environ[ENV_JOB_DIR])) if os.environ.get(ENV_JOB_DIR) else None
    )
    if folder:
        digest = hashlib.sha256(path.encode()).hexdigest()[:16]
        places.append(Path(folder) / f"{digest}-{os.path.basename(path)}{SUFFIX}")
    return places


def _load(place: Path, kind: str, identity: str, size: int) -> Index | None:
    """The index kept at ``place`` if it is whole and of this very file, else None."""
    try:
        with np.load(place, allow_pickle=False) as kept:
            arrays = {name: kept[name] for name in kept.files}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        log.warning("%s: unreadable offset index, rebuilt (%s)", place, exc)
        return None
    header = (str(arrays.pop("kind", "")), str(arrays.pop("identity", "")))
    version = arrays.pop("version", np.int64(-1))
    offsets = arrays.get("offsets")
    if header != (kind, identity) or int(version) != VERSION or not _sound(offsets, size):
        log.info("%s: offset index of another file or version, rebuilt", place)
        return None
    return arrays


def _sound(offsets: np.ndarray | None, size: int) -> bool:
    return (
        offsets is not None
        and offsets.dtype == np.int64
        and offsets.ndim == 1
        and offsets.size > 0
        and int(offsets[-1]) == size
        and bool((np.diff(offsets) >= 0).all())
    )


def _store(place: Path, kind: str, identity: str, index: Index) -> bool:
    """Keep ``index`` at ``place`` (written whole, then renamed); False where it cannot be."""
    try:
        place.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{place.name}.", dir=place.parent)
    except OSError:
        return False
    try:
        os.chmod(temporary, 0o644)  # as a file written with open()
        kept: dict[str, Any] = {
            "kind": np.str_(kind), "identity": np.str_(identity), "version": np.int64(VERSION),
            **index,
        }  # fmt: skip
        with os.fdopen(handle, "wb") as out:
            np.savez(out, **kept)
        os.replace(temporary, place)
        return True
    except OSError as exc:
        log.info("%s: offset index not kept (%s)", place, exc)
        Path(temporary).unlink(missing_ok=True)
        return False
