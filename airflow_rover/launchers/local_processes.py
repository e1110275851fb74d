"""The processes of a job on the local launcher, each proven to be this job's before anything
signals it.

A job's keeper and master run ``python -m <keeper or master module> --job-dir DIR``; its nodes
(PS, workers, the evaluator, a spare PS) run a node module with ``ROVER_JOB_DIR=DIR`` and a
``ROVER_NODE_ID`` in their environment. Found that way, they are found even after the keeper or
the master was killed (``stop_job`` stops them all), and a ``master.json`` or ``keeper.json``
naming a pid that another process holds by now reaches nothing: their records
(``process_identity.ProcessRecord``) count only while pid, start time and command line still
match and the command line is this job's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

import psutil

from airflow_rover.core.job_dir import ENV_JOB_DIR, ENV_NODE_ID, JobDir
from airflow_rover.launchers.base import KEEPER_MODULE, ROLE_MODULES
from airflow_rover.launchers.keeper import MASTER_PROCESS_MODULE
from airflow_rover.launchers.process_identity import ProcessRecord, running

STOP_GRACE_S = 10.0
_POLL_S = 0.05


class JobRole(StrEnum):
    KEEPER = "keeper"
    MASTER = "master"
    NODE = "node"


_ROLE_OF_MODULE = {
    KEEPER_MODULE: JobRole.KEEPER,
    MASTER_PROCESS_MODULE: JobRole.MASTER,
    **{module: JobRole.NODE for module in ROLE_MODULES.values()},
}


def _argument(cmdline: Sequence[str], flag: str) -> str | None:
    """The value after ``flag`` in ``cmdline`` (None without it)."""
    for i, arg in enumerate(cmdline[:-1]):
        if arg == flag:
            return cmdline[i + 1]
    return None


def _is_dir(path: str | None, job_dir: Path) -> bool:
    return path is not None and Path(path).resolve() == job_dir.resolve()


def role_of(cmdline: Sequence[str]) -> JobRole | None:
    """What a process of some local job runs as, by its command line (None: not a job's)."""
    module = _argument(cmdline, "-m")
    return _ROLE_OF_MODULE.get(module) if module else None


def runs_master_of(cmdline: Sequence[str], job_dir: Path) -> bool:
    """Whether ``cmdline`` runs the keeper or the master of the job in ``job_dir``."""
    role = role_of(cmdline)
    return role in (JobRole.KEEPER, JobRole.MASTER) and _is_dir(
        _argument(cmdline, "--job-dir"), job_dir
    )


def _role_in_job(proc: psutil.Process, job_dir: Path) -> JobRole | None:
    cmdline = proc.cmdline()
    role = role_of(cmdline)
    if role is JobRole.NODE:
        env = proc.environ()
        return role if env.get(ENV_NODE_ID) and _is_dir(env.get(ENV_JOB_DIR), job_dir) else None
    return role if runs_master_of(cmdline, job_dir) else None


def job_process_roles(job_dir: Path) -> list[tuple[psutil.Process, JobRole]]:
    """Every running process of the local job in ``job_dir``, orphaned ones included, with
    what it runs as."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            role = _role_in_job(proc, job_dir)
            if role is not None and proc.pid != os.getpid() and running(proc):
                found.append((proc, role))
    return found


def job_processes(job_dir: Path) -> list[psutil.Process]:
    """Every running process of the local job in ``job_dir``, orphaned ones included."""
    return [proc for proc, _ in job_process_roles(job_dir)]


def recorded_process(info: dict[str, Any], job_dir: JobDir) -> psutil.Process | None:
    """The process ``info`` (a ``master.json`` or ``keeper.json``) records under
    ``identity``, if it still runs as recorded and as the keeper or master of this job."""
    record = ProcessRecord.from_json(info.get("identity"))
    if record is None or not runs_master_of(record.cmdline, job_dir.root):
        return None
    return record.process()


def recorded_masters(job_dir: JobDir) -> list[psutil.Process]:
    """The job's keeper and master as they recorded themselves, those still running."""
    keeper_info = job_dir.read_json(job_dir.keeper_file) or {}
    found = (recorded_process(info, job_dir) for info in (keeper_info, job_dir.master_info()))
    return [proc for proc in found if proc is not None]


def node_processes(job_dir: JobDir) -> dict[str, psutil.Process]:
    """The running master's node processes, by node id (their ``ROVER_NODE_ID``)."""
    master = recorded_process(job_dir.master_info(), job_dir)
    if master is None:
        return {}
    out = {}
    with contextlib.suppress(psutil.Error):
        for child in master.children():
            with contextlib.suppress(psutil.Error):
                node = child.environ().get(ENV_NODE_ID)
                if node and running(child):
                    out[node] = child
    return out


def stop_job(job_dir: JobDir, grace_s: float = STOP_GRACE_S) -> None:
    """Stop every process of the job: SIGTERM to its keeper (which passes it to the master, and
    the master stops its nodes), or to its master where the keeper is gone, or to its nodes
    where both are; SIGKILL to whatever of the job is left after ``grace_s``."""
    found = job_process_roles(job_dir.root)
    if not found:
        return
    by_role = {role: [proc for proc, of in found if of is role] for role in JobRole}
    for proc in by_role[JobRole.KEEPER] or by_role[JobRole.MASTER] or by_role[JobRole.NODE]:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    left = _still_running([proc for proc, _ in found], grace_s)
    if left:
        _kill(left, job_dir)


def _still_running(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of ``procs`` still running after up to ``timeout_s`` (a zombie has ended: its
    parent may not reap it soon, nor ever if it is the caller's forgotten child)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [proc for proc in procs if running(proc)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(_POLL_S)


def _kill(procs: list[psutil.Process], job_dir: JobDir) -> None:
    """SIGKILL ``procs`` (this job's, checked) and the process group of the job's keeper, where
    one of them is in it: the keeper starts a session of its own, so nothing but the job is."""
    keeper = ProcessRecord.from_json((job_dir.read_json(job_dir.keeper_file) or {}).get("identity"))
    groups = set()
    for proc in procs:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(proc.pid))
    if keeper is not None and keeper.pid in groups and keeper.pid != os.getpgrp():
        with contextlib.suppress(OSError):
            os.killpg(keeper.pid, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
