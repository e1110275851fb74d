"""Show a demo run's progress while ``airflow dags test`` runs: each task as it starts, then the
training job's state, samples, shards and samples/s every few seconds, until the run's process
ends. The job's status comes from its master (``/status``), or its mirrored ``state.json``."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.job_status import ABSENT, progress_line
from airflow_rover.launchers.local import local_job_status

TASK_STARTED = re.compile(r"\[DAG TEST\] starting task_id=(\S+)")


def running(pid: int) -> bool:
    """Whether the run's process lives (a zombie waiting for the shell counts as ended)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def started_tasks(log: Path) -> list[str]:
    """The tasks the run started so far, in order (a retry starts a task again)."""
    if not log.exists():
        return []
    return TASK_STARTED.findall(log.read_text(errors="replace"))


def job_status(job_dir: JobDir, since: float) -> dict[str, Any] | None:
    """The status of the job this run launched (None before it has one: a job left in the
    folder by an earlier run of the date does not count)."""
    if not job_dir.root.exists():
        return None
    status = local_job_status(job_dir, timeout_s=2.0)
    started = status.get("started_at")
    if status.get("state") == ABSENT or not isinstance(started, (int, float)) or started < since:
        return None
    return status


class Progress:
    """What was printed already: only what changed is printed again."""

    def __init__(self, log: Path, job_dir: JobDir, since: float) -> None:
        self.log, self.job_dir, self.since = log, job_dir, since
        self.tasks = 0
        self.line: str | None = None

    def show(self) -> None:
        stamp = time.strftime("%H:%M:%S")
        tasks = started_tasks(self.log)
        for task in tasks[self.tasks :]:
            print(f"  {stamp} task {task} started", flush=True)
        self.tasks = len(tasks)
        status = job_status(self.job_dir, self.since)
        line = progress_line(status) if status is not None else None
        if line is not None and line != self.line:
            print(f"  {stamp} training job: {line}", flush=True)
        self.line = line or self.line


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", type=Path, required=True, help="the run's output")
    parser.add_argument("--job-dir", type=Path, required=True, help="the train task's job")
    parser.add_argument("--pid", type=int, required=True, help="the airflow dags test process")
    parser.add_argument("--since", type=float, required=True, help="epoch seconds of the start")
    parser.add_argument("--interval", type=float, default=3.0)
    args = parser.parse_args()
    progress = Progress(args.log, JobDir(args.job_dir), args.since)
    while running(args.pid):
        try:
            progress.show()
        except Exception as exc:  # a status read between two writes: next time
            print(f"  (progress unavailable: {type(exc).__name__}: {exc})", file=sys.stderr)
        time.sleep(args.interval)
    progress.show()
    return 0


if __name__ == "__main__":
    sys.exit(main())
