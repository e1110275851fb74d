"""The master's data-worker room: how many run, which serve, and the windows the autoscaler
judges (``core.data_autoscaler``).

A data worker leaving is drained, never cut off: it is taken off the list the lease replies
carry, so trainers ask it for no new shard, and its heartbeat's reply tells it to leave: it
takes no new call, finishes the ones in flight and exits (stopped after ``DRAIN_TIMEOUT_S`` if
it has not). A trainer whose call to it breaks anyway asks another data worker (or prepares
the batches itself) from the first batch it lacks: a batch keeps its key, so nothing is lost
or trained twice.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_rover.core.data_autoscaler import DataAutoscaler, DataWorkerDecision, InputWindow
from airflow_rover.core.spec import DataWorkersConfig
from airflow_rover.core.states import NodeState
from airflow_rover.master.nodes import NodeInfo, NodeSet

log = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 180.0
DECISIONS_KEPT = 200
MIN_STEPS = 5  # a window holds at least this many steps of each trainer


@dataclass(frozen=True)
class _Beat:
    """A trainer's counters as of one heartbeat, and when it arrived."""

    samples: int
    steps: int
    input_wait_s: float
    at: float

    @classmethod
    def of(cls, node: NodeInfo) -> _Beat:
        return cls(node.samples, node.steps, node.input_wait_s, node.beat_at)


class DataWorkerJob(Protocol):
    nodes: NodeSet

    def mirror_state(self, force: bool = False) -> None: ...


class DataWorkerRoom:
    """Keeps ``target`` data workers serving; in auto mode, moves ``target``."""

    def __init__(self, job: DataWorkerJob, config: DataWorkersConfig) -> None:
        self.job, self.config = job, config
        self.target = config.start
        self.autoscaler = (
            DataAutoscaler(config.min, config.max, config.start) if config.mode == "auto" else None
        )
        self.decisions: list[DataWorkerDecision] = []
        self.last: InputWindow | None = None
        self._draining: dict[str, float] = {}  # node id -> when it left the list
        self._window: tuple[float, dict[str, _Beat]] | None = None

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def _data_nodes(self) -> list[NodeInfo]:
        return sorted(self.job.nodes.of_role("data"), key=lambda n: _index(n.node_id))

    def _live(self) -> list[NodeInfo]:
        """Data workers that run or start and are not leaving."""
        return [
            n
            for n in self._data_nodes()
            if n.exit_code is None and not n.stopping and n.node_id not in self._draining
        ]

    def addresses(self) -> list[str]:
        """Where trainers may ask for batches now."""
        return [n.address for n in self._live() if n.state == NodeState.RUNNING and n.address]

    def cap(self, count: int | None) -> None:
        """The most data workers the job's cluster budget leaves room for (None: no budget);
        set by the job's trigger. It stops steps up, it never removes a data worker."""
        if self.autoscaler is not None:
            self.autoscaler.budget_cap = count

    def leaving(self, node_id: str) -> bool:
        """Whether the data worker ``node_id`` should finish its calls and exit."""
        return node_id in self._draining

    def wants(self, node_id: str) -> bool:
        """Whether a data worker that failed should come back (it is not leaving)."""
        return node_id not in self._draining and _index(node_id) < self.target

    # -- the supervisor's tick -----------------------------------------------------------------
    def tick(self, trainers: list[NodeInfo], now: float | None = None) -> None:
        """``trainers``: the workers that train now."""
        if not self.enabled:
            return
        now = time.time() if now is None else now
        self._scale_to_target(now)
        self._finish_drains(now)
        if self.autoscaler is not None:
            self._measure(trainers, now)

    def stop_all(self) -> None:
        """Nobody needs batches now (training is over); ``tick`` starts them again."""
        self._window = None
        for node in self._data_nodes():
            if node.exit_code is None and not node.stopping:
                self.job.nodes.stop(node)
        self._draining.clear()

    def _scale_to_target(self, now: float) -> None:
        live = self._live()
        taken = {n.node_id for n in live} | set(self._draining)
        index = 0
        while len(live) < self.target:
            while f"data-{index}" in taken:
                index += 1
            node = self.job.nodes.start(f"data-{index}", "data")
            taken.add(node.node_id)
            live.append(node)
        for node in sorted(live, key=lambda n: _index(n.node_id))[self.target :]:
            self._draining[node.node_id] = now
            log.info("draining %s: it finishes its calls in flight and leaves", node.node_id)

    def _finish_drains(self, now: float) -> None:
        """A drained data worker counts until it has exited (the calls it served end first)."""
        for node_id, since in list(self._draining.items()):
            node = self.job.nodes.get(node_id)
            if node is None or node.exit_code is not None:
                del self._draining[node_id]
            elif now - since >= DRAIN_TIMEOUT_S and not node.stopping:
                log.warning("%s did not leave within %.0f s: stopping it", node_id, now - since)
                self.job.nodes.stop(node)

    def _measure(self, trainers: list[NodeInfo], now: float) -> None:
        """Close a window, at least ``interval_s`` and ``MIN_STEPS`` steps of each trainer
        long, in which the target count served throughout. Rates are taken between the
        heartbeats that bracket the window (when each arrived), not the ticks."""
        serving = len(self.addresses())
        beats = {n.node_id: _Beat.of(n) for n in trainers if n.beat_at > 0}
        if serving != self.target or self._draining or not beats:
            self._window = None  # a step not yet in effect: measure from when it is
            return
        if self._window is None:
            self._window = (now, beats)
            return
        since, before = self._window
        if beats.keys() != before.keys():  # a trainer joined (its first beat) or left: a
            self._window = (now, beats)  # window of some trainers would read as all of them
            return
        common = [node for node in beats if beats[node].at > before[node].at]
        steps = sum(beats[n].steps - before[n].steps for n in common)
        if now - since < self.config.interval_s or steps < MIN_STEPS * len(beats):
            return
        self._window = (now, beats)
        samples_per_s = sum(
            max(0, beats[n].samples - before[n].samples) / (beats[n].at - before[n].at)
            for n in common
        )
        waited = sum(
            max(0.0, beats[n].input_wait_s - before[n].input_wait_s) / (beats[n].at - before[n].at)
            for n in common
        )
        window = InputWindow(
            at=now,
            data_workers=self.target,
            samples_per_s=samples_per_s,
            input_wait=min(1.0, waited / len(common)),
            ready_fill=sum(n.ready_fill for n in trainers) / len(trainers),
        )
        self.last = window
        assert self.autoscaler is not None
        decision = self.autoscaler.decide(window)
        if decision is not None:
            self.decide(decision)

    def decide(self, decision: DataWorkerDecision) -> None:
        self.target = decision.count
        self.decisions = [*self.decisions, decision][-DECISIONS_KEPT:]
        self._window = None
        log.info(
            "data workers %d -> %d (%s): %s",
            decision.previous,
            decision.count,
            decision.rule,
            decision.reason,
        )
        self.job.mirror_state(force=True)

    def summary(self) -> dict[str, Any]:
        """What the result (XCom) says of the data workers: the decisions stay in the status."""
        out: dict[str, Any] = {
            "mode": self.config.mode,
            "count": self.target,
            "decisions": len(self.decisions),
        }
        if self.last is not None:
            out["input_wait"] = round(self.last.input_wait, 4)
        return out

    def status(self) -> dict[str, Any]:
        config = self.config
        out: dict[str, Any] = {
            "mode": config.mode,
            "target": self.target,
            "running": len(self.addresses()),
            "decisions": [d.to_json() for d in self.decisions],
        }
        if config.mode == "auto":
            out.update({"min": config.min, "max": config.max})
            if self.autoscaler is not None and self.autoscaler.budget_cap is not None:
                out["budget_cap"] = self.autoscaler.budget_cap
        if self.last is not None:
            out.update(
                {
                    "input_wait": round(self.last.input_wait, 4),
                    "ready_fill": round(self.last.ready_fill, 4),
                    "samples_per_s": round(self.last.samples_per_s, 1),
                }
            )
        return out


def _index(node_id: str) -> int:
    return int(node_id.rsplit("-", 1)[1])
