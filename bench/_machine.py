"""Is the machine quiet enough to time a run on? Load average and how busy the cores are now.

The 1-minute load average lags (a run of this bench still shows in it a minute later), so the
cores' busy share is also sampled (``psutil.cpu_times``) over a second while the bench itself
is idle: what other processes use right now.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Quiet:
    """How busy the machine is, and whether that is quiet enough to time a run."""

    load: float  # 1-minute load average
    busy_cores: float  # cores other processes kept busy over the sample
    quiet: bool

    def describe(self) -> str:
        return f"load average {self.load:.2f}, {self.busy_cores:.2f} cores busy"


def busy_cores(sample_s: float = 1.0) -> float:
    """Cores busy over the next ``sample_s`` seconds (this process sleeps meanwhile)."""
    t0, busy0 = time.monotonic(), _busy_seconds()
    time.sleep(sample_s)
    return (_busy_seconds() - busy0) / max(time.monotonic() - t0, 1e-9)


def check(max_load: float, max_busy: float, sample_s: float = 1.0) -> Quiet:
    load = os.getloadavg()[0]
    busy = busy_cores(sample_s)
    quiet = load <= max_load and busy <= max_busy
    return Quiet(load, busy, quiet)


def wait_quiet(max_load: float, max_busy: float, wait_s: float, poll_s: float = 5.0) -> Quiet:
    """Wait up to ``wait_s`` seconds for a quiet machine; returns the last check (its
    ``quiet`` False when the wait ran out)."""
    deadline = time.monotonic() + wait_s
    state = check(max_load, max_busy)
    while not state.quiet and time.monotonic() < deadline:
        time.sleep(poll_s)
        state = check(max_load, max_busy)
    return state


ROLES = (  # a job process's role, from its command line
    ("airflow_rover.worker", "worker"),
    ("airflow_rover.ps", "ps"),
    ("airflow_rover.dataworker", "data worker"),
    ("airflow_rover.launchers", "master"),
)


def _role(proc: psutil.Process, root: int) -> str:
    if proc.pid == root:
        return "bench child"
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return "other"
    for needle, role in ROLES:
        if needle in cmd:
            return "evaluator" if "--role evaluator" in cmd else role
    return "other"


class CpuMonitor:
    """CPU seconds used by a process tree (by role: a rover job's master, PS, workers) and by
    the whole machine while a run goes on, sampled every ``period_s``: what the run used, and
    how many cores other processes kept busy meanwhile (the machine's busy time less the run's).
    A process's CPU after its last sample is missed (at most ``period_s`` of it)."""

    def __init__(self, root: int, period_s: float = 0.25) -> None:
        self.root = root
        self.period_s = period_s
        self._used: dict[int, tuple[str, float]] = {}  # pid: (role, CPU seconds)
        self._before: dict[int, float] = {}  # pid: CPU seconds it had used before the run
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-monitor", daemon=True)
        self._start = (time.monotonic(), _busy_seconds())
        self._started_at = time.time()

    def __enter__(self) -> CpuMonitor:
        self._start = (time.monotonic(), _busy_seconds())
        self._started_at = time.time()
        self._sample()  # what the processes already there had used is not the run's
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._end = (time.monotonic(), _busy_seconds())

    def _sample(self) -> None:
        try:
            root = psutil.Process(self.root)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for proc in procs:
            try:
                times = proc.cpu_times()
                used = times.user + times.system
            except psutil.Error:
                continue
            # Read each time: a fork is its parent until it execs; an exited one has no
            # command line left, so it keeps the role it had.
            role = _role(proc, self.root)
            if role == "other" and proc.pid in self._used:
                role = self._used[proc.pid][0]
            if proc.pid not in self._before:
                self._before[proc.pid] = used if self._existed_before(proc) else 0.0
            self._used[proc.pid] = (role, used - self._before[proc.pid])

    def _existed_before(self, proc: psutil.Process) -> bool:
        try:
            return bool(proc.create_time() < self._started_at)
        except psutil.Error:
            return False

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def by_role(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for role, used in self._used.values():
            out[role] = out.get(role, 0.0) + used
        return out

    def other_cores(self) -> float:
        """Cores the machine's other processes kept busy, on average, over the run."""
        wall = self._end[0] - self._start[0]
        busy = self._end[1] - self._start[1]
        ours = sum(used for _, used in self._used.values())
        return max(0.0, busy - ours) / wall if wall > 0 else 0.0


def _busy_seconds() -> float:
    times = psutil.cpu_times()
    return (
        times.user
        + times.system
        + times.nice
        + getattr(times, "irq", 0.0)
        + getattr(times, "softirq", 0.0)
    )
