"""A worker's progress reports: how often they go to the master is a job setting."""

from __future__ import annotations

import threading
import time

import pytest
from pydantic import ValidationError

from airflow_rover.core.spec import TrainingConfig
from airflow_rover.rpc import master_api
from airflow_rover.worker.progress import Progress, start_heartbeats


class _Master:
    """Counts the reports it gets (what ``MasterClient.heartbeat`` would send)."""

    def __init__(self) -> None:
        self.beats: list[master_api.Heartbeat] = []

    def heartbeat(self, node_id: str, beat: master_api.Heartbeat) -> bool:
        self.beats.append(beat)
        return False


def test_reports_go_at_the_configured_interval_with_the_latest_counts() -> None:
    master, progress, stop = _Master(), Progress(), threading.Event()
    progress.record(512, 0.01)
    thread = start_heartbeats(master, "worker-0", progress, stop, interval_s=0.05)  # type: ignore[arg-type]
    time.sleep(0.52)
    stop.set()
    thread.join(timeout=2)
    assert 4 <= len(master.beats) <= 11  # 10 due (none at the default 1 s); late when loaded
    assert master.beats[-1].samples == 512 and master.beats[-1].steps == 1


def test_the_interval_defaults_to_a_second_and_is_bounded() -> None:
    assert TrainingConfig().progress_report_s == 1.0
    assert TrainingConfig(progress_report_s=0.2).progress_report_s == 0.2
    for bad in (0.0, 0.01, 61):
        with pytest.raises(ValidationError, match="progress_report_s"):
            TrainingConfig(progress_report_s=bad)
