"""The job master: the state its rooms share, the API's operations, and the supervisor's tick.

Each concern lives in a room of its own, which this class wires together: shard dispatch
(``dispatch``), node exits and restarts (``recovery``), applying plans (``resize``), checkpoints
and the policy in effect (``checkpointing``), the end of the job (``wrap_up``), proposals
(``autoscaling``). The API's handlers and the supervisor thread share one lock; every room's
method runs under it. The master is also the policy's ``MasterPort``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from airflow_rover.core.autoscale_prior import Prior
from airflow_rover.core.crashes import Crash
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.job_tls import JobTLS
from airflow_rover.core.plans import PlanRecord, PlanState
from airflow_rover.core.policies import CheckpointPolicy, MasterPort
from airflow_rover.core.spec import AutoscaleConfig, JobSpec, ResourcePlan
from airflow_rover.core.states import TERMINAL_STATES, JobState, NodeState
from airflow_rover.core.throughput import JobShape
from airflow_rover.master.autoscaler import Autoscaler, Profiler
from airflow_rover.master.autoscaling import Autoscaling
from airflow_rover.master.checkpointer import Checkpointer
from airflow_rover.master.checkpointing import Checkpoints, checkpoint_mirror
from airflow_rover.master.data_workers import DataWorkerRoom
from airflow_rover.master.dispatch import ShardDispatch
from airflow_rover.master.node_launcher import Capability, NodeLauncher
from airflow_rover.master.nodes import NodeSet
from airflow_rover.master.pending_watch import PendingWatch
from airflow_rover.master.policy_port import PolicyPort
from airflow_rover.master.ps_access import PsAccess
from airflow_rover.master.ps_set import PsSet
from airflow_rover.master.recovery import NodeRecovery
from airflow_rover.master.resize import PlanExecutor
from airflow_rover.master.resume import starting_point
from airflow_rover.master.status import (
    TRAINING,
    StateMirror,
    Throughput,
    job_status,
    recovery_summary,
)
from airflow_rover.master.throughput_history import ThroughputHistory
from airflow_rover.master.wrap_up import WrapUp
from airflow_rover.rpc import master_api
from airflow_rover.rpc.ps_client import PSClient

log = logging.getLogger(__name__)


class JobMaster:
    def __init__(
        self,
        job_dir: JobDir,
        spec: JobSpec,
        launcher: NodeLauncher,
        token: str,
        master_restarts: int = 0,
        wake: threading.Event | None = None,
        tls: JobTLS | None = None,
    ) -> None:
        """``wake``: set when the supervisor should tick now, not at its next tick (a node is
        ready: a relaunched PS, say, that the workers wait for); ``tls``: the job's
        certificate, which its PS serve with."""
        self.wake = wake or threading.Event()
        self.job_dir, self.spec = job_dir, spec
        self.state, self.message = JobState.PENDING, "starting parameter servers"
        self.started_at = time.time()
        self.finished_at: float | None = None
        self.train_started_at: float | None = None
        self.samples_resumed = 0  # samples whose batches every PS had applied at the start
        self._lock = threading.RLock()
        self.nodes, self.ps_set = NodeSet(launcher), PsSet(self._lock)
        self.ps = PsAccess(lambda: self.cluster().ps, token, tls)
        mirror = checkpoint_mirror(spec)
        start = starting_point(job_dir, spec, mirror)
        self.queue, self.resumed_from, self.lost = start.queue, start.resumed_from, start.lost
        self.started_from = start.started_from
        self.initial_rows: dict[str, master_api.InitialRows] = {}  # per PS, from ``init_from``
        self.dispatch = ShardDispatch(self)
        self.port: MasterPort = PolicyPort(self)
        self.dispatch.reconcile_pending = start.checkpoint is not None  # ask the PS ledgers
        self.checkpointing = Checkpoints(self, mirror, start.checkpoint_number)
        self.policy: CheckpointPolicy = self.checkpointing.requested
        self.policy.on_master_start(self.port, resumed=start.checkpoint is not None)
        self.recovery = NodeRecovery(self, master_restarts)
        self.plans = PlanExecutor(self)
        self.pending_watch = PendingWatch(self)
        self.wrap_up = WrapUp(self)
        self.data_workers = DataWorkerRoom(self, spec.data_workers)
        self.autoscaler = Autoscaler(
            at_least_ps(spec.autoscale, self.policy.min_ps),
            JobShape.of(spec),
            launcher.capacity_cpu,
            start=spec.plan,
            prior=Prior.from_config(spec.autoscale.prior),  # warm start's, else cold
            resizable=launcher.can(Capability.RESIZE),
            host_cores=launcher.shared_host_cores,
        )
        profiles = launcher.can(Capability.PROFILE)
        self.profiler = Profiler(launcher.pid if profiles else lambda _node: None)
        self.autoscaling = Autoscaling(spec.autoscale, self.autoscaler, self.profiler)
        self.throughput, self._mirror = Throughput(), StateMirror(job_dir)
        self.throughput_history = ThroughputHistory()

    # -- the API (request handlers) --------------------------------------------------------------
    def cluster(self, after: int | None = None, wait_s: float = 0.0) -> master_api.ClusterInfo:
        """The PS addresses and the PS set's version. With ``after``: first wait, up to
        ``wait_s``, for a version past it, so that a worker waiting out a lost PS hears of its
        replacement at once rather than at its next poll (a few requests at a time)."""
        waits = after is not None and wait_s > 0 and self.ps_set.may_wait()
        try:
            with self._lock:
                if waits:
                    self.ps_set.wait_past(after or 0, wait_s)
                ps = [n.address if n else None for n in self.nodes.ps(self.spec.plan.num_ps)]
                if not all(ps):
                    raise LookupError("parameter servers are not all ready yet")
                return master_api.ClusterInfo(
                    job_id=self.spec.job_id,
                    ps=[a for a in ps if a],
                    ps_set_version=self.ps_set.version,
                )
        finally:
            if waits:
                self.ps_set.done_waiting()

    def node_ready(self, node_id: str, body: master_api.NodeReady) -> None:
        with self._lock:
            node = self.nodes.known(node_id)
            node.state, node.address, node.last_seen = NodeState.RUNNING, body.address, time.time()
            if body.initial_rows is not None:  # a PS loaded again (none checkpointed) replaces
                self.initial_rows[node_id] = body.initial_rows
            self.recovery.node_ready(node)
            if node.role == "worker" and self.train_started_at is None:
                self.train_started_at = node.last_seen  # the training clock: first worker ready
            log.info("node %s ready%s", node_id, f" at {body.address}" if body.address else "")
        self.wake.set()

    def node_crashed(self, node_id: str, body: master_api.NodeCrash) -> None:
        """A node is about to exit of an exception: kept until its exit is seen."""
        with self._lock:
            self.nodes.known(node_id)
            crash = Crash(**body.model_dump())
            log.warning("%s is exiting: %s", node_id, crash.summary())
            self.recovery.crash_reported(node_id, crash)
        self.wake.set()  # the job may have ended: the supervisor stops the nodes now

    def heartbeat(self, node_id: str, body: master_api.Heartbeat) -> bool:
        """Record a node's progress; returns True when the node should stop."""
        with self._lock:
            node = self.nodes.known(node_id)
            if node.role == "worker":
                self.throughput.report(node, body.samples)
            node.steps, node.samples, node.step_time_ms = (
                body.steps,
                body.samples,
                body.step_time_ms,
            )
            node.input_wait_s, node.ready_fill = body.input_wait_s, body.ready_fill
            node.beat_at = time.time()
            node.last_seen = time.time()
            self.queue.renew(node_id, time.time(), self.spec.training.shard_lease_s)
            return self.state in TERMINAL_STATES or self.data_workers.leaving(node_id)

    def lease(self, node_id: str, ps_set_version: int | None = None) -> master_api.LeaseReply:
        with self._lock:
            reply = self.dispatch.lease(node_id, ps_set_version)
            if self.data_workers.enabled:
                reply.data_workers = self.data_workers.addresses()
            return reply

    def shard_done(self, shard_id: int, body: master_api.ShardDone) -> bool:
        with self._lock:
            return self.dispatch.done(shard_id, body.node_id)

    def release_shards(self, node_id: str) -> int:
        with self._lock:
            return self.dispatch.give_back(node_id)

    def claim_evaluation(self, node_id: str) -> bool:
        """Whether worker ``node_id``, done training, scores the held-out split."""
        with self._lock:
            return self.wrap_up.claim_evaluation(node_id)

    def report_evaluation(self, body: master_api.EvalReport) -> None:
        """Accept the held-out score only from the node scoring it, only while evaluating."""
        with self._lock:
            self.nodes.known(body.node_id)
            if self.state != JobState.EVALUATING:
                raise PermissionError(
                    f"{body.node_id} may not report an evaluation while the job is {self.state}"
                )
            if body.node_id != self.wrap_up.evaluator:
                raise PermissionError(
                    f"{body.node_id} may not report an evaluation: "
                    f"{self.wrap_up.evaluator or 'no node'} scores the held-out split"
                )
            self.wrap_up.evaluation = {
                "auc": body.auc,
                "logloss": body.logloss,
                "samples": body.samples,
            }
            log.info("held-out evaluation: %s", self.wrap_up.evaluation)

    def request_plan(self, body: master_api.PlanRequest) -> PlanRecord:
        """Propose the requested counts as a plan (the trigger applies it)."""
        with self._lock:
            if self.state in TERMINAL_STATES:
                raise ValueError(f"the job is {self.state}: nothing to resize")
            plan = self.spec.plan.with_counts(body.num_workers, body.num_ps)
            record = self.autoscaler.request(time.time(), self.spec.plan, plan, body.reason)
            self.mirror_state(force=True)
            return record

    def apply_plan(self, plan_id: int) -> PlanRecord:
        """Apply a proposed plan (``resize.PlanExecutor``); applying twice is a no-op."""
        with self._lock:
            return self.plans.apply(self._plan(plan_id))

    def decline_plan(self, plan_id: int, reason: str) -> PlanRecord:
        """Decline a proposed plan (a person said no): it is never applied, and the rule that
        proposed it does not propose it again. Raises KeyError for an unknown plan, ValueError
        for one no longer proposed."""
        with self._lock:
            record = self._plan(plan_id)
            if record.state != PlanState.PROPOSED:
                raise ValueError(
                    f"plan {plan_id} is {record.state.value}: only a proposed plan can be declined"
                )
            record.decline(f"declined: {reason}")
            self.autoscaler.declined(time.time())
            log.info("plan %s declined: %s", plan_id, reason)
            self.mirror_state(force=True)
            return record

    def _plan(self, plan_id: int) -> PlanRecord:
        record = next((p for p in self.autoscaler.plans if p.id == plan_id), None)
        if record is None:
            raise KeyError(f"no plan {plan_id}")
        return record

    def cap_data_workers(self, cap: int | None) -> dict[str, Any]:
        """The cluster budget's room for data workers (the trigger's); the section after."""
        with self._lock:
            self.data_workers.cap(cap)
            return self.data_workers.status()

    def request_stop(self, reason: str, final: bool = False) -> None:
        """Stop the job; ``final``: a person decided it, so the task fails without a retry
        (its status's ``failure`` says so)."""
        with self._lock:
            if self.state not in TERMINAL_STATES:
                if final:
                    self.recovery.crashes.failure = {
                        "kind": "stopped",
                        "retryable": False,
                        "reason": reason,
                    }
                self.finish(JobState.STOPPED, reason)

    def fail(self, message: str) -> None:
        with self._lock:
            if self.state not in TERMINAL_STATES:
                self.finish(JobState.FAILED, message)

    def checkpoint(self) -> Any:
        """Take a checkpoint and wait until it is committed (``Checkpointer.checkpoint``)."""
        return self.checkpointer.checkpoint()

    def status(self) -> dict[str, Any]:
        with self._lock:
            return job_status(self)

    def recovery_summary(self) -> dict[str, Any]:
        return recovery_summary(self)

    # -- the supervisor's tick -------------------------------------------------------------------
    def step(self) -> None:
        """One supervision tick: stop the job at its deadline, react to exited nodes, start
        training once every PS is up, train, end."""
        with self._lock:
            if self.state in TERMINAL_STATES or self._stopped_at_deadline():
                return
            if self.state == JobState.PENDING and not self.nodes:
                for i in range(self.spec.plan.num_ps):
                    self.nodes.start(f"ps-{i}", "ps")
            self.recovery.check_exits()
            if self.state in TERMINAL_STATES:
                return
            self.pending_watch.tick()
            if self.state in (JobState.PENDING, JobState.RECOVERING):
                if self.nodes.all_ps_ready(self.spec.plan.num_ps):
                    self._start_training()
            elif self.state == JobState.RUNNING:
                self._train()
            elif self.state == JobState.EVALUATING:
                self.wrap_up.tick()
            if self.state in TRAINING:
                self.throughput_history.record(time.time(), self.throughput.rate())
            self.mirror_state()

    def _stopped_at_deadline(self) -> bool:
        """Past the spec's deadline the job is stopped, whatever it is doing: the supervisor
        then stops every node. Airflow's deferral timeout stops nothing (``docs/operators.md``)."""
        deadline = self.spec.deadline
        if deadline is None or not deadline.passed():
            return False
        self.finish(JobState.STOPPED, deadline.stop_reason())
        return True

    def _start_training(self) -> None:
        """Every PS is up: resume the shards from their ledgers, start the workers."""
        if not self.policy.prepare_ps(self.port):
            return  # a PS could not be reached (or the job ended meanwhile): next tick
        recovered = self.state == JobState.RECOVERING
        if self.dispatch.reconcile_pending:
            if recovered and not self.policy.on_ps_restored(self.port):
                return  # the PS ledgers are needed first: next tick
            if not self.dispatch.reconcile_all():
                return  # the PS ledgers are needed before anyone trains: next tick
            self.dispatch.reconcile_pending = False
            if self.state == JobState.PENDING:  # resuming from a checkpoint
                self.samples_resumed = self.dispatch.applied_samples()
        self.data_workers.tick([])
        for i in range(self.spec.plan.num_workers):
            worker = self.nodes.get(f"worker-{i}")
            if worker is None or worker.exit_code is not None:
                self.nodes.start(f"worker-{i}", "worker")
        if recovered:  # the workers that waited it out reconnect to the relaunched PS
            self.policy.on_recovered(self.port)
            self.ps_set.next()
        self.state, self.message = JobState.RUNNING, "training"
        self.mirror_state(force=True)

    def _train(self) -> None:
        """A tick while the workers train: plans, leases, checkpoints and the end of it."""
        self.policy.poll(self.port)
        if self.state in TERMINAL_STATES:
            return
        self.plans.advance()
        self.recovery.keep_standby()
        self.dispatch.tick()
        if self.dispatch.training_done:
            self.data_workers.stop_all()
        else:
            self.data_workers.tick(self.nodes.training())
        if self.dispatch.training_done and not self.wrap_up.started and not self.policy.busy:
            self.wrap_up.training_over()
        if self.queue.finished:
            if self.wrap_up.ready_without_evaluation():
                self.wrap_up.complete()
        elif self.policy.busy:
            pass  # no checkpoint or plan until the policy has recovered the lost PS
        elif self.plans.resize is None:
            self.checkpointer.tick()
            self.policy.save(self.port)
            self.autoscaling.tick(self.nodes, self.spec.plan, self.queue)
        elif self.checkpointer.pending is not None:
            self.checkpointer.tick()  # only moves the one in flight on: none starts

    def finish(self, state: JobState, message: str) -> None:
        self.state, self.message, self.finished_at = state, message, time.time()
        log.info("job %s: %s", state, message)
        self.mirror_state(force=True)

    def mirror_state(self, force: bool = False) -> None:
        if self._mirror.due(force):
            self._mirror.write(self.status())

    def shutdown_nodes(self) -> None:
        self.nodes.launcher.stop_all()
        with self._lock:
            for node in self.nodes:
                if node.state in (NodeState.STARTING, NodeState.RUNNING):
                    node.state = NodeState.STOPPED
            self.mirror_state(force=True)

    # -- for the rooms and the policy (``core.policies.MasterPort``) ------------------------------
    def set_plan(self, plan: ResourcePlan) -> None:
        self.spec = self.spec.model_copy(update={"plan": plan})
        self.job_dir.write_spec(self.spec)  # a relaunched master keeps the plan

    def lost_ps(self) -> None:
        self.wrap_up.training_resumed()  # the restore may send training back: wrap up again

    @property
    def holding_leases(self) -> bool:
        return self.plans.draining

    @contextlib.contextmanager
    def unlocked(self) -> Iterator[None]:
        """Let the API in while this tick waits on the PS, when the workers train through a
        PS loss: a held lock stalls every lease and report (~0.3 s at a loss, measured).
        ``step`` holds the lock once; what it read before may have moved when this returns."""
        if not self.policy.trains_through_loss(self.state):
            yield
            return
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()

    def ps_client(self) -> PSClient:
        return self.ps.client()

    def applied_everywhere(self, purpose: str) -> set[int] | None:
        return self.ps.applied_everywhere(purpose)

    def ps_recovery_seconds(self) -> list[float]:
        events = self.recovery.recoveries
        return [e["seconds"] for e in events if e["role"] == "ps" and e["seconds"]]

    def record_samples(self) -> None:
        self.throughput.record()

    @property
    def checkpointer(self) -> Checkpointer:
        return self.checkpointing.checkpointer

    @property
    def checkpoints(self) -> int:
        """The number of the last committed checkpoint (0: none)."""
        return self.checkpointer.number

    @property
    def pls(self) -> float:
        return self.lost.pls(self.queue.total_samples, self.spec.plan.num_ps)


def at_least_ps(autoscale: AutoscaleConfig, min_ps: int) -> AutoscaleConfig:
    """``autoscale`` with no fewer PS than the checkpoint policy runs on (ECRM's k + 1)."""
    if autoscale.min_ps >= min_ps:
        return autoscale
    return autoscale.model_copy(update={"min_ps": min_ps})
