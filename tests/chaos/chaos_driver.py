"""A chaos driver: SIGKILLs a running local job's workers, PS and master at seeded random times
and measures how long each kind of node takes to come back.

Used by ``tests/chaos`` (small scale, in CI).
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from airflow_rover.core.job_dir import ENV_NODE_ID, JobDir
from airflow_rover.core.states import TERMINAL_STATES
from airflow_rover.launchers.local import local_job_status

KIND_WEIGHTS = {"worker": 0.6, "ps": 0.25, "master": 0.15}


@dataclass
class Kill:
    at_s: float  # since the driver started
    kind: str
    node: str
    pid: int
    recovered_s: float | None = None  # kill to the node (or, for the master, training) back


@dataclass
class ChaosReport:
    status: dict[str, Any]
    kills: list[Kill] = field(default_factory=list)

    def recovery_seconds(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for kill in self.kills:
            if kill.recovered_s is not None:
                out.setdefault(kill.kind, []).append(round(kill.recovered_s, 2))
        return out


def job_processes(layout: JobDir) -> dict[str, psutil.Process]:
    """The master and its node processes, by node id ("master" for the master)."""
    pid = layout.master_info().get("pid")
    if pid is None:
        return {}
    try:
        master = psutil.Process(pid)
        out = {"master": master}
        for child in master.children():
            node = child.environ().get(ENV_NODE_ID)
            if node and child.status() != psutil.STATUS_ZOMBIE:
                out[node] = child
        return out
    except psutil.Error:
        return {}


class ChaosDriver:
    """Kill ``kills`` random nodes of a running job, one every ``gap_s`` seconds of training."""

    def __init__(
        self,
        layout: JobDir,
        seed: int,
        kills: int,
        gap_s: tuple[float, float] = (1.0, 2.5),
        weights: dict[str, float] | None = None,
        may_kill: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        """``may_kill(status)``: whether the job may lose a node now (default: it is running;
        an ECRM job also needs its last lost PS rebuilt, as it recovers one at a time)."""
        self.layout = layout
        self.rng = random.Random(seed)
        self.target = kills
        self.gap_s = gap_s
        self.weights = weights or KIND_WEIGHTS
        self.may_kill = may_kill or (lambda status: status.get("state") == "running")

    def run(self, timeout_s: float) -> ChaosReport:
        start = time.monotonic()
        report = ChaosReport(status={})
        next_kill = start + self.rng.uniform(*self.gap_s)
        while time.monotonic() - start < timeout_s:
            status = local_job_status(self.layout, timeout_s=2.0)
            report.status = status
            if status.get("state") in TERMINAL_STATES:
                return report
            procs = job_processes(self.layout)
            now = time.monotonic()
            self._mark_recoveries(report, status, procs, now - start)
            if len(report.kills) < self.target and now >= next_kill and self.may_kill(status):
                kill = self._kill_one(procs, now - start)
                if kill is not None:
                    report.kills.append(kill)
                    next_kill = now + self.rng.uniform(*self.gap_s)
            time.sleep(0.1)
        raise TimeoutError(f"job still {report.status.get('state')} after {timeout_s} s")

    def _kill_one(self, procs: dict[str, psutil.Process], at_s: float) -> Kill | None:
        kinds = {
            kind: sorted(n for n in procs if n == kind or n.startswith(f"{kind}-"))
            for kind in self.weights
        }
        kinds = {k: nodes for k, nodes in kinds.items() if nodes}
        if not kinds:
            return None
        kind = self.rng.choices(list(kinds), weights=[self.weights[k] for k in kinds])[0]
        node = self.rng.choice(kinds[kind])
        proc = procs[node]
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            return None
        return Kill(at_s=round(at_s, 2), kind=kind, node=node, pid=proc.pid)

    @staticmethod
    def _mark_recoveries(
        report: ChaosReport, status: dict[str, Any], procs: dict[str, psutil.Process], now_s: float
    ) -> None:
        """A node is back when a new process of it has said ready and the job trains again;
        the master is back when a new master has a worker training."""
        if status.get("state") != "running":
            return
        nodes = {n["id"]: n for n in status.get("nodes", [])}
        training = any(n["role"] == "worker" and n["state"] == "running" for n in nodes.values())
        for kill in report.kills:
            if kill.recovered_s is not None:
                continue
            proc = procs.get(kill.node)
            relaunched = proc is not None and proc.pid != kill.pid
            ready = kill.kind == "master" and training
            ready = ready or (nodes.get(kill.node, {}).get("state") == "running")
            if relaunched and ready:
                kill.recovered_s = now_s - kill.at_s


def wait_for_end(layout: JobDir, timeout_s: float = 300.0) -> dict[str, Any]:
    """The job's final status, polled until it ends (no chaos)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = local_job_status(layout)
        if status["state"] in TERMINAL_STATES:
            return status
        time.sleep(0.5)
    raise TimeoutError(f"job in {layout.root} did not end")
