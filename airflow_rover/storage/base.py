"""What a durable checkpoint store offers, and which URIs name one.

A store holds the same tree a job keeps under ``checkpoints/``: ``ckpt-<n>/ps-<i>.npz``,
``ckpt-<n>/queue.json`` and ``LATEST``, under a root named by a URI (``file:///path``, a plain
path, or ``s3://bucket/prefix``). Keys are ``/``-separated paths relative to that root. The
store only moves bytes; what makes a checkpoint whole (the order of publication, the checksums)
is ``storage.checkpoints``'s business, so every store gets the same guarantees.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

from airflow_rover.core.job_dir import checkpoint_number

ACCEPTED_URIS = "file:///path (or a plain path), s3://bucket/prefix"


class StorageError(RuntimeError):
    """A store could not be read or written (the message names the object and the cause)."""


class StorageAccessDenied(StorageError):
    """The credentials were refused: retrying will not help until they are fixed."""


@runtime_checkable
class CheckpointStore(Protocol):
    """A durable place for checkpoints; every ``key`` is relative to the store's root."""

    @property
    def uri(self) -> str:
        """The store's root, as a URI (never with credentials)."""
        ...

    def uri_of(self, key: str) -> str:
        """The URI of ``key`` (for XCom and logs)."""
        ...

    def put_file(self, local: Path, key: str) -> None:
        """Store the local file ``local`` at ``key``; the key holds the old object or the whole
        new one, never part of it."""
        ...

    def put_tree(self, local_dir: Path, prefix: str, skip: Collection[str] = ()) -> list[str]:
        """Store every file under ``local_dir`` (hidden temporaries and ``skip`` names
        excepted) below ``prefix``; returns the keys written, in upload order."""
        ...

    def put_bytes(self, key: str, data: bytes) -> None:
        """Store a small object (a manifest, a marker)."""
        ...

    def read_bytes(self, key: str) -> bytes | None:
        """A small object's content; None if there is none."""
        ...

    def get_file(self, key: str, local: Path) -> None:
        """Copy ``key`` to ``local`` (whole or not at all); raises ``StorageError`` if missing."""
        ...

    def list_objects(self, prefix: str = "") -> dict[str, int]:
        """Every object below ``prefix`` (recursively) and its size in bytes."""
        ...

    def list_checkpoints(self) -> list[str]:
        """The ``ckpt-<n>`` names at the root, committed or not, oldest first."""
        ...

    def delete(self, prefix: str) -> int:
        """Delete the object ``prefix`` and everything below it; returns how many went."""
        ...


@dataclass(frozen=True)
class StoreLocation:
    """A parsed checkpoint URI: a local directory, or an S3 bucket and key prefix."""

    scheme: str  # "file" or "s3"
    path: Path | None = None
    bucket: str = ""
    prefix: str = ""


def parse_checkpoint_uri(uri: str, param: str = "checkpoint_uri") -> StoreLocation:
    """``file:///path``, a plain path or ``s3://bucket/prefix``; anything else raises a
    ValueError naming ``param`` and what is accepted."""
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError(f"{param}={uri!r}: accepted: {ACCEPTED_URIS}")
    text = uri.strip()
    if "://" not in text:
        return StoreLocation("file", path=_no_climbing(param, uri, Path(text).expanduser()))
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise ValueError(
                f"{param}={uri!r}: a file URI names a local absolute path (file:///path); "
                f"accepted: {ACCEPTED_URIS}"
            )
        return StoreLocation("file", path=_no_climbing(param, uri, Path(parts.path)))
    if scheme == "s3":
        bucket = parts.netloc
        if not bucket or parts.query or parts.fragment:
            raise ValueError(f"{param}={uri!r}: no bucket; accepted: {ACCEPTED_URIS}")
        prefix = "/".join(p for p in parts.path.split("/") if p)
        if any(p in (".", "..") for p in prefix.split("/")):
            raise ValueError(f"{param}={uri!r}: '.' or '..' in the prefix")
        return StoreLocation("s3", bucket=bucket, prefix=prefix)
    raise ValueError(f"{param}={uri!r}: unsupported scheme {scheme!r}; accepted: {ACCEPTED_URIS}")


def _no_climbing(param: str, uri: str, path: Path) -> Path:
    """``path`` made absolute, refused if it names ``..`` (it would not be where it says)."""
    if ".." in path.parts:
        raise ValueError(f"{param}={uri!r}: '..' in the path; accepted: {ACCEPTED_URIS}")
    return path.absolute()


def check_key(key: str) -> str:
    """A key relative to the root, without empty, ``.`` or ``..`` segments (no escaping the
    root; ``a//b`` is refused, not read as ``a/b``)."""
    segments = key.split("/")
    if not key or "\0" in key or any(s in ("", ".", "..") for s in segments):
        raise ValueError(
            f"invalid store key {key!r}: a relative path without empty, '.' or '..' segments"
        )
    return key


def checkpoint_names(names: Collection[str]) -> list[str]:
    """The ``ckpt-<n>`` names among ``names``, oldest first."""
    found = [n for n in set(names) if checkpoint_number(n) is not None]
    return sorted(found, key=lambda n: checkpoint_number(n) or 0)


def is_hidden(name: str) -> bool:
    """Temporaries (``.ps-0.npz.tmp``) are never part of a checkpoint."""
    return name.startswith(".")


def tree_files(local_dir: Path, skip: Collection[str] = ()) -> list[tuple[Path, str]]:
    """The files under ``local_dir`` a tree upload stores, with their relative keys, sorted;
    hidden temporaries and names in ``skip`` (relative keys) are left out."""
    if not local_dir.is_dir():
        raise FileNotFoundError(f"{local_dir}: not a directory")
    found = []
    for path in sorted(local_dir.rglob("*")):
        rel = path.relative_to(local_dir)
        if path.is_file() and not any(is_hidden(p) for p in rel.parts):
            key = rel.as_posix()
            if key not in skip:
                found.append((path, key))
    return found


def put_tree(
    store: CheckpointStore, local_dir: Path, prefix: str, skip: Collection[str] = ()
) -> list[str]:
    """``CheckpointStore.put_tree`` for any store, one ``put_file`` per file."""
    written = []
    for path, rel in tree_files(local_dir, skip):
        key = f"{check_key(prefix)}/{rel}" if prefix else rel
        store.put_file(path, key)
        written.append(key)
    return written


__all__ = [
    "ACCEPTED_URIS",
    "CheckpointStore",
    "StorageAccessDenied",
    "StorageError",
    "StoreLocation",
    "check_key",
    "checkpoint_names",
    "is_hidden",
    "parse_checkpoint_uri",
    "put_tree",
    "tree_files",
]
