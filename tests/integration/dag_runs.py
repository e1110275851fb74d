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

from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.launchers.local_processes import job_processes

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


def end_dag_test(proc: subprocess.Popen[bytes] | None, job_dir: Path) -> None:
    """Stop the run if it is still going, then the job and any process it left."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    with contextlib.suppress(Exception):
        ElasticJobHook(job_dir).stop("test cleanup")
    for leftover in job_processes(job_dir):
        with contextlib.suppress(psutil.Error):
            leftover.kill()


def tail(path: Path, chars: int = 6000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else f"(no {path.name})"
