"""The local launcher's memory limit (``launchers/memory_watch.py``): a node process whose
resident memory passes its size in the plan is killed and reported ``OOMKilled``; one within
its size, and a process the plan does not size, are left alone."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.spec import JobSpec, ResourcePlan
from airflow_rover.launchers.memory_watch import MemoryWatch
from airflow_rover.master.node_launcher import OOM_KILLED

HOLD = 'import sys, time; b = b"x" * (int(sys.argv[1]) * 2**20); time.sleep(30)'


def holding(mb: int) -> subprocess.Popen:
    """A real process that holds ``mb`` MB resident (every page written)."""
    return subprocess.Popen([sys.executable, "-c", HOLD, str(mb)])


def grown(procs: Iterable[subprocess.Popen], mb: int, within_s: float = 30.0) -> None:
    """Wait until every process holds ``mb`` MB."""
    deadline = time.monotonic() + within_s
    for proc in procs:
        while psutil.Process(proc.pid).memory_info().rss < mb * 2**20:
            assert time.monotonic() < deadline, "the processes did not grow"
            time.sleep(0.05)


def test_a_node_above_its_size_is_killed_out_of_memory(tmp_path: Path) -> None:
    job_dir = JobDir(tmp_path / "job")
    plan = ResourcePlan(num_workers=2, worker_memory_mb=256).with_size("worker-1", memory_mb=512)
    job_dir.write_spec(JobSpec(job_id="memory-test", train_data="/data", plan=plan))
    procs = {"worker-0": holding(300), "worker-1": holding(300), "data-0": holding(300)}
    watch = MemoryWatch(job_dir, lambda: procs)
    try:
        grown(procs.values(), 280)
        started = time.monotonic()
        watch.check()
        assert procs["worker-0"].wait(5) == -9  # SIGKILL: above its 256 MB
        print(f"killed in {time.monotonic() - started:.3f} s")
        assert watch.killed == {"worker-0": OOM_KILLED}
        assert procs["worker-1"].poll() is None  # 512 MB, its own size: within
        assert procs["data-0"].poll() is None  # not sized by the plan
        assert "killed out of memory (OOMKilled)" in job_dir.log_file("worker-0").read_text()
        watch.forget("worker-0")  # started again: its kill is history
        assert watch.killed == {}
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
