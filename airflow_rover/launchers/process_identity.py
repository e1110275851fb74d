"""Who a recorded pid was: its start time and command line, so that a signal meant for a job's
keeper or master never reaches a process that got the same pid later.

A pid alone names whichever process holds it now; a job directory's ``master.json`` or
``keeper.json`` may outlive its processes by days (a machine restart, a killed job), and its pid
may by then be an unrelated process's. This module imports nothing but psutil: the keeper
records itself with it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import psutil

START_TIME_TOLERANCE_S = 1.0
"""A start time is the boot time plus the ticks since boot, and the boot time moves with the
system clock (NTP): the command line, compared exactly, tells the rest apart."""


@dataclass(frozen=True)
class ProcessRecord:
    """A process as it was recorded: pid, start time (``psutil.Process.create_time``) and
    command line."""

    pid: int
    started: float
    cmdline: tuple[str, ...]

    @classmethod
    def of(cls, pid: int) -> ProcessRecord:
        """The record of the running process ``pid`` (``psutil.Error`` if there is none)."""
        proc = psutil.Process(pid)
        return cls(pid, proc.create_time(), tuple(proc.cmdline()))

    @classmethod
    def current(cls) -> ProcessRecord:
        return cls.of(os.getpid())

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "started": self.started, "cmdline": list(self.cmdline)}

    @classmethod
    def from_json(cls, data: Any) -> ProcessRecord | None:
        """The record written by ``to_json``; None for anything else (absent, older files)."""
        if not isinstance(data, dict):
            return None
        pid, started, cmdline = data.get("pid"), data.get("started"), data.get("cmdline")
        if not isinstance(pid, int) or not isinstance(started, int | float):
            return None
        if not isinstance(cmdline, list) or not all(isinstance(a, str) for a in cmdline):
            return None
        return cls(pid, float(started), tuple(cmdline))

    def process(self) -> psutil.Process | None:
        """The recorded process if it still runs; None once it ended (a zombie has) or its
        pid belongs to another process."""
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(self.pid)
            if (
                abs(proc.create_time() - self.started) <= START_TIME_TOLERANCE_S
                and tuple(proc.cmdline()) == self.cmdline
                and running(proc)
            ):
                return proc
        return None


def running(proc: psutil.Process) -> bool:
    """Whether ``proc`` still runs: neither ended nor a zombie, and its pid not reused since
    ``proc`` was made (psutil checks the start time)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
