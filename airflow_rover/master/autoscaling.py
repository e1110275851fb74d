"""The master's resource room: every ``autoscale.interval_s`` it profiles the nodes and records
the throughput under the current plan, and the autoscaler proposes a plan (the trigger applies
it)."""

from __future__ import annotations

import time

from airflow_rover.core.shards import ShardQueue
from airflow_rover.core.spec import AutoscaleConfig, ResourcePlan
from airflow_rover.core.states import NodeState
from airflow_rover.master.autoscaler import Autoscaler, Profiler
from airflow_rover.master.nodes import NodeSet


class Autoscaling:
    """Profiles, throughput samples and proposals on the autoscaler's interval."""

    def __init__(self, config: AutoscaleConfig, autoscaler: Autoscaler, profiler: Profiler) -> None:
        self.config = config
        self.autoscaler = autoscaler
        self.profiler = profiler
        self._last = 0.0
        self._tick_samples: tuple[dict[str, int], float | None] = ({}, None)

    def tick(self, nodes: NodeSet, plan: ResourcePlan, queue: ShardQueue) -> None:
        now = time.time()
        if now - self._last < self.config.interval_s:
            return
        self._last = now
        running = {
            n.node_id: n.role
            for n in nodes
            if n.state == NodeState.RUNNING and n.role in ("ps", "worker")
        }
        self.profiler.sample(running, now)
        step_times = nodes.step_times()
        rate = self._rate_since_last_tick(nodes, now)
        if len(step_times) < plan.num_workers:  # a worker is (re)starting: not this plan's speed
            self.autoscaler.plan_changed(now)
            return
        if queue.counts()["todo"] > 0 and rate is not None:  # the tail is no sample
            self.autoscaler.record(now, plan, rate, list(step_times.values()))
        remaining = queue.total_samples - queue.done_samples
        self.autoscaler.propose(now, plan, self.profiler.nodes, step_times, remaining)

    def _rate_since_last_tick(self, nodes: NodeSet, now: float) -> float | None:
        """Samples/s the workers trained since the last tick (per-node counters, so a worker
        that restarts from zero does not count negative)."""
        counts = nodes.worker_samples()
        previous, since = self._tick_samples
        self._tick_samples = (counts, now)
        if since is None or now <= since:
            return None
        trained = sum(max(0, c - previous.get(node, c)) for node, c in counts.items())
        return trained / (now - since)
