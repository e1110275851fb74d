"""A worker's progress (steps, samples, step time) and the thread that reports it."""

from __future__ import annotations

import logging
import threading

from airflow_rover.rpc import master_api
from airflow_rover.rpc.master_client import MasterClient

log = logging.getLogger(__name__)


class Progress:
    """Counters the heartbeat thread reports while the training loop updates them."""

    def __init__(self) -> None:
        self.steps = 0
        self.samples = 0
        self.step_time_ms = 0.0  # exponential moving average

    def record(self, samples: int, seconds: float) -> None:
        self.steps += 1
        self.samples += samples
        ms = seconds * 1000.0
        self.step_time_ms = ms if self.steps == 1 else 0.9 * self.step_time_ms + 0.1 * ms

    def heartbeat(self) -> master_api.Heartbeat:
        return master_api.Heartbeat(
            steps=self.steps, samples=self.samples, step_time_ms=self.step_time_ms
        )


def start_heartbeats(
    master: MasterClient,
    node_id: str,
    progress: Progress,
    stop: threading.Event,
    interval_s: float = 1.0,
) -> threading.Thread:
    def beat() -> None:
        while not stop.wait(interval_s):
            try:
                if master.heartbeat(node_id, progress.heartbeat()):
                    log.info("master asked %s to stop", node_id)
                    stop.set()
            except Exception as exc:  # a missed beat is not fatal; the lease deadline is
                log.warning("heartbeat failed: %s", exc)

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    return thread
