"""The local launcher's memory limit: each PS, worker and evaluator process may hold as much
resident memory as the plan sizes it (``ResourcePlan.size_of``), as a pod's memory limit on
Kubernetes. The kubelet's OOM kill is the kernel's, at once; here a thread samples each node's
RSS every ``interval_s`` and SIGKILLs one above its size, recording ``OOMKilled`` as its exit
reason. A node that allocates faster than the sampling may overshoot by what it allocates in
one interval. ``RLIMIT_AS`` is not used: TensorFlow reserves far more address space than it
touches."""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable

import psutil

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.spec import node_role_index
from airflow_rover.master.node_launcher import OOM_KILLED

log = logging.getLogger(__name__)

MEMORY_WATCH_S = 0.5


class MemoryWatch:
    """Kills a node whose resident memory is above its size in the job's plan."""

    def __init__(
        self,
        job_dir: JobDir,
        procs: Callable[[], dict[str, subprocess.Popen]],
        interval_s: float = MEMORY_WATCH_S,
    ) -> None:
        self.job_dir = job_dir
        self._procs = procs
        self.interval_s = interval_s
        self.killed: dict[str, str] = {}  # node -> why it was killed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start watching (once; a no-op while the thread runs)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="memory-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def forget(self, node_id: str) -> None:
        """The node starts again: its earlier process's kill is history."""
        self.killed.pop(node_id, None)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except Exception:  # the watch must outlive a bad read; the next one may do
                log.exception("memory watch: a check failed")

    def check(self) -> None:
        """One look at every running node; kill those above their size."""
        try:
            plan = self.job_dir.read_spec().plan
        except (OSError, ValueError):
            return  # the spec is being rewritten: next time
        for node_id, proc in self._procs().items():
            try:
                node_role_index(node_id)
            except ValueError:
                continue  # not sized by the plan (a data worker)
            if proc.poll() is not None:
                continue
            try:
                rss_mb = psutil.Process(proc.pid).memory_info().rss / 2**20
            except psutil.Error:
                continue
            limit_mb = plan.size_of(node_id)[1]
            if rss_mb > limit_mb:
                self._kill(node_id, proc, rss_mb, limit_mb)

    def _kill(self, node_id: str, proc: subprocess.Popen, rss_mb: float, limit_mb: int) -> None:
        self.killed[node_id] = OOM_KILLED
        proc.kill()
        message = (
            f"[{node_id}: killed out of memory (OOMKilled): {rss_mb:.0f} MB resident, "
            f"above its {limit_mb} MB]"
        )
        log.warning(message)
        path = self.job_dir.log_file(node_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as fh:
                fh.write(message + "\n")
        except OSError:
            pass
