"""Errors that matter are not swallowed (issue 22, finding 8).

A disk that refuses an operation is simulated by replacing the one call that would fail
(running as root, permissions cannot make a delete fail here): the code must either raise or
leave the job in a state that is safe to go on from.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from airflow_rover.core import checkpoint_files, job_dir
from airflow_rover.core.checkpoint_files import fsync_path
from airflow_rover.core.job_dir import JobDir, atomic_write_text
from airflow_rover.core.policies.cpr import drop_partial_saves
from airflow_rover.storage import LocalStore, StorageError


def _failing_rmtree(path: Any, ignore_errors: bool = False, **_: Any) -> None:
    """A delete the disk refuses: raises, or does nothing when told to ignore errors."""
    if not ignore_errors:
        raise OSError(errno.EIO, "input/output error", str(path))


def test_partial_saves_that_cannot_be_deleted_are_never_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed delete used to be logged as done: the next restore applied those rows again.
    Now they are out of a restore's sight whatever the delete does."""
    job = JobDir(tmp_path / "job")
    (job.partial_dir(1, 1)).mkdir(parents=True)
    monkeypatch.setattr(shutil, "rmtree", _failing_rmtree)
    drop_partial_saves(job, "of the previous attempt")
    assert job.partial_dirs() == []


def test_a_partial_save_that_cannot_even_be_hidden_stops_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = JobDir(tmp_path / "job")
    (job.partial_dir(1, 1)).mkdir(parents=True)

    def refuse(src: Any, dst: Any) -> None:
        raise OSError(errno.EROFS, "read-only file system", str(src))

    monkeypatch.setattr(job_dir.os, "rename", refuse)
    with pytest.raises(OSError, match="read-only"):
        drop_partial_saves(job, "of the previous attempt")


def test_a_store_delete_that_fails_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalStore(tmp_path / "durable")
    (tmp_path / "durable" / "ckpt-000001").mkdir(parents=True)
    (tmp_path / "durable" / "ckpt-000001" / "ps-0.npz").write_bytes(b"x")
    monkeypatch.setattr(shutil, "rmtree", _failing_rmtree)
    with pytest.raises(StorageError, match="could not delete"):
        store.delete("ckpt-000001")


def test_an_atomic_write_that_fails_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(src: Any, dst: Any) -> None:
        raise OSError(errno.ENOSPC, "no space left on device", str(dst))

    monkeypatch.setattr(job_dir.os, "replace", refuse)
    with pytest.raises(OSError, match="no space"):
        atomic_write_text(tmp_path / "state.json", "{}")
    assert list(tmp_path.iterdir()) == []


def test_an_atomic_write_flushes_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flushed: list[Path] = []
    real = job_dir.fsync_path
    monkeypatch.setattr(job_dir, "fsync_path", lambda p: (flushed.append(p), real(p)))
    atomic_write_text(tmp_path / "state.json", "{}")
    assert flushed == [tmp_path] and (tmp_path / "state.json").read_text() == "{}"


def test_an_fsync_the_disk_refuses_is_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "part"
    path.write_bytes(b"x")

    def fsync(fd: int, error: int = errno.EIO) -> None:
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(checkpoint_files.os, "fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        fsync_path(path)
    with pytest.raises(OSError):
        fsync_path(tmp_path)  # a directory whose flush fails with EIO
    monkeypatch.setattr(checkpoint_files.os, "fsync", lambda fd: fsync(fd, errno.EINVAL))
    fsync_path(tmp_path)  # a file system that cannot fsync a directory: nothing to raise
