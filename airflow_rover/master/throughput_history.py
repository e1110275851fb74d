"""The job's throughput over time, for a chart: one point at most every ``INTERVAL_S`` while
the job trains, at most ``MAX_POINTS`` of them. When full, every other point of the older half
goes, so a long job keeps its whole shape, the older part at a coarser step. A relaunched
master starts a new history (the points live in its memory and its status)."""

from __future__ import annotations

from typing import Any

INTERVAL_S = 2.0
MAX_POINTS = 600


class ThroughputHistory:
    """``(time, samples/s)`` points, oldest first."""

    def __init__(self, interval_s: float = INTERVAL_S, max_points: int = MAX_POINTS) -> None:
        if max_points < 2:
            raise ValueError(f"max_points={max_points!r}: accepted: an integer >= 2")
        self.interval_s = interval_s
        self.max_points = max_points
        self._points: list[tuple[float, float]] = []

    def record(self, now: float, samples_per_second: float) -> bool:
        """Add a point unless the last one is under ``interval_s`` old; whether it was added."""
        if self._points and now - self._points[-1][0] < self.interval_s:
            return False
        if len(self._points) >= self.max_points:
            half = len(self._points) // 2
            self._points = self._points[:half:2] + self._points[half:]
        self._points.append((now, round(samples_per_second, 1)))
        return True

    def __len__(self) -> int:
        return len(self._points)

    def to_json(self) -> list[dict[str, Any]]:
        """The status's ``throughput_history``."""
        return [{"at": at, "samples_per_second": rate} for at, rate in self._points]
