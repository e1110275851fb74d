"""What the master says of the job: its status (``GET /status``), mirrored to ``state.json`` so
the outcome stays readable after the master has exited, and the job's throughput."""

from __future__ import annotations

import collections
import os
import time
from typing import Any

from airflow_rover.core.job_dir import JobDir, atomic_write_json
from airflow_rover.master.nodes import NodeSet

THROUGHPUT_WINDOW_S = 10.0
STATE_MIRROR_INTERVAL_S = 2.0


class Throughput:
    """Samples/s the workers trained over the last ``THROUGHPUT_WINDOW_S``."""

    def __init__(self) -> None:
        self._log: collections.deque[tuple[float, int]] = collections.deque()

    def record(self, nodes: NodeSet) -> None:
        now = time.time()
        self._log.append((now, sum(nodes.worker_samples().values())))
        while self._log and self._log[0][0] < now - THROUGHPUT_WINDOW_S:
            self._log.popleft()

    def rate(self) -> float:
        if len(self._log) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self._log[0], self._log[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0


class StateMirror:
    """Writes the status to ``state.json`` (atomically) on every phase change and now and
    then, as long as no newer master (a relaunch) took the job directory over."""

    def __init__(self, job_dir: JobDir) -> None:
        self.job_dir = job_dir
        self._last = 0.0

    def owns_job_dir(self) -> bool:
        """False once another master (a relaunch) has announced itself in this job dir."""
        announced = self.job_dir.master_info()
        return not announced or announced.get("pid") == os.getpid()

    def due(self, force: bool = False) -> bool:
        """Whether to write the status now (it is built only then)."""
        due = force or time.time() - self._last >= STATE_MIRROR_INTERVAL_S
        return due and self.owns_job_dir()

    def write(self, status: dict[str, Any]) -> None:
        atomic_write_json(self.job_dir.state_file, status)
        self._last = time.time()
