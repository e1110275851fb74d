"""What one running local job does, read from outside it: its workers' progress reports (the
master's status), its node processes' CPU time (psutil, by pid) and when each node started and
became ready (the master's log). ``bench/measure_world.py`` builds its table from these."""

from __future__ import annotations

import contextlib
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from airflow_rover.core.job_dir import ENV_NODE_ID, JobDir

_LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"
_STARTED = re.compile(r"^(\S+ \S+) INFO \S+ started (\S+) \((\w+)\) pid=(\d+)")
_READY = re.compile(r"^(\S+ \S+) INFO \S+ node (\S+) ready")
_LISTENING = re.compile(r"^(\S+ \S+) INFO \S+ master of job \S+ listening on")


@dataclass
class Beat:
    """One progress report of one worker, as first seen by a status poll."""

    seen_at: float  # time.time() of the poll that first saw it
    steps: int
    step_time_ms: float  # the worker's moving average over its last ~10 steps


@dataclass
class Progress:
    """Every distinct progress report of each worker, in order."""

    beats: dict[str, list[Beat]] = field(default_factory=dict)

    def add(self, status: dict[str, Any], now: float) -> None:
        for node in status.get("nodes", []):
            if node["role"] != "worker" or node["steps"] <= 0:
                continue
            seen = self.beats.setdefault(node["id"], [])
            if not seen or node["steps"] != seen[-1].steps:
                seen.append(Beat(now, node["steps"], node["step_time_ms"]))

    def between(self, start: float, end: float) -> dict[str, list[Beat]]:
        return {w: [b for b in bs if start <= b.seen_at <= end] for w, bs in self.beats.items()}

    def iteration_s(self, start: float, end: float) -> dict[str, float]:
        """Each worker's wall seconds per step over the window (first to last report in it)."""
        out = {}
        for worker, beats in self.between(start, end).items():
            if len(beats) >= 2 and beats[-1].steps > beats[0].steps:
                first, last = beats[0], beats[-1]
                out[worker] = (last.seen_at - first.seen_at) / (last.steps - first.steps)
        return out

    def reported_rel_sd(self, start: float, end: float) -> float:
        """Relative sd of one reported step time: each report over its worker's mean, pooled."""
        ratios = []
        for beats in self.between(start, end).values():
            times = [b.step_time_ms for b in beats]
            if len(times) >= 2:
                mean = statistics.fmean(times)
                ratios += [t / mean for t in times]
        return statistics.stdev(ratios) if len(ratios) >= 3 else float("nan")

    def reported_mean_s(self, start: float, end: float) -> float:
        times = [b.step_time_ms for bs in self.between(start, end).values() for b in bs]
        return statistics.fmean(times) / 1000.0 if times else float("nan")


def node_processes(job_dir: JobDir) -> dict[str, psutil.Process]:
    """The master's node processes by node id (from the id the launcher put in their
    environment)."""
    pid = job_dir.master_info().get("pid")
    if pid is None:
        return {}
    found = {}
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children():
            with contextlib.suppress(psutil.Error, KeyError):
                found[child.environ()[ENV_NODE_ID]] = child
    return found


def cpu_seconds(procs: dict[str, psutil.Process]) -> dict[str, float]:
    """User + system CPU seconds each process has used so far (all its threads)."""
    out = {}
    for node_id, proc in procs.items():
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            out[node_id] = times.user + times.system
    return out


def master_cpu_seconds(job_dir: JobDir) -> float | None:
    pid = job_dir.master_info().get("pid")
    try:
        times = psutil.Process(pid).cpu_times() if pid else None
    except psutil.Error:
        return None
    return times.user + times.system if times else None


@dataclass(frozen=True)
class NodeTimes:
    """When a node's process was started by the master and when it reported ready."""

    role: str
    started: float
    ready: float | None


def _stamp(text: str) -> float:
    return datetime.strptime(text, _LOG_TIME).timestamp()


def master_timeline(log_file: Path) -> tuple[float | None, dict[str, NodeTimes]]:
    """When the master listened, and each node's first start and ready (the master's log)."""
    listening: float | None = None
    started: dict[str, tuple[str, float]] = {}
    ready: dict[str, float] = {}
    for line in log_file.read_text(errors="replace").splitlines():
        if listening is None and (m := _LISTENING.match(line)):
            listening = _stamp(m.group(1))
        elif m := _STARTED.match(line):
            started.setdefault(m.group(2), (m.group(3), _stamp(m.group(1))))
        elif m := _READY.match(line):
            ready.setdefault(m.group(2), _stamp(m.group(1)))
    nodes = {n: NodeTimes(role, at, ready.get(n)) for n, (role, at) in started.items()}
    return listening, nodes


def poll_until(
    status: Callable[[], dict[str, Any]],
    progress: Progress,
    done: Callable[[dict[str, Any]], bool],
    timeout_s: float,
    every_s: float = 0.2,
) -> dict[str, Any]:
    """Poll the status (recording progress) until ``done`` says so; raise past ``timeout_s``
    or if the job ended."""
    deadline = time.monotonic() + timeout_s
    while True:
        now_status = status()
        progress.add(now_status, time.time())
        if done(now_status):
            return now_status
        if now_status.get("state") in ("succeeded", "failed", "stopped"):
            raise RuntimeError(f"the job ended ({now_status.get('state')}) while measured")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done after {timeout_s:.0f} s: {now_status.get('state')}")
        time.sleep(every_s)
