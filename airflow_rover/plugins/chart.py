"""The throughput chart: samples/s over time as an inline SVG, drawn on the server so the page
needs no chart library and shows the same figures as the JSON API."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WIDTH, HEIGHT, PAD = 640, 200, 36


@dataclass(frozen=True)
class Chart:
    """A polyline in a ``WIDTH`` x ``HEIGHT`` box, and what its axes read."""

    points: str  # "x1,y1 x2,y2 ..." for <polyline points=...>
    peak: float  # samples/s at the top of the box
    last: float
    span_s: float  # seconds from the first point to the last
    count: int


def throughput_chart(samples: Sequence[tuple[float, float]]) -> Chart | None:
    """The chart of (time, samples/s) points, oldest first; None without two points."""
    if len(samples) < 2:
        return None
    t0, t1 = samples[0][0], samples[-1][0]
    span = max(t1 - t0, 1e-9)
    peak = max(rate for _, rate in samples)
    scale = peak or 1.0  # all zero: a flat line at the bottom
    inner_w, inner_h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    coords = [
        f"{PAD + (t - t0) / span * inner_w:.1f},{HEIGHT - PAD - rate / scale * inner_h:.1f}"
        for t, rate in samples
    ]
    return Chart(
        points=" ".join(coords),
        peak=peak,
        last=samples[-1][1],
        span_s=t1 - t0,
        count=len(samples),
    )
