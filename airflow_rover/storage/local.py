"""``LocalStore``: checkpoints in a local (or mounted network) directory.

Every write goes to a hidden temporary sibling, is fsynced and renamed, and the directory is
fsynced: a name only ever holds a whole file, even after a crash, as in the job's own
``checkpoints/`` folder (which a ``LocalStore`` can read directly).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Collection
from pathlib import Path
from typing import BinaryIO

from airflow_rover.core.checkpoint_files import fsync_path
from airflow_rover.storage.base import (
    StorageError,
    check_key,
    checkpoint_names,
    is_hidden,
    put_tree,
)


class LocalStore:
    """A checkpoint store rooted at the local directory ``root`` (created on first write)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser().absolute()

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    @property
    def uri(self) -> str:
        return self.root.as_uri()

    def uri_of(self, key: str) -> str:
        return self._path(key).as_uri()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    # -- writing -----------------------------------------------------------------------------
    def put_file(self, local: Path, key: str) -> None:
        target = self._path(key)
        if target.exists() and target.samefile(local):
            return  # the store is the job's own checkpoints folder: nothing to copy
        self._atomic_write(target, lambda fh: _copy_into(local, fh))

    def put_tree(self, local_dir: Path, prefix: str, skip: Collection[str] = ()) -> list[str]:
        return put_tree(self, local_dir, prefix, skip)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._atomic_write(self._path(key), lambda fh: fh.write(data))

    def _atomic_write(self, target: Path, write: Callable[[BinaryIO], object]) -> None:
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise StorageError(f"{target}: could not write ({exc})") from exc
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_path(target.parent)

    # -- reading -----------------------------------------------------------------------------
    def read_bytes(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StorageError(f"{self.uri_of(key)}: unreadable ({exc})") from exc

    def get_file(self, key: str, local: Path) -> None:
        source = self._path(key)
        if not source.is_file():
            raise StorageError(f"{self.uri_of(key)}: no such object")
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.{os.getpid()}.tmp")
        try:
            shutil.copyfile(source, tmp)
            os.replace(tmp, local)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise StorageError(f"{self.uri_of(key)}: could not copy to {local} ({exc})") from exc

    def list_objects(self, prefix: str = "") -> dict[str, int]:
        base = self._path(prefix) if prefix else self.root
        if base.is_file():
            return {check_key(prefix): base.stat().st_size}
        if not base.is_dir():
            return {}
        found: dict[str, int] = {}
        for path in base.rglob("*"):
            rel = path.relative_to(self.root)
            if not any(is_hidden(p) for p in rel.parts):
                try:
                    if path.is_file():
                        found[rel.as_posix()] = path.stat().st_size
                except FileNotFoundError:  # removed while listing
                    continue
        return found

    def list_checkpoints(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return checkpoint_names([p.name for p in self.root.iterdir() if p.is_dir()])

    def delete(self, prefix: str) -> int:
        target = self._path(prefix)
        if target.is_dir():
            count = sum(1 for p in target.rglob("*") if p.is_file())
            try:
                shutil.rmtree(target)
            except OSError as exc:
                raise StorageError(f"{target}: could not delete it ({exc})") from exc
            return count
        if target.exists():
            target.unlink(missing_ok=True)
            return 1
        return 0


def _copy_into(source: Path, fh: BinaryIO) -> None:
    try:
        with open(source, "rb") as src:
            shutil.copyfileobj(src, fh, length=8 << 20)
    except FileNotFoundError:
        raise StorageError(f"{source}: missing (removed before it was stored?)") from None
