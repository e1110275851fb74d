"""A job directory's ``master.json`` and ``keeper.json`` outlive their processes, and their pids
may by then be other processes'. Stopping such a job, or asking whether it runs, must not touch
those: the records count only while pid, start time and command line match, and only for the
keeper or master of this directory. (Real jobs: ``test_hook_lifecycle.py``.)"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from airflow_rover.core.job_dir import JobDir, atomic_write_json
from airflow_rover.launchers.local import LocalBackend
from airflow_rover.launchers.local_processes import job_processes
from airflow_rover.launchers.process_identity import ProcessRecord


@pytest.fixture
def stranger() -> Iterator[psutil.Process]:
    """A process that is none of any job's, in a session of its own."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield psutil.Process(proc.pid)
    proc.kill()
    proc.wait()


def stale_records(stranger: psutil.Process) -> dict[str, dict[str, Any]]:
    """Records naming ``stranger``'s pid: as written before identities (pid alone), with the
    start time of an earlier process on that pid, and with the stranger's own identity."""
    own = ProcessRecord.of(stranger.pid)
    earlier = ProcessRecord(own.pid, own.started - 3600, own.cmdline)
    return {
        "pid only": {},
        "earlier process": {"identity": earlier.to_json()},
        "not this job's": {"identity": own.to_json()},
    }


@pytest.mark.parametrize("form", ["pid only", "earlier process", "not this job's"])
def test_a_stale_record_naming_another_process_stops_nothing(
    tmp_path: Path, stranger: psutil.Process, form: str
) -> None:
    """The stranger is neither taken for the job's master nor signalled when the job stops."""
    job_dir = JobDir(tmp_path / "job")
    record = stale_records(stranger)[form]
    master = {"address": "http://127.0.0.1:1", "pid": stranger.pid, "keeper_pid": stranger.pid}
    atomic_write_json(job_dir.master_file, {**master, **record})
    atomic_write_json(job_dir.keeper_file, {"pid": stranger.pid, "master_deaths": [], **record})
    backend = LocalBackend()
    backend.stop_master(job_dir)
    time.sleep(0.2)
    assert stranger.is_running() and stranger.status() != psutil.STATUS_ZOMBIE
    assert not backend.job_alive(job_dir)
    assert job_processes(job_dir.root) == []


def test_a_record_names_its_process_until_it_ends(stranger: psutil.Process) -> None:
    """A record read back from JSON finds its process, and nothing once the process ended."""
    record = ProcessRecord.from_json(ProcessRecord.of(stranger.pid).to_json())
    assert record is not None and record.process() == stranger
    stranger.kill()
    stranger.wait(5)
    assert record.process() is None
    assert ProcessRecord.from_json({"pid": stranger.pid}) is None
