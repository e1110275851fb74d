"""A trained worker's step profile, with its PS's request profiles, written next to its log."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from airflow_rover.core.step_profile import phases_from_arrays
from airflow_rover.rpc.ps_client import PSClient
from airflow_rover.worker.progress import Progress

log = logging.getLogger(__name__)


def profile_file(log_file: Path) -> Path:
    """Where the worker logging to ``log_file`` writes its profile."""
    return log_file.with_suffix(".profile.json")


def write_profile(path: Path, progress: Progress, ps: PSClient, traces: int) -> None:
    """The worker's phases, its step timeline, how often its step function was traced and each
    PS's request phases as they stand now (a bench reads it; a failure to write it or to read
    the PS is logged, not raised: it must not fail a trained worker)."""
    worker = progress.profile.to_json()
    worker["tf_traces"] = traces
    worker["ns"].update(ps.profile.ns)
    worker["calls"].update(ps.profile.calls)
    report: dict[str, Any] = {"worker": worker, "ps": []}
    try:
        report["ps"] = [phases_from_arrays(reply) for reply in ps.stats()]
    except Exception as exc:  # a PS gone by now: the worker's part is still worth having
        log.warning("PS profiles not read: %s", exc)
    try:
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(report))
        tmp.replace(path)
    except OSError as exc:
        log.warning("step profile not written to %s: %s", path, exc)
