"""What the master needs from a launcher to run its nodes, wherever they run.

The master owns this interface; each backend in ``airflow_rover.launchers`` implements it (local
processes, Kubernetes pods) and hands the master one at start. Beyond starting, watching and
stopping nodes, a launcher may offer capabilities, which it lists in ``capabilities``; the
master asks ``can`` before it uses one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import StrEnum
from typing import ClassVar, Literal

Role = Literal["ps", "worker", "evaluator", "data"]
ResizeOutcome = Literal["in-place", "replace"]
OOM_KILLED = "OOMKilled"  # a node killed for using more memory than its size (the kubelet's word)


class Capability(StrEnum):
    RESIZE = "resize"  # give a running node other cores or memory
    PROFILE = "profile"  # name the process of a node, so the master samples its CPU and memory
    STANDBY = "standby"  # keep a spare PS process that takes over a lost one at once


class CapabilityMissing(NotImplementedError):
    """A launcher was asked for a capability it does not list."""


class NodeLauncher(ABC):
    """Starts, watches and stops the PS, worker and evaluator nodes of one job."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    capacity_cpu: float | None = None
    """Cores the launcher can host for the job (a machine's); None: no bound known."""
    shared_host_cores: float | None = None
    """Cores every node of the job shares, where they all run on one host; None: each node
    has its own."""

    def can(self, capability: Capability) -> bool:
        return capability in self.capabilities

    @abstractmethod
    def start(self, node_id: str, role: Role) -> None:
        """Start a node; it finds the master through its environment. Starting a node that
        runs is a no-op."""

    @abstractmethod
    def exit_codes(self) -> dict[str, int | None]:
        """Each started node's exit code, None while it runs."""

    def exit_reason(self, node_id: str) -> str | None:
        """Why the node's process ended, where the launcher knows (``OOM_KILLED``); None
        while it runs or when the launcher cannot tell."""
        return None

    def pending_s(self) -> dict[str, float]:
        """Seconds each node has waited to be scheduled (a pod Pending); nodes that run,
        or that a launcher never makes wait, are left out."""
        return {}

    @abstractmethod
    def stop(self, node_id: str) -> None:
        """Stop one node (no-op when already gone)."""

    @abstractmethod
    def stop_all(self) -> None:
        """Stop every node of the job and wait for them to go."""

    # -- capabilities ----------------------------------------------------------------------
    def resize(self, node_id: str, role: Role, cpu: float, memory_mb: int) -> ResizeOutcome:
        """``Capability.RESIZE``: the node at its new size, in place where the cluster can,
        else deleted to come back at that size (its exit is then not a failure)."""
        raise self._missing(Capability.RESIZE)

    def pid(self, node_id: str) -> int | None:
        """``Capability.PROFILE``: the node's process id (None: not running)."""
        raise self._missing(Capability.PROFILE)

    def start_standby(self) -> None:
        """``Capability.STANDBY``: start a spare PS process unless one is alive."""
        raise self._missing(Capability.STANDBY)

    def take_standby(self, node_id: str) -> bool:
        """``Capability.STANDBY``: make the spare the node ``node_id`` (False, and nothing
        done, if none is alive)."""
        raise self._missing(Capability.STANDBY)

    def _missing(self, capability: Capability) -> CapabilityMissing:
        return CapabilityMissing(f"{type(self).__name__} cannot {capability}")
