"""The job's nodes as the master knows them: their state and progress, started and stopped
through the launcher."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from airflow_rover.core.states import NodeState
from airflow_rover.master.node_launcher import NodeLauncher, Role


class NodeInfo:
    def __init__(self, node_id: str, role: Role) -> None:
        self.node_id = node_id
        self.role = role
        self.state = NodeState.STARTING
        self.address: str | None = None
        self.steps = 0
        self.samples = 0
        self.reported = False  # whether this process has reported its progress yet
        self.step_time_ms = 0.0
        self.input_wait_s = 0.0  # a trainer's: seconds it waited for input, in all
        self.beat_at = 0.0  # when its last heartbeat (the counters above) arrived
        self.ready_fill = 0.0  # a trainer's: how full its queue of ready batches was lately
        self.last_seen = time.time()
        self.exit_code: int | None = None
        self.stopping = False  # the master stopped it: its exit is not a failure
        self.replacing = False  # deleted to come back at a new size: relaunched, not a failure
        self.restarts = 0

    @property
    def running(self) -> bool:
        """Running and not on its way out."""
        return self.exit_code is None and not self.stopping

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.node_id,
            "role": self.role,
            "state": str(self.state),
            "address": self.address,
            "steps": self.steps,
            "samples": self.samples,
            "step_time_ms": round(self.step_time_ms, 3),
            "exit_code": self.exit_code,
            "restarts": self.restarts,
        }
        if self.role == "worker":  # a trainer's input wait, for any window a reader picks
            out["input_wait_s"] = round(self.input_wait_s, 3)
        return out


class NodeSet:
    """Every node the master started, by id; ``launcher`` runs them."""

    def __init__(self, launcher: NodeLauncher) -> None:
        self.launcher = launcher
        self._nodes: dict[str, NodeInfo] = {}

    def __getitem__(self, node_id: str) -> NodeInfo:
        return self._nodes[node_id]

    def __setitem__(self, node_id: str, node: NodeInfo) -> None:
        self._nodes[node_id] = node

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def __iter__(self) -> Iterator[NodeInfo]:
        return iter(list(self._nodes.values()))

    def __bool__(self) -> bool:
        return bool(self._nodes)

    def get(self, node_id: str) -> NodeInfo | None:
        return self._nodes.get(node_id)

    def known(self, node_id: str) -> NodeInfo:
        """The node, or a KeyError naming it (the API answers 404)."""
        node = self._nodes.get(node_id)
        if node is None:
            raise KeyError(f"unknown node {node_id!r}")
        return node

    def start(self, node_id: str, role: Role) -> NodeInfo:
        node = self._nodes[node_id] = NodeInfo(node_id, role)
        self.launcher.start(node_id, role)
        return node

    def stop(self, node: NodeInfo) -> None:
        """Stop ``node``: its exit is then not a failure."""
        node.stopping = True
        self.launcher.stop(node.node_id)

    # -- the PS ------------------------------------------------------------------------------
    def ps(self, num_ps: int) -> list[NodeInfo | None]:
        return [self._nodes.get(f"ps-{i}") for i in range(num_ps)]

    def all_ps_ready(self, num_ps: int) -> bool:
        return all(
            n is not None and n.state == NodeState.RUNNING and n.address for n in self.ps(num_ps)
        )

    def ps_incarnations(self, num_ps: int) -> list[int]:
        return [self._nodes[f"ps-{i}"].restarts for i in range(num_ps)]

    # -- the workers ---------------------------------------------------------------------------
    def of_role(self, role: Role) -> list[NodeInfo]:
        return [n for n in self._nodes.values() if n.role == role]

    def step_times(self) -> dict[str, float]:
        """Each running worker's step time (ms), once it reported one."""
        return {
            n.node_id: n.step_time_ms
            for n in self._nodes.values()
            if n.role == "worker" and n.state == NodeState.RUNNING and n.step_time_ms > 0
        }

    def training(self) -> list[NodeInfo]:
        """The workers that train now."""
        return [
            n
            for n in self._nodes.values()
            if n.role == "worker" and n.state == NodeState.RUNNING and n.exit_code is None
        ]

    def worker_samples(self) -> dict[str, int]:
        """Samples each worker reported (a restarted one counts from zero again)."""
        return {n.node_id: n.samples for n in self._nodes.values() if n.role == "worker"}

    def to_dicts(self) -> list[dict[str, Any]]:
        return [n.to_dict() for n in self._nodes.values()]
