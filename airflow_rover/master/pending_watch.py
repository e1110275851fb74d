"""Node pods the cluster does not schedule (Kubernetes, ``autoscale.pending_timeout_s``): the
``core.post_scaling.pending_pods`` rule gives the job a smaller plan. A smaller size for one
node is applied by the master at once (the pod waits, nothing runs in it: it is created again
at that size, and the plan history records it); fewer workers are proposed like any plan, for
the trigger to apply (or a person, under ``plan_approval``). It runs on every supervisor tick,
whatever the job is doing: a PS that never starts holds the job before it trains, and the
autoscaler's own tick waits while a worker starts."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from airflow_rover.core.post_scaling import pending_pods
from airflow_rover.core.spec import ResourcePlan
from airflow_rover.core.states import JobState
from airflow_rover.master.autoscaler import Autoscaler
from airflow_rover.master.job_core import JobCore

log = logging.getLogger(__name__)


class ShrinkingJob(JobCore, Protocol):
    """What the pending watch uses of the job beyond its core."""

    autoscaler: Autoscaler

    def set_plan(self, plan: ResourcePlan) -> None: ...


class PendingWatch:
    """Looks for unscheduled node pods every ``autoscale.interval_s``."""

    def __init__(self, job: ShrinkingJob) -> None:
        self.job = job
        self._last = -float("inf")

    def tick(self) -> None:
        job = self.job
        config = job.spec.autoscale
        now = time.time()
        if not config.enabled or now - self._last < config.interval_s:
            return
        self._last = now
        waiting = job.nodes.launcher.pending_s()
        if not waiting:
            return
        plan, limits = job.spec.plan, job.autoscaler.limits
        low = {
            "ps": (limits.low("ps_cpu"), limits.low("ps_memory_mb")),
            "worker": (limits.low("worker_cpu"), 0.0),
        }
        min_workers = int(limits.low("num_workers"))
        proposal = pending_pods(plan, waiting, config.pending_timeout_s, min_workers, low)
        if proposal is None:
            return
        if proposal.plan.num_workers != plan.num_workers:
            if job.state == JobState.RUNNING:
                job.autoscaler.propose_now(now, plan, proposal)
            return
        job.autoscaler.master_applied(now, plan, proposal)
        job.set_plan(proposal.plan)
        for node_id in proposal.nodes:
            node = job.nodes.get(node_id)
            if node is not None and node.running:
                job.nodes.launcher.stop(node_id)  # it never ran: its pod goes, no exit seen
                job.nodes.launcher.start(node_id, node.role)
        job.mirror_state(force=True)
