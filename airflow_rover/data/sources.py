"""Where a dataset's files are: a directory, a glob or a single file, locally (a plain path or
``file://``) or on S3 (``s3://bucket/prefix``, ``data.s3_files``), in the dataset's index
order (``docs/data-formats.md``).

Files are sorted by path, so every process of a job sees the same global row order; names
starting with ``_`` or ``.`` (``_SUCCESS``, ``.crc``) are skipped, and so is every file below
such a folder under the named path (a Spark job's ``_temporary/`` while it writes).
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

from airflow_rover.core.spec import JobSpec

S3_SCHEME = "s3://"

EXTENSIONS = {
    "parquet": (".parquet", ".parq"),
    "tfrecord": (".tfrecord", ".tfrecords", ".tfrec"),
    "csv": (".csv", ".csv.gz"),
}
_GLOB_CHARS = "*?["


class NoDataFiles(ValueError):
    """The path names no data file of a known format."""


def local_path(uri: str) -> str:
    """``uri`` without its ``file://`` scheme; other schemes are refused by name."""
    if uri.startswith("file://"):
        return uri[len("file://") :]
    if "://" in uri:
        scheme = uri.split("://", 1)[0]
        raise ValueError(
            f"{uri}: scheme {scheme}:// is not supported; accepted: a path, file://, s3://"
        )
    return uri


def format_of(name: str) -> str | None:
    """The format a file's extension names, or None."""
    lowered = name.lower()
    for fmt, extensions in EXTENSIONS.items():
        if lowered.endswith(extensions):
            return fmt
    return None


def _hidden(path: str, root: str) -> bool:
    """Whether ``path``, below ``root``, has a name or a folder starting with ``_`` or ``.``."""
    below = path[len(root) :] if path.startswith(root) else os.path.basename(path)
    return any(part.startswith(("_", ".")) for part in below.split("/") if part)


def _root(uri: str) -> str:
    """The part of ``uri`` every file it names lies below: itself, or a glob's fixed folder."""
    at = min((uri.index(c) for c in _GLOB_CHARS if c in uri), default=-1)
    return uri if at < 0 else uri[: uri.rfind("/", 0, at) + 1]


def list_files(uri: str) -> list[str]:
    """The data files ``uri`` names (any format, hidden ones skipped), sorted; ValueError
    naming ``uri`` when there is none."""
    if uri.startswith(S3_SCHEME):
        from airflow_rover.data.s3_files import list_objects

        root = _root(uri)
        objects = [o.uri for o in list_objects(uri) if not _hidden(o.uri, root) and o.size > 0]
        if not objects:
            raise NoDataFiles(f"{uri}: no data files found")
        return objects
    path = local_path(uri)
    if any(c in path for c in _GLOB_CHARS):
        found = [p for p in glob.glob(path, recursive=True) if os.path.isfile(p)]
    elif os.path.isdir(path):
        found = [str(p) for p in Path(path).rglob("*") if p.is_file()]
    elif os.path.isfile(path):
        return [path]
    else:
        raise NoDataFiles(f"{uri} does not exist")
    root = _root(path)
    files = sorted(p for p in found if not _hidden(p, root))
    if not files:
        raise NoDataFiles(f"{uri}: no data files found")
    return files


def files_of_format(uri: str, data_format: str) -> tuple[str, list[str]]:
    """``(format, files)``: with ``data_format="auto"`` the one format of the files'
    extensions (two formats mixed, or none known, are refused naming files); else the files
    with that format's extensions, or every file when none has one (``part-00000``)."""
    files = list_files(uri)
    if data_format != "auto":
        matching = [f for f in files if format_of(f) == data_format]
        return data_format, matching or [f for f in files if format_of(f) is None] or files
    by_format: dict[str, str] = {}
    for file in files:
        fmt = format_of(file)
        if fmt is not None:
            by_format.setdefault(fmt, file)
    if not by_format:
        raise NoDataFiles(
            f"{uri}: no file with a known extension ({_known()}) and no manifest.json; name "
            "the format with data_format"
        )
    if len(by_format) > 1:
        shown = ", ".join(f"{fmt} ({file})" for fmt, file in sorted(by_format.items()))
        raise ValueError(f"{uri}: files of several formats: {shown}; a dataset has one format")
    fmt = next(iter(by_format))
    return fmt, [f for f in files if format_of(f) == fmt]


def _known() -> str:
    return ", ".join(ext for extensions in EXTENSIONS.values() for ext in extensions)


def file_stamps(uri: str) -> list[str]:
    """What tells a rewritten file from the same one, for each file ``uri`` names: locally
    ``path:size:mtime_ns``, on S3 ``uri:size:etag``."""
    if uri.startswith(S3_SCHEME):
        from airflow_rover.data.s3_files import list_objects

        files = set(list_files(uri))
        return [f"{o.uri}:{o.size}:{o.etag}" for o in list_objects(uri) if o.uri in files]
    stamps = []
    for file in list_files(uri):
        stat = os.stat(file)
        stamps.append(f"{file}:{stat.st_size}:{stat.st_mtime_ns}")
    return stamps


def open_binary(path: str) -> Any:
    """A binary file on ``path`` (local, or ``s3://``: ranged GETs), with read and seek."""
    if path.startswith(S3_SCHEME):
        from airflow_rover.data.s3_files import open_input

        return open_input(path)
    return open(path, "rb")


def open_source(path: str) -> Any:
    """What a reader opens ``path`` as: a local path, or a random-access file on S3."""
    if path.startswith(S3_SCHEME):
        from airflow_rover.data.s3_files import open_input

        return open_input(path)
    return path


def reads_s3(spec: JobSpec) -> bool:
    """Whether the job reads a split from S3 (its workers and evaluator then need the
    credentials the master has)."""
    return any(p is not None and p.startswith(S3_SCHEME) for p in (spec.train_data, spec.eval_data))
