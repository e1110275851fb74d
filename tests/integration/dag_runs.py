"""Running a fixture DAG with ``dag.test()`` in a subprocess (``run_dag.py``) while a test
watches and kills the job's processes, and cleaning up after it whatever happened."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from airflow_rover.core.layout import ENV_JOB_DIR, ENV_NODE_ID, JobLayout
from airflow_rover.hooks.elastic_job import ElasticJobHook

RUN_DAG = Path(__file__).with_name("run_dag.py")


def start_dag_test(
    dag_id: str,
    logical_date: str,
    conf: dict[str, Any],
    out: Path,
    log_path: Path,
    env: dict[str, str],
) -> subprocess.Popen[bytes]:
    """``dag.test()`` of ``dag_id`` in its own process (its own AIRFLOW_HOME through ``env``);
    the outcome goes to ``out`` as JSON, the output to ``log_path``."""
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [
                *(sys.executable, str(RUN_DAG), dag_id, logical_date),
                *("--conf", json.dumps(conf), "--out", str(out)),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def end_dag_test(proc: subprocess.Popen[bytes], job_dir: Path) -> None:
    """Stop the run if it is still going, then the job and any process it left."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    with contextlib.suppress(Exception):
        ElasticJobHook(job_dir).stop("test cleanup")
    for leftover in processes_of(job_dir):
        with contextlib.suppress(psutil.Error):
            leftover.kill()


def tail(path: Path, chars: int = 6000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else f"(no {path.name})"


def node_processes(layout: JobLayout) -> dict[str, psutil.Process]:
    """The running master's node processes, by node id (their ``ROVER_NODE_ID``)."""
    pid = layout.master_info().get("pid")
    if pid is None:
        return {}
    out = {}
    try:
        for child in psutil.Process(pid).children():
            with contextlib.suppress(psutil.Error):
                node = child.environ().get(ENV_NODE_ID)
                if node and child.status() != psutil.STATUS_ZOMBIE:
                    out[node] = child
    except psutil.Error:
        return {}
    return out


def processes_of(job_dir: Path) -> list[psutil.Process]:
    """Every process of the job, even orphaned ones: keeper and master (``--job-dir``
    argument) and nodes (``ROVER_JOB_DIR`` environment)."""
    paths = {str(job_dir), str(job_dir.resolve())}
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if paths & set(proc.cmdline()) or proc.environ().get(ENV_JOB_DIR) in paths:
                found.append(proc)
    return found
