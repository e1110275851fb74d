"""A worker's progress (steps, samples, step time) and the thread that reports it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from airflow_rover.core.step_profile import StepProfile
from airflow_rover.rpc import master_api
from airflow_rover.rpc.master_client import MasterClient

log = logging.getLogger(__name__)


class Progress:
    """Counters the heartbeat thread reports while the training loop updates them."""

    def __init__(self) -> None:
        self.steps = 0
        self.samples = 0
        self.step_time_ms = 0.0  # exponential moving average
        self.input_wait_s = 0.0  # waiting for the next batch, in all
        self.ready_fill: Callable[[], float] = lambda: 0.0  # the queue of ready batches now
        self.fill = 0.0  # ... and its moving average over steps
        self.profile = StepProfile()  # where the steps' time goes, and when each ended

    def record(self, samples: int, seconds: float) -> None:
        self.steps += 1
        self.samples += samples
        ms = seconds * 1000.0
        self.step_time_ms = ms if self.steps == 1 else 0.9 * self.step_time_ms + 0.1 * ms
        self.fill = 0.9 * self.fill + 0.1 * min(1.0, max(0.0, self.ready_fill()))

    def heartbeat(self) -> master_api.Heartbeat:
        return master_api.Heartbeat(
            steps=self.steps,
            samples=self.samples,
            step_time_ms=self.step_time_ms,
            input_wait_s=self.input_wait_s,
            ready_fill=self.fill,
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
