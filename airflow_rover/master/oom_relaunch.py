"""A node killed out of memory comes back bigger, once: the launcher says why the node died
(``OOMKilled``: the kubelet's word on Kubernetes, the local launcher's memory watch), the
``core.post_scaling.after_oom`` rule sizes that node alone with twice the memory, the master
makes it the job's plan before relaunching the node, and the plan history records it with
rule ``oom``. A second OOM of the same node is a failure like any other, also after the master
was relaunched (the grown nodes are kept in the job directory)."""

from __future__ import annotations

import math
import time
from typing import Protocol

from airflow_rover.core.job_dir import atomic_write_json
from airflow_rover.core.post_scaling import after_oom
from airflow_rover.core.spec import ResourcePlan
from airflow_rover.master.autoscaler import Autoscaler
from airflow_rover.master.job_core import JobCore
from airflow_rover.master.node_launcher import OOM_KILLED
from airflow_rover.master.nodes import NodeInfo


class GrowingJob(JobCore, Protocol):
    """What the OOM relaunch uses of the job beyond its core."""

    autoscaler: Autoscaler

    def set_plan(self, plan: ResourcePlan) -> None: ...


class OomRelaunch:
    """Grows the memory of nodes killed out of memory, each node once per job."""

    def __init__(self, job: GrowingJob) -> None:
        self.job = job
        kept = job.job_dir.read_json(job.job_dir.oom_grown_file) or {}
        self.grown: set[str] = {str(n) for n in kept.get("nodes", [])}

    def grow(self, node: NodeInfo) -> str | None:
        """If ``node`` died out of memory for the first time and can grow: the plan with its
        memory doubled is the job's (its relaunch gets it); returns the reason, else None."""
        job = self.job
        plan = job.spec.plan
        if node.node_id in self.grown or node.node_id not in plan.node_ids():
            return None
        if job.nodes.launcher.exit_reason(node.node_id) != OOM_KILLED:
            return None
        limits = job.autoscaler.limits.ranges.get(f"{node.role}_memory_mb")
        proposal = after_oom(plan, node.node_id, limits[1] if limits else math.inf)
        if proposal is None:
            return None
        self.grown.add(node.node_id)
        atomic_write_json(job.job_dir.oom_grown_file, {"nodes": sorted(self.grown)})
        job.autoscaler.master_applied(time.time(), plan, proposal)
        job.set_plan(proposal.plan)
        return proposal.reason
