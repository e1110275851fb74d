"""What the master needs from a launcher to run its nodes, wherever they run."""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

Role = Literal["ps", "worker", "evaluator"]


class NodeLauncher(Protocol):
    """Starts, watches and stops the PS, worker and evaluator nodes of one job."""

    def start(self, node_id: str, role: Role) -> None:
        """Start a node; it finds the master through its environment."""

    def exit_codes(self) -> dict[str, int | None]:
        """Each started node's exit code, None while it runs."""

    def stop(self, node_id: str) -> None:
        """Stop one node (no-op when already gone)."""

    def stop_all(self) -> None:
        """Stop every node of the job and wait for them to go."""


@runtime_checkable
class StandbyLauncher(Protocol):
    """A launcher that can keep a spare PS process ready (``recovery.standby_ps``)."""

    def start_standby(self) -> None:
        """Start a spare PS process unless one is alive."""

    def take_standby(self, node_id: str) -> bool:
        """Make the spare the node ``node_id`` (False, and nothing done, if none is alive)."""
