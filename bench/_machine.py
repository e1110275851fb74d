"""Is the machine quiet enough to time a run on? Load average and how busy the cores are now.

The 1-minute load average lags (a run of this bench still shows in it a minute later), so the
cores' busy share is also sampled from ``/proc/stat`` over a second while the bench itself is
idle: what other processes use right now.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

_PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class Quiet:
    """How busy the machine is, and whether that is quiet enough to time a run."""

    load: float  # 1-minute load average
    busy_cores: float | None  # cores other processes kept busy over the sample (None: no /proc)
    quiet: bool

    def describe(self) -> str:
        busy = "" if self.busy_cores is None else f", {self.busy_cores:.2f} cores busy"
        return f"load average {self.load:.2f}{busy}"


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies over all cores since boot, or None without ``/proc/stat``."""
    try:
        fields = _PROC_STAT.read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    ticks = [int(f) for f in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return sum(ticks) - idle, sum(ticks)


def busy_cores(sample_s: float = 1.0) -> float | None:
    """Cores busy over the next ``sample_s`` seconds (this process sleeps meanwhile)."""
    before = _cpu_times()
    time.sleep(sample_s)
    after = _cpu_times()
    if before is None or after is None or after[1] == before[1]:
        return None
    cores = os.cpu_count() or 1
    return cores * (after[0] - before[0]) / (after[1] - before[1])


def check(max_load: float, max_busy: float, sample_s: float = 1.0) -> Quiet:
    load = os.getloadavg()[0]
    busy = busy_cores(sample_s)
    quiet = load <= max_load and (busy is None or busy <= max_busy)
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
