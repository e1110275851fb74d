"""Where a process's training time goes: nanoseconds summed per phase, and when each step ended.

A worker times the phases of its step (input, TF, the PushPull's encode / wait / decode, the
replay) and a PS the phases of a request (decode, table ops, encode), so a change to either is
chosen by measurement. An accumulator is one ``perf_counter_ns`` pair and a dict update (well
under a microsecond; a step takes milliseconds), so it is always on. The step timeline lets a
bench measure a job's steady-state rate (warm-up steps excluded) like its single-process
baselines, and the process's CPU per step; ``perf_counter_ns`` is CLOCK_MONOTONIC on Linux,
one clock for every process of a machine. A ``*_cpu`` phase is one thread's CPU time in the
phase of that name: next to its wall time it tells computing from waiting for a core or the
GIL.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np


class StepProfile:
    """Phase totals (ns, calls) and the end time and samples of every step."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.step_ends: list[int] = []  # perf_counter_ns at the end of each step
        self.step_samples: list[int] = []
        self.step_cpu: list[int] = []  # the process's CPU time (ns) then

    def add(self, phase: str, ns: int) -> None:
        self.ns[phase] = self.ns.get(phase, 0) + ns
        self.calls[phase] = self.calls.get(phase, 0) + 1

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter_ns()
        try:
            yield
        finally:
            self.add(name, time.perf_counter_ns() - t0)

    def step(self, samples: int) -> None:
        self.step_ends.append(time.perf_counter_ns())
        self.step_samples.append(samples)
        self.step_cpu.append(time.process_time_ns())

    def to_json(self) -> dict[str, Any]:
        return {
            "ns": dict(self.ns),
            "calls": dict(self.calls),
            "step_ends": list(self.step_ends),
            "step_samples": list(self.step_samples),
            "step_cpu": list(self.step_cpu),
        }

    def to_arrays(self, prefix: str = "profile/") -> dict[str, np.ndarray]:
        """The phase totals as named arrays (a PS sends them in its ``Stats`` reply)."""
        names = sorted(self.ns)
        return {
            f"{prefix}names": np.frombuffer("\n".join(names).encode(), dtype=np.uint8),
            f"{prefix}ns": np.array([self.ns[n] for n in names], dtype=np.int64),
            f"{prefix}calls": np.array([self.calls[n] for n in names], dtype=np.int64),
        }


def phases_from_arrays(
    arrays: dict[str, np.ndarray], prefix: str = "profile/"
) -> dict[str, dict[str, int]]:
    """``to_arrays``'s phase totals back as ``{"ns": {...}, "calls": {...}}``."""
    raw = arrays.get(f"{prefix}names")
    names = raw.tobytes().decode().split("\n") if raw is not None and raw.size else []
    empty = np.zeros(0, dtype=np.int64)
    ns, calls = arrays.get(f"{prefix}ns", empty), arrays.get(f"{prefix}calls", empty)
    return {
        "ns": {n: int(v) for n, v in zip(names, ns, strict=True)},
        "calls": {n: int(v) for n, v in zip(names, calls, strict=True)},
    }


def steady_rate(timelines: list[tuple[list[int], list[int]]], warmup_steps: int) -> float | None:
    """Samples per second of several concurrent trainers in their common steady state: from
    the moment the last of them finished its ``warmup_steps``-th step to the moment the first
    of them finished its last step, each trainer's samples whose steps ended in that window.
    ``timelines``: per trainer (step end times in ns, samples per step). None when the window
    is empty (a trainer with too few steps)."""
    usable = [(ends, samples) for ends, samples in timelines if ends]
    if not usable or any(len(ends) <= warmup_steps for ends, _ in usable):
        return None
    start = max(ends[warmup_steps - 1] if warmup_steps else ends[0] for ends, _ in usable)
    end = min(ends[-1] for ends, _ in usable)
    if end <= start:
        return None
    total = 0
    for ends, samples in usable:
        at = np.asarray(ends)
        total += int(np.asarray(samples)[(at > start) & (at <= end)].sum())
    return total / ((end - start) / 1e9)
