"""Applying a plan to the running job (``docs/elastic-scaling.md``): worker counts change at
once, node sizes through the launcher, PS counts by live migration of the rows that move."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Protocol

import grpc

from airflow_rover.core.plans import PlanRecord
from airflow_rover.core.policies import CheckpointPolicy
from airflow_rover.core.spec import ResourcePlan
from airflow_rover.core.states import JobState, NodeState
from airflow_rover.master.autoscaler import Autoscaler
from airflow_rover.master.checkpointer import Checkpointer
from airflow_rover.master.dispatch import ShardDispatch
from airflow_rover.master.job_core import JobCore
from airflow_rover.master.node_launcher import Capability, Role
from airflow_rover.master.ps_access import PsAccess
from airflow_rover.master.ps_set import PsSet

log = logging.getLogger(__name__)


class ResizingJob(JobCore, Protocol):
    """What applying plans uses of the job beyond its core."""

    policy: CheckpointPolicy
    dispatch: ShardDispatch
    autoscaler: Autoscaler
    ps_set: PsSet
    ps: PsAccess

    @property
    def checkpointer(self) -> Checkpointer: ...

    def set_plan(self, plan: ResourcePlan) -> None:
        """Make ``plan`` the job's (a relaunched master keeps it)."""


@dataclass
class PsResize:
    """A PS resize in progress: the new PS start while training goes on (``starting``); then
    leases stop until every leased shard is done and no checkpoint is in flight
    (``draining``); then the rows move and training resumes."""

    record: PlanRecord
    plan: ResourcePlan
    old_num_ps: int
    phase: str = "starting"
    paused_at: float | None = None


PLAN_SIZED: frozenset[Role] = frozenset({"ps", "worker", "evaluator"})


def sizes_change(current: ResourcePlan, plan: ResourcePlan) -> bool:
    """Whether ``plan`` changes node sizes, not only counts."""
    return current.with_counts(plan.num_workers, plan.num_ps) != plan


class PlanExecutor:
    """Applies proposed plans (called with the job's lock held); one PS resize at a time."""

    def __init__(self, job: ResizingJob) -> None:
        self.job = job
        self.resize: PsResize | None = None

    @property
    def draining(self) -> bool:
        """Leases are held while the workers finish their shards before the rows move."""
        return self.resize is not None and self.resize.phase == "draining"

    def apply(self, record: PlanRecord) -> PlanRecord:
        """Apply a proposed plan: start or stop workers, resize nodes, or begin a PS resize;
        a plan the job cannot apply now is declined with the reason."""
        job = self.job
        if not record.pending:
            return record  # applying twice is a no-op (a re-created trigger may retry)
        plan, current = record.plan, job.spec.plan
        if job.state != JobState.RUNNING:
            record.decline(f"the job is {job.state}")
            return record
        if sizes_change(current, plan):
            resized, note = self._resize_nodes(plan)
            if not resized:
                record.decline(note)
            else:
                record.mark_applied(time.time(), note)
                job.autoscaler.applied(time.time())
                job.mirror_state(force=True)
            return record
        if plan.num_ps != current.num_ps:
            refused = job.policy.declines_ps_resize()
            if refused is None and self.resize is not None:
                refused = "another PS resize is in progress"
            if refused is not None:
                record.decline(refused)
            else:
                self._begin_ps_resize(record, plan)
            return record
        self.set_workers(plan)
        job.autoscaler.applied(time.time())
        record.mark_applied(time.time())
        log.info("applied plan %d: %s", record.id, plan.model_dump())
        job.mirror_state(force=True)
        return record

    def _resize_nodes(self, plan: ResourcePlan) -> tuple[bool, str]:
        """New node sizes (a hot PS's bigger node, bigger workers): each running node whose
        size changes, and no other, is resized in place where the launcher and cluster can,
        else replaced (its exit is then a relaunch at the new size, not a failure). Returns
        whether it was applied, and the plan's note."""
        job = self.job
        current = job.spec.plan
        if not job.nodes.launcher.can(Capability.RESIZE):
            return False, (
                "declined: node sizes are fixed on this launcher (local nodes share one "
                "machine); worker and PS counts change"
            )
        if (plan.num_ps, plan.num_workers) != (current.num_ps, current.num_workers):
            return False, "declined: change node sizes and node counts in separate plans"
        done: dict[str, list[str]] = {"in-place": [], "replace": []}
        for node in job.nodes:
            if node.role not in PLAN_SIZED or not node.running:
                continue
            size = plan.size_of(node.node_id)
            if size != current.size_of(node.node_id):
                how = job.nodes.launcher.resize(node.node_id, node.role, *size)
                node.replacing = how == "replace"
                done[how].append(node.node_id)
        job.set_plan(plan)
        return (
            True,
            f"resized in place: {done['in-place']}; replaced (relaunched): {done['replace']}",
        )

    def set_workers(self, plan: ResourcePlan) -> None:
        """Start or stop workers to ``plan.num_workers`` and make ``plan`` the job's plan. A
        stopped worker's shards go back to the queue, resumed from their first batch not
        applied on every PS; the other workers do not pause."""
        job = self.job
        current = job.spec.plan
        for i in range(current.num_workers, plan.num_workers):
            job.nodes.start(f"worker-{i}", "worker")
        for i in range(plan.num_workers, current.num_workers):
            node = job.nodes.get(f"worker-{i}")
            if node is not None and node.exit_code is None:
                job.nodes.stop(node)
            job.dispatch.reconcile(job.queue.release_worker(f"worker-{i}"))
        job.set_plan(plan)

    # -- PS resize -------------------------------------------------------------------------------
    def _begin_ps_resize(self, record: PlanRecord, plan: ResourcePlan) -> None:
        """Start the new PS (training goes on); ``advance`` does the rest."""
        job = self.job
        old = job.spec.plan.num_ps
        for i in range(old, plan.num_ps):
            job.nodes.start(f"ps-{i}", "ps")
        self.resize = PsResize(record, plan, old)
        record.mark_applying(f"PS {old} -> {plan.num_ps}: starting")
        job.message = f"resizing the PS {old} -> {plan.num_ps}"
        log.info("plan %d: %s", record.id, job.message)
        job.mirror_state(force=True)

    def advance(self) -> None:
        """A tick of the PS resize in progress, if any."""
        resize = self.resize
        if resize is None:
            return
        job = self.job
        if resize.phase == "starting":
            new = [job.nodes[f"ps-{i}"] for i in range(resize.old_num_ps, resize.plan.num_ps)]
            if all(n.state == NodeState.RUNNING and n.address for n in new):
                resize.phase, resize.paused_at = "draining", time.time()
                resize.record.note = "new PS ready; leases held while the workers drain"
            return
        if job.queue.counts()["doing"] or job.checkpointer.pending is not None:
            return  # leased shards finish (their pushes land) and a checkpoint commits first
        self._migrate(resize)

    def _migrate(self, resize: PsResize) -> None:
        """Every PS hands the rows it no longer owns to their new owners, workers switch to
        the new PS set on their next lease, removed PS stop. No worker trains meanwhile."""
        job = self.job
        started = time.time()
        top = max(resize.old_num_ps, resize.plan.num_ps)
        addresses = [str(job.nodes[f"ps-{i}"].address) for i in range(top)]
        client = job.ps.client_of(addresses)
        try:
            ledgers = [applied for applied, _ in client.ledgers()[: resize.old_num_ps]]
            if any(applied != ledgers[0] for applied in ledgers):
                # A push landed on some PS only (its worker died): moved rows would carry a
                # batch their new owner's ledger lacks. The shard retrains it; try again later.
                self.cancel("the PS ledgers disagree (a worker died mid-push)")
                return
            replies = client.reshard(addresses[: resize.plan.num_ps])
        except grpc.RpcError as exc:
            job.finish(
                JobState.FAILED,
                f"PS resize {resize.old_num_ps} -> {resize.plan.num_ps} failed while moving "
                f"rows ({exc.code()}: {exc.details()}); a retry resumes from checkpoint "
                f"{job.checkpointer.number}",
            )
            return
        finally:
            client.close()
        moved = sum(int(r["moved_rows"][0]) for r in replies)
        self._switch(resize, moved, started)

    def _switch(self, resize: PsResize, moved: int, started: float) -> None:
        """The rows moved: stop the removed PS, announce the new PS set, resume training."""
        job = self.job
        for i in range(resize.plan.num_ps, resize.old_num_ps):
            job.nodes.stop(job.nodes[f"ps-{i}"])
        job.set_plan(job.spec.plan.with_counts(num_ps=resize.plan.num_ps))
        job.ps_set.next()
        self.set_workers(resize.plan)
        now = time.time()
        resize.record.mark_applied(
            now,
            f"PS {resize.old_num_ps} -> {resize.plan.num_ps}: {moved} rows moved",
            moved_rows=moved,
            migration_s=round(now - started, 3),
            pause_s=round(now - (resize.paused_at or started), 3),
        )
        self.resize = None
        job.autoscaler.applied(now, ps_changed=True)
        job.autoscaler.ps_resized(now - (resize.paused_at or started))
        job.checkpointer.start_soon()  # the next checkpoint is of the new PS set
        job.message = "training"
        log.info("plan %d applied: %s", resize.record.id, resize.record.note)
        job.mirror_state(force=True)

    def cancel(self, why: str) -> None:
        """Give up the PS resize in progress: its new PS stop, the plan is declined."""
        resize, job = self.resize, self.job
        if resize is None:
            return
        for i in range(resize.old_num_ps, resize.plan.num_ps):
            node = job.nodes.get(f"ps-{i}")
            if node is not None and node.exit_code is None:
                job.nodes.stop(node)
        resize.record.decline(why)
        self.resize = None
        job.message = "training"
        log.warning("PS resize %d -> %d declined: %s", resize.old_num_ps, resize.plan.num_ps, why)
