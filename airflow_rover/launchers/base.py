"""What the master needs from a launcher to run its nodes, wherever they run."""

from __future__ import annotations

from typing import Literal, Protocol

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
