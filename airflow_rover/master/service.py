"""The job master's state machine: shard dispatch, node supervision, status and the result.

API handlers and the supervisor loop share one ``JobMaster`` behind a lock. The master mirrors
its status to ``state.json`` on every phase change (and periodically), so the job's outcome is
readable after the master has exited.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from airflow_rover.core.checkpoint_policy import CheckpointCosts, judge_choice, plan_checkpoints
from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.job_dir import JobDir, atomic_write_json, checkpoint_number
from airflow_rover.core.ledger import batch_accounting
from airflow_rover.core.plans import PlanRecord
from airflow_rover.core.shards import Shard, ShardQueue
from airflow_rover.core.spec import JobSpec, ResourcePlan
from airflow_rover.core.states import TERMINAL_STATES, JobState, NodeState
from airflow_rover.core.throughput import JobShape
from airflow_rover.data.reader import open_dataset
from airflow_rover.master.autoscaler import Autoscaler, Profiler
from airflow_rover.master.checkpointer import Checkpointer, CheckpointTimes
from airflow_rover.master.node_launcher import Capability, NodeLauncher, Role
from airflow_rover.rpc import master_api
from airflow_rover.rpc.ps_client import PSClient
from airflow_rover.storage import CheckpointMirror, open_store, restore_latest_checkpoint

log = logging.getLogger(__name__)

THROUGHPUT_WINDOW_S = 10.0
STRAGGLER_RATIO = 0.5
STATE_MIRROR_INTERVAL_S = 2.0
MIRROR_FLUSH_TIMEOUT_S = 600.0
LAYOUT_WAITERS = 16  # requests that may wait for a new PS layout at once (``cluster(after=)``)
MAX_LAYOUT_WAIT_S = 5.0
PARTIAL_RECOVERY_KEY = "partial_recovery"  # in queue.json: CPR's lost updates at the snapshot


class NodeInfo:
    def __init__(self, node_id: str, role: Role) -> None:
        self.node_id = node_id
        self.role = role
        self.state = NodeState.STARTING
        self.address: str | None = None
        self.steps = 0
        self.samples = 0
        self.step_time_ms = 0.0
        self.last_seen = time.time()
        self.exit_code: int | None = None
        self.stopping = False  # the master stopped it: its exit is not a failure
        self.replacing = False  # deleted to come back at a new size: relaunched, not a failure
        self.restarts = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.node_id,
            "role": self.role,
            "state": str(self.state),
            "address": self.address,
            "steps": self.steps,
            "samples": self.samples,
            "step_time_ms": round(self.step_time_ms, 3),
            "exit_code": self.exit_code,
            "restarts": self.restarts,
        }


@dataclass
class Resize:
    """A PS resize in progress (``docs/elastic-scaling.md``): the new PS start while training
    goes on (``starting``); then leases stop until every leased shard is done and no
    checkpoint is in flight (``draining``); then the rows move and training resumes."""

    record: PlanRecord
    plan: ResourcePlan
    old_num_ps: int
    phase: str = "starting"
    paused_at: float | None = None


class JobMaster:
    def __init__(
        self,
        layout: JobDir,
        spec: JobSpec,
        launcher: NodeLauncher,
        token: str,
        master_restarts: int = 0,
        wake: threading.Event | None = None,
    ) -> None:
        """``wake``: set when the supervisor should tick now, not at its next tick (a node is
        ready: a relaunched PS, say, that the workers wait for)."""
        self.wake = wake or threading.Event()
        self.layout = layout
        self.spec = spec
        self.launcher = launcher
        self._token = token
        self.features = spec.resolved_features
        num_samples = open_dataset(spec.train_data).num_samples
        t, r = spec.training, spec.recovery
        self.queue = ShardQueue(
            num_samples, t.shard_size, t.epochs, t.batch_size, r.max_shard_failures
        )
        self.mirror = (
            None
            if spec.checkpoint_uri is None
            else CheckpointMirror(open_store(spec.checkpoint_uri))
        )
        checkpoint = layout.latest_checkpoint()
        if checkpoint is None and self.mirror is not None:  # e.g. a retry on another machine
            fetched = restore_latest_checkpoint(self.mirror.store, layout.checkpoints)
            if fetched is not None:
                layout.commit_checkpoint(fetched)
                checkpoint = layout.latest_checkpoint()
        self.resumed_from: str | None = None
        saved: dict[str, Any] = {}
        if checkpoint is not None and (checkpoint / "queue.json").exists():
            saved = layout.read_json(checkpoint / "queue.json") or {}
            self.queue = ShardQueue.from_dict(saved)
            self.queue.release_all()
            self.resumed_from = str(checkpoint)
        self._drop_partial_saves("of the previous attempt")
        self._reconcile_pending = checkpoint is not None  # once the PS are up, ask their ledgers
        self._unreconciled: list[Shard] = []  # to resume from the PS ledgers at the next tick
        self._recheck: set[int] = set()  # shards leased through an ECRM loss (``shard_done``)
        # ECRM: parity is kept once every PS was set up (re-encoded from restored rows); a lost
        # PS's replacement is rebuilt from it (``ps.ecrm``).
        self._ecrm_live = False
        # A rebuild a former master left unfinished: these PS restore from the checkpoint now.
        shutil.rmtree(layout.ecrm_rebuild_marker(0).parent, ignore_errors=True)
        self._ecrm_encode = checkpoint is not None
        self._ecrm_pending: set[int] = set()  # replacements to rebuild once they are up
        self.rebuilds: dict[int, dict[str, Any]] = {}  # PS index -> its last rebuild
        self.checkpointer = Checkpointer(
            layout,
            spec.recovery.checkpoint_interval_s,
            self._ps_client,
            lambda: {
                **self.queue.to_dict(),
                "job_id": self.spec.job_id,  # whose it is
                PARTIAL_RECOVERY_KEY: {"batches": self.lost_batches, "samples": self.lost_samples},
            },
            0 if checkpoint is None else int(checkpoint.name.rsplit("-", 1)[1]),
            on_commit=self._checkpoint_committed,
        )
        # The checkpoint policy in effect (CPR may fall back to full recovery once the save
        # and load costs are measured) and what partial recovery lost so far.
        self.policy: str = spec.checkpoint.policy
        self.policy_reason = "as requested"
        self.policy_advice: str | None = None  # a cheaper policy, from the measured costs
        # Updates CPR forgave before the checkpoint resumed from are lost in the model it
        # holds (its ledgers count them as applied): they stay in the job's PLS.
        lost = saved.get(PARTIAL_RECOVERY_KEY, {})
        self.lost_batches = int(lost.get("batches", 0))
        self.lost_samples = int(lost.get("samples", 0))
        self._last_partial = time.time()
        self._wrapping_up = False  # training done: final checkpoint taken, evaluation started
        self._durable_wait_since: float | None = None
        self.partial_saves = 0
        self.restarts = 0
        self.recoveries: list[dict[str, Any]] = []
        self.standby_takeovers = 0  # lost PS replaced by the spare process (recovery.standby_ps)
        self.samples_resumed = 0  # samples whose batches every PS had applied at the start
        profiles = launcher.can(Capability.PROFILE)
        self.profiler = Profiler(launcher.pid if profiles else lambda _node: None)
        self.autoscaler = Autoscaler(
            spec.autoscale,
            JobShape.of(spec),
            launcher.capacity_cpu,
        )
        self._last_autoscale = 0.0
        self._tick_samples: tuple[dict[str, int], float | None] = ({}, None)
        self.master_restarts = master_restarts
        if master_restarts:  # a keeper relaunched this master: time its recovery
            deaths = (layout.read_json(layout.keeper_file) or {}).get("master_deaths")
            died_at = deaths[-1]["died_at"] if deaths else time.time()
            self.recoveries.append(
                {
                    "node": "master",
                    "role": "master",
                    "cause": "the job master died",
                    "detected_at": died_at,
                    "ready_at": None,
                    "seconds": None,
                }
            )
        self.state = JobState.PENDING
        self.message = "starting parameter servers"
        self.nodes: dict[str, NodeInfo] = {}
        self.started_at = time.time()
        self.train_started_at: float | None = None
        self.train_finished_at: float | None = None
        self.finished_at: float | None = None
        self.evaluation: dict[str, Any] | None = None
        self.result: dict[str, Any] | None = None
        self._samples_log: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.RLock()
        self._layout_changed = threading.Condition(self._lock)  # ps_set_version moved on
        self._layout_waits = threading.BoundedSemaphore(LAYOUT_WAITERS)
        self._last_mirror = 0.0
        self.resize: Resize | None = None
        self.ps_set_version = 0  # bumped by every PS resize; workers switch when they see it

    # -- API operations (called from request handlers) ---------------------------------------
    def cluster(self, after: int | None = None, wait_s: float = 0.0) -> master_api.ClusterInfo:
        """The PS addresses and the layout version. With ``after``: first wait, up to
        ``wait_s``, for a layout past it, so that a worker waiting out a lost PS hears of its
        replacement at once rather than at its next poll. At most ``LAYOUT_WAITERS`` requests
        wait (each holds a server thread); the others are answered at once."""
        waits = after is not None and wait_s > 0 and self._layout_waits.acquire(blocking=False)
        try:
            with self._lock:
                if waits:
                    seen = after or 0
                    self._layout_changed.wait_for(lambda: self.ps_set_version > seen, wait_s)
                ps = [
                    self.nodes[f"ps-{i}"].address
                    for i in range(self.spec.plan.num_ps)
                    if f"ps-{i}" in self.nodes
                ]
                if len(ps) != self.spec.plan.num_ps or any(a is None for a in ps):
                    raise LookupError("parameter servers are not all ready yet")
                return master_api.ClusterInfo(
                    job_id=self.spec.job_id,
                    ps=[a for a in ps if a],
                    ps_set_version=self.ps_set_version,
                )
        finally:
            if waits:
                self._layout_waits.release()

    def _next_layout(self) -> None:
        """The PS changed (a relaunch or a resize): workers switch when they see the version."""
        self.ps_set_version += 1
        self._layout_changed.notify_all()

    def node_ready(self, node_id: str, body: master_api.NodeReady) -> None:
        with self._lock:
            node = self._node(node_id)
            node.state = NodeState.RUNNING
            node.address = body.address
            node.last_seen = time.time()
            for event in self.recoveries:
                back = event["node"] == node_id or (
                    event["role"] == "master" and node.role == "worker"
                )
                if back and event["ready_at"] is None:
                    event["ready_at"] = node.last_seen
                    event["seconds"] = round(node.last_seen - event["detected_at"], 3)
            if node.role == "worker" and self.train_started_at is None:
                self.train_started_at = node.last_seen  # the training clock: first worker ready
            log.info("node %s ready%s", node_id, f" at {body.address}" if body.address else "")
        self.wake.set()

    def heartbeat(self, node_id: str, body: master_api.Heartbeat) -> bool:
        """Record a node's progress; returns True when the node should stop."""
        with self._lock:
            node = self._node(node_id)
            node.steps, node.samples, node.step_time_ms = (
                body.steps,
                body.samples,
                body.step_time_ms,
            )
            node.last_seen = time.time()
            self.queue.renew(node_id, time.time(), self.spec.training.shard_lease_s)
            self._record_samples()
            return self.state in TERMINAL_STATES

    def lease(self, node_id: str, ps_set_version: int | None = None) -> master_api.LeaseReply:
        with self._lock:
            self._node(node_id).last_seen = time.time()
            version = self.ps_set_version
            if self.state != JobState.RUNNING and not self._training_through_loss:
                done = self.state in TERMINAL_STATES or self.state == JobState.EVALUATING
                return master_api.LeaseReply(
                    status="done" if done else "wait", ps_set_version=version
                )
            if ps_set_version is not None and ps_set_version != version:
                return master_api.LeaseReply(status="wait", ps_set_version=version)
            if self.resize is not None and self.resize.phase == "draining":
                return master_api.LeaseReply(status="wait", ps_set_version=version)
            shard = self.queue.lease(
                node_id, time.time(), self.spec.training.shard_lease_s, self._slice_for(node_id)
            )
            if shard is not None:
                return master_api.LeaseReply(
                    status="ok",
                    shard=master_api.ShardOut(
                        shard_id=shard.shard_id,
                        epoch=shard.epoch,
                        start=shard.start,
                        end=shard.end,
                        first_key=self.queue.first_key(shard),
                    ),
                    ps_set_version=version,
                )
            # Nothing to hand out: others still hold shards that may come back if they die.
            return master_api.LeaseReply(
                status="done" if self.queue.finished else "wait", ps_set_version=version
            )

    def _slice_for(self, node_id: str) -> int | None:
        """Batches a straggler may lease at once: a worker slower than ``STRAGGLER_RATIO`` of
        the fastest gets a slice of a shard in proportion to its speed, so it never holds a
        whole shard back at the end of an epoch; others get whole shards (None)."""
        times = {
            n.node_id: n.step_time_ms
            for n in self.nodes.values()
            if n.role == "worker" and n.state == NodeState.RUNNING and n.step_time_ms > 0
        }
        if node_id not in times or len(times) < 2:
            return None
        relative = min(times.values()) / times[node_id]  # 1.0 for the fastest worker
        if relative >= STRAGGLER_RATIO:
            return None
        return max(1, int(self.queue.batch_keys.per_shard * relative))

    def shard_done(self, shard_id: int, body: master_api.ShardDone) -> bool:
        with self._lock:
            accepted = self.queue.complete(shard_id, body.node_id)
            if not accepted:
                log.warning("rejected completion of shard %d by %s", shard_id, body.node_id)
            elif shard_id in self._recheck:  # reopened at the first batch some PS lacks
                self._recheck.discard(shard_id)  # (next tick: the ledgers are not read here)
                self._unreconciled.append(self.queue.static(shard_id))
            return accepted

    def release_shards(self, node_id: str) -> int:
        """A worker that lost a PS and gave up on what it was training gives its shards back,
        once it is connected to the replacement: each resumes at its first batch some PS
        lacks. (Under ECRM a lost PS does not release the workers' shards: they train on
        through it, ``core.ecrm.degraded``.)"""
        with self._lock:
            self._node(node_id)
            released = self.queue.release_worker(node_id)
            if released and not self._reconcile(released):
                self._unreconciled.extend(released)  # ledgers unreadable: again next tick
            return len(released)

    def report_evaluation(self, body: master_api.EvalReport) -> None:
        """Accept the held-out score only from the evaluator node, only while evaluating."""
        with self._lock:
            node = self._node(body.node_id)
            if node.role != "evaluator" or self.state != JobState.EVALUATING:
                raise PermissionError(
                    f"{body.node_id} may not report an evaluation while the job is {self.state}"
                )
            self.evaluation = {"auc": body.auc, "logloss": body.logloss, "samples": body.samples}
            log.info("held-out evaluation: %s", self.evaluation)

    def request_stop(self, reason: str) -> None:
        with self._lock:
            if self.state not in TERMINAL_STATES:
                self._finish(JobState.STOPPED, reason)

    def fail(self, message: str) -> None:
        with self._lock:
            if self.state not in TERMINAL_STATES:
                self._finish(JobState.FAILED, message)

    def _node(self, node_id: str) -> NodeInfo:
        node = self.nodes.get(node_id)
        if node is None:
            raise KeyError(f"unknown node {node_id!r}")
        return node

    # -- status ------------------------------------------------------------------------------
    def _record_samples(self) -> None:
        now = time.time()
        total = sum(n.samples for n in self.nodes.values() if n.role == "worker")
        self._samples_log.append((now, total))
        while self._samples_log and self._samples_log[0][0] < now - THROUGHPUT_WINDOW_S:
            self._samples_log.popleft()

    def throughput(self) -> float:
        if len(self._samples_log) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self._samples_log[0], self._samples_log[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    def status(self) -> dict[str, Any]:
        with self._lock:
            done = self.queue.done_samples
            total = self.queue.total_samples
            end = self.finished_at or time.time()
            return {
                "job_id": self.spec.job_id,
                "state": str(self.state),
                "message": self.message,
                "progress": {
                    "samples_done": done,
                    "samples_total": total,
                    "fraction": round(done / total, 6),
                    "shards": self.queue.counts(),
                },
                "throughput": round(self.throughput(), 1),
                "plan": self.spec.plan.model_dump(),
                "nodes": [n.to_dict() for n in self.nodes.values()],
                "evaluation": self.evaluation,
                "started_at": self.started_at,
                "finished_at": self.finished_at,
                "duration_s": round(end - self.started_at, 3),
                "recovery": self._recovery_summary(),
                "plans": [p.to_json() for p in self.autoscaler.plans],
                "profile": self.autoscaler.report(self.profiler),
                "result": self.result,
            }

    def owns_job_dir(self) -> bool:
        """False once another master (a relaunch) has announced itself in this job dir."""
        announced = self.layout.master_info()
        return not announced or announced.get("pid") == os.getpid()

    def mirror_state(self, force: bool = False) -> None:
        now = time.time()
        if (force or now - self._last_mirror >= STATE_MIRROR_INTERVAL_S) and self.owns_job_dir():
            atomic_write_json(self.layout.state_file, self.status())
            self._last_mirror = now

    # -- supervision (the supervisor thread) -------------------------------------------------
    def _start(self, node_id: str, role: Role) -> None:
        self.nodes[node_id] = NodeInfo(node_id, role)
        self.launcher.start(node_id, role)

    def _finish(self, state: JobState, message: str) -> None:
        self.state = state
        self.message = message
        self.finished_at = time.time()
        log.info("job %s: %s", state, message)
        self.mirror_state(force=True)

    def step(self) -> None:
        """One supervision tick: react to exited nodes, expired leases and phase ends."""
        with self._lock:
            if self.state in TERMINAL_STATES:
                return
            if self.state == JobState.PENDING and not self.nodes:
                for i in range(self.spec.plan.num_ps):
                    self._start(f"ps-{i}", "ps")
            self._check_exits()
            if self.state in TERMINAL_STATES:
                return
            if self.state in (JobState.PENDING, JobState.RECOVERING) and self._all_ps_ready():
                if self._ecrm and not self._ecrm_ready():
                    return  # a PS could not be reached (or the job ended meanwhile): next tick
                if self._reconcile_pending:
                    partial = self.state == JobState.RECOVERING and self.policy == "cpr"
                    if partial and not self._forgive_lost():
                        return  # the PS ledgers are needed first: next tick
                    if not self._reconcile_all():
                        return  # the PS ledgers are needed before anyone trains: next tick
                    self._reconcile_pending = False
                    if self.state == JobState.PENDING:  # resuming from a checkpoint
                        self.samples_resumed = self._applied_samples()
                recovered = self.state == JobState.RECOVERING
                for i in range(self.spec.plan.num_workers):
                    worker = self.nodes.get(f"worker-{i}")
                    if worker is None or worker.exit_code is not None:
                        self._start(f"worker-{i}", "worker")
                if recovered and self._ecrm:
                    # The workers trained on through the loss and keep their shards; one may
                    # hold a batch the lost PS applied but never passed on to its holders,
                    # which the replacement lacks: checked when the shard is reported done.
                    self._recheck.update(self.queue.leased())
                if recovered:  # the workers that waited it out reconnect to the relaunched PS
                    self._next_layout()
                self.state = JobState.RUNNING
                self.message = "training"
                self.mirror_state(force=True)
            elif self.state == JobState.RUNNING:
                if self._rebuilding:
                    self._poll_rebuilds()
                    if self.state in TERMINAL_STATES:
                        return
                if self.resize is not None:
                    self._advance_resize(self.resize)
                if self._standby is not None and not self._rebuilding:
                    self._standby.start_standby()  # not while recovering: it takes a core
                expired = self.queue.expire(time.time())
                for shard in expired:
                    log.warning("lease of shard %d expired; back to TODO", shard.shard_id)
                self._reconcile(expired)
                if self._unreconciled and self._reconcile(self._unreconciled):
                    self._unreconciled = []
                finished = self.queue.finished and not self._unreconciled
                if finished and not self._wrapping_up and not self._rebuilding:
                    self._wrapping_up = True  # until a PS restore sends training back
                    if self.resize is not None:
                        self._cancel_resize(self.resize, "training ended before the PS resize")
                    self.train_finished_at = time.time()
                    self._record_samples()
                    if self.spec.recovery.checkpoint_interval_s > 0:
                        self.checkpoint()  # a failure from here on does not retrain anything
                    if self.spec.eval_data:
                        self.state = JobState.EVALUATING
                        self.evaluation = None  # a PS restore may have sent training back
                        self.message = "scoring the held-out split"
                        self._start("evaluator", "evaluator")
                        self.mirror_state(force=True)
                if self.queue.finished:
                    if self._wrapping_up and self.state == JobState.RUNNING and self._durable():
                        self._complete()
                elif self._rebuilding:
                    pass  # no checkpoint or plan until the replacement holds all its rows
                elif self.resize is None:
                    self.checkpointer.tick()
                    self._partial_tick()
                    self._autoscale()
                elif self.checkpointer.pending is not None:
                    self.checkpointer.tick()  # only moves the one in flight on: none starts
            elif (
                self.state == JobState.EVALUATING
                and self._evaluation_finished()
                and self._durable()
            ):
                self._complete()
            self.mirror_state()

    def _durable(self) -> bool:
        """Whether the last checkpoint is copied to ``checkpoint_uri`` (or there is none to
        copy), asked on each tick: the job reports success once it is, or once
        ``MIRROR_FLUSH_TIMEOUT_S`` has passed, saying so. Never waited for under the lock: the
        API (status, the trigger) keeps answering meanwhile."""
        if self.mirror is None or self.mirror.flush(timeout=0):
            return True
        now = time.time()
        if self._durable_wait_since is None:
            self._durable_wait_since = now
            self.message = f"copying the last checkpoint to {self.spec.checkpoint_uri}"
            self.mirror_state(force=True)
        return now - self._durable_wait_since > MIRROR_FLUSH_TIMEOUT_S

    def _evaluation_finished(self) -> bool:
        return self.evaluation is not None and self.nodes["evaluator"].exit_code is not None

    def _all_ps_ready(self) -> bool:
        ps = [self.nodes.get(f"ps-{i}") for i in range(self.spec.plan.num_ps)]
        return all(n is not None and n.state == NodeState.RUNNING and n.address for n in ps)

    def _ps_client(self) -> PSClient:
        return PSClient(self.cluster().ps, self._token)

    # -- recovery ----------------------------------------------------------------------------
    def _check_exits(self) -> None:
        exits = [(n, c) for n, c in self.launcher.exit_codes().items() if c is not None]
        exits.sort(key=lambda item: self.nodes[item[0]].role != "ps")  # PS first
        for node_id, code in exits:
            node = self.nodes[node_id]
            if node.exit_code is not None:
                continue
            node.exit_code = code
            if node.stopping:
                node.state = NodeState.STOPPED
                continue
            # A PS is never done by itself: one that exits 0 unasked was stopped by someone
            # else (a SIGTERM), and its rows are lost.
            if code == 0 and node.role != "ps":
                node.state = NodeState.SUCCEEDED
                continue
            node.state = NodeState.FAILED
            cause = f"{node_id} exited with code {code}"
            replaced, node.replacing = node.replacing, False
            if replaced:
                cause = f"{node_id} replaced to resize it"
            released = self._worker_lost(node, code, replaced) if node.role == "worker" else []
            # a worker that lost its PS is not at fault, nor a node replaced to resize it:
            # their restarts do not count
            counted = not replaced and not (
                node.role == "worker" and code == master_api.EXIT_PS_LOST
            )
            if counted and self.restarts >= self.spec.recovery.max_node_restarts:
                tail = _tail(self.layout.log_file(node_id))
                self._finish(
                    JobState.FAILED,
                    f"{cause}; no restarts left ({self.restarts} used, "
                    f"recovery.max_node_restarts={self.spec.recovery.max_node_restarts}); "
                    f"{len(released)} shard(s) returned to TODO. Last log lines:\n{tail}",
                )
                return
            if node.role == "ps":
                self._ps_lost(node, cause, counted)
            elif (node.role, self.state) in (
                ("evaluator", JobState.EVALUATING),
                ("worker", JobState.RUNNING),
            ):
                self._restart(node, cause, counted)
            # a worker lost during PS recovery is started with the others when the PS is back

    def _worker_lost(self, node: NodeInfo, code: int, replaced: bool = False) -> list[Shard]:
        """Requeue a dead worker's shards from their first batch some PS has not applied; a
        death that was not the PS's fault counts against the shards (poison quarantine)."""
        failed = code != master_api.EXIT_PS_LOST and not replaced
        before = set(self.queue.quarantined)
        released = self.queue.release_worker(node.node_id, failed=failed)
        for shard in self.queue.quarantined_shards():
            if shard["shard_id"] not in before:
                log.error(
                    "shard %d (epoch %d, samples %d-%d) quarantined after %d worker deaths",
                    shard["shard_id"],
                    shard["epoch"],
                    shard["start"],
                    shard["end"],
                    shard["failures"],
                )
        if self.state == JobState.RUNNING:
            self._reconcile(released)
        else:
            self._reconcile_pending = True
        return released

    def _ps_lost(self, node: NodeInfo, cause: str, counted: bool = True) -> None:
        """Stop the workers, relaunch the PS (it restores its partition from the last
        checkpoint, or under ECRM starts empty and is rebuilt from parity once it is up), and
        then resume the queue from every PS's ledger."""
        index = int(node.node_id.rsplit("-", 1)[1])
        if self._ecrm_live:
            others = sorted(
                i for i in (*self._ecrm_pending, *self._active_rebuilds()) if i != index
            )
            if others:
                self._finish(
                    JobState.FAILED,
                    f"{cause} while ps-{others[0]} is being rebuilt from parity: ECRM recovers "
                    "one lost PS at a time; a retry resumes from the last checkpoint",
                )
                return
            marker = self.layout.ecrm_rebuild_marker(index)
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            self._ecrm_pending.add(index)
        self.state = JobState.RECOVERING
        self._wrapping_up = False  # the restore may send training back: wrap up again
        how = "to rebuild it from parity (ECRM)" if self._ecrm_live else "from the last checkpoint"
        self.message = f"{cause}; relaunching it {how}"
        log.warning(self.message)
        for other in self.nodes.values():
            if other.role == "evaluator" and other.exit_code is None:
                other.stopping = True  # it scores again once training is over
                self.launcher.stop(other.node_id)
            if other.role == "worker" and not self._ecrm_live:
                # it waits for the PS (``worker.training.train``); under ECRM it trains on
                # and gives its shards back once its held pushes reached the replacement
                self.queue.release_worker(other.node_id)
        self._reconcile_pending = True
        node.address = None
        self._restart(node, cause, counted)
        self.mirror_state(force=True)

    def _restart(self, node: NodeInfo, cause: str, counted: bool = True) -> None:
        self.restarts += counted
        self.recoveries.append(
            {
                "node": node.node_id,
                "role": node.role,
                "cause": cause,
                "detected_at": time.time(),
                "ready_at": None,
                "seconds": None,
            }
        )
        restarts = node.restarts + 1
        spare = self._standby if node.role == "ps" else None
        if spare is not None and spare.take_standby(node.node_id):
            self.nodes[node.node_id] = NodeInfo(node.node_id, node.role)
            self.standby_takeovers += 1
            how = "a spare PS took over"
        else:
            self._start(node.node_id, node.role)
            how = "relaunched it"
        self.nodes[node.node_id].restarts = restarts
        log.warning("%s; %s (restart %d of the job)", cause, how, self.restarts)

    @property
    def _standby(self) -> NodeLauncher | None:
        """The launcher, if the job keeps a spare PS (``recovery.standby_ps``) and it can."""
        launcher = self.launcher
        if self.spec.recovery.standby_ps and launcher.can(Capability.STANDBY):
            return launcher
        return None

    # -- ECRM (``ps.ecrm``) -------------------------------------------------------------------
    @property
    def _ecrm(self) -> bool:
        return self.spec.checkpoint.policy == "ecrm"

    def _ecrm_ready(self) -> bool:
        """Before anyone trains: set ECRM up on every PS (its parity re-encoded from the rows a
        restore brought), or start the rebuild of each replacement PS; False (logged) if a PS
        could not be reached."""
        cfg = self.spec.checkpoint.ecrm
        num_ps = self.spec.plan.num_ps
        addresses = self.cluster().ps
        epochs = [self.nodes[f"ps-{i}"].restarts for i in range(num_ps)]
        try:
            client = self._ps_client()
            try:
                if not self._ecrm_live:
                    client.ecrm_setup(
                        cfg.k, cfg.rows_per_lock, addresses, epochs, self._ecrm_encode
                    )
                    self._ecrm_live = True
                    log.info("ECRM: parity of k=%d rows on the next PS, %d PS", cfg.k, num_ps)
                for index in sorted(self._ecrm_pending):
                    # the replacement's set-up (~0.1 s): the workers train on meanwhile
                    with self._unlocked():
                        reply = client.ecrm_rebuild(
                            index, cfg.k, cfg.rows_per_lock, addresses, epochs
                        )
                    if self.state in TERMINAL_STATES:
                        return False
                    self._ecrm_pending.discard(index)
                    self.rebuilds[index] = {
                        "node": f"ps-{index}",
                        "incarnation": epochs[index],
                        "started_at": time.time(),
                        "done": False,
                        "rows": int(reply.get("rows_total", [0])[0]),
                    }
            finally:
                client.close()
        except grpc.RpcError as exc:
            log.warning("ECRM setup or rebuild could not reach a PS (%s); next tick", exc)
            return False
        return True

    @property
    def _training_through_loss(self) -> bool:
        """A lost PS's replacement is on its way under ECRM: the workers train on meanwhile
        (their pushes for it held, ``core.ecrm.degraded``), so shards are still handed out; the ones
        leased then are checked against the ledgers when done, like those leased at the
        loss."""
        return (
            self.state == JobState.RECOVERING
            and self._ecrm_live
            and bool(self._ecrm_pending or self._rebuilding)
        )

    @contextlib.contextmanager
    def _unlocked(self) -> Iterator[None]:
        """Let the API in while this tick waits on the PS, when the workers train through
        an ECRM loss: a held lock stalls every lease and report (~0.3 s at a loss, measured).
        ``step`` holds the lock once; what it read before may have moved when this returns."""
        if not self._training_through_loss:
            yield
            return
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()

    def _active_rebuilds(self) -> list[int]:
        return [i for i, r in self.rebuilds.items() if not r["done"]]

    @property
    def _rebuilding(self) -> bool:
        return bool(self._active_rebuilds())

    def _poll_rebuilds(self) -> None:
        """Follow each replacement's rebuild; once done, its checkpoints and plans resume."""
        for index in self._active_rebuilds():
            record = self.rebuilds[index]
            try:
                client = self._ps_client()
                try:
                    status = client.ecrm_status(index)
                finally:
                    client.close()
            except (LookupError, grpc.RpcError):
                continue  # the replacement died: the exit is handled as a PS loss
            if int(status["rebuilding"][0]):
                continue
            record.update(
                done=True,
                rows=int(status["rows_total"][0]),
                chunks=int(status["chunks"][0]),
                seconds=round(float(status["seconds"][0]), 3),
                rows_seconds=round(float(status["rows_seconds"][0]), 3),
                held_rows=int(status["held_rows"][0]),
                degraded_rows=int(status["degraded_rows"][0]),
                # when the PS finished, not when this (ticking) master asked
                finished_at=float(status["done_unix"][0]) if "done_unix" in status else time.time(),
            )
            self.layout.ecrm_rebuild_marker(index).unlink(missing_ok=True)
            if "error" in status:
                error = status["error"].tobytes().decode()
                record["error"] = error
                self._finish(JobState.FAILED, f"ps-{index}: ECRM rebuild failed: {error}")
                return
            log.info(
                "ps-%d rebuilt from parity: %d rows and parity slots in %.2f s while training "
                "went on (%d updates held, %d rows served by decoding)",
                index,
                record["rows"],
                record["seconds"],
                record["held_rows"],
                record["degraded_rows"],
            )

    def _applied_everywhere(self, purpose: str) -> set[int] | None:
        """The batch keys every PS has applied, or None (logged) if a PS cannot say."""
        try:
            client = self._ps_client()
            try:
                ledgers = client.ledgers()
            finally:
                client.close()
        except (LookupError, grpc.RpcError) as exc:
            log.warning("PS ledgers unreadable (%s); %s", exc, purpose)
            return None
        return set.intersection(*(applied for applied, _ in ledgers))

    def _reconcile(self, shards: list[Shard]) -> bool:
        """Resume the given shards from the PS ledgers (``ShardQueue.reconcile``); False if
        the ledgers could not be read (the PS turn retried batches away anyway)."""
        if not shards:
            return True
        applied = self._applied_everywhere("shards resume where they were")
        if applied is None:
            return False
        self.queue.reconcile(shards, applied)
        return True

    def _reconcile_all(self) -> bool:
        """``_reconcile`` of every shard. Through an ECRM loss the ledgers are read with the
        API let in (``_unlocked``); a shard leased meanwhile is left out of that read, which
        may predate its batches: it is checked against ledgers read later, at the next tick
        (done or given back by then) or once done (still leased: ``_recheck``)."""
        shards = self.queue.shards()
        if not self._training_through_loss:
            return self._reconcile(shards)
        leases = self.queue.leases.copy()
        with self._unlocked():
            applied = self._applied_everywhere("shards resume where they were")
        if applied is None or self.state in TERMINAL_STATES:
            return False
        moved = {s.shard_id for s in shards if self.queue.leases[s.shard_id] != leases[s.shard_id]}
        held = set(self.queue.leased())  # checked once done (``_recheck``)
        self._unreconciled.extend(self.queue.static(i) for i in sorted(moved - held))
        self.queue.reconcile([s for s in shards if s.shard_id not in moved], applied)
        return True

    def _forgive_lost(self) -> bool:
        """Partial recovery (CPR): the batches a restored PS lost are not trained again. Each
        PS records the batches it lacks as applied, and the lost samples count towards the
        job's PLS (portion of lost samples, ``docs/checkpoint-policies.md``)."""
        try:
            client = self._ps_client()
            try:
                ledgers = [applied for applied, _ in client.ledgers()]
                anywhere = set.union(*ledgers)
                missing = [anywhere - applied for applied in ledgers]
                client.forgive(missing)
            finally:
                client.close()
        except (LookupError, grpc.RpcError) as exc:
            log.warning("PS ledgers unreadable (%s); partial recovery waits", exc)
            return False
        lost = set().union(*missing)
        samples = self.queue.samples_in(lost)
        self.lost_batches += len(lost)
        self.lost_samples += samples
        log.warning(
            "partial recovery: %d batches (%d samples) lost on the restored PS, not retrained; "
            "PLS now %.5f",
            len(lost),
            samples,
            self.pls,
        )
        return True

    def _drop_partial_saves(self, which: str) -> None:
        """CPR's partial saves hold rows trained past their checkpoint: right for one PS lost
        under partial recovery (its missing batches are forgiven), wrong wherever those
        batches are trained again. So they go when a new master resumes the whole job from
        its checkpoint (before any PS starts), and when the job stops running as CPR (its
        benefit check fell back to full recovery)."""
        stale = self.layout.partial_dirs()
        for directory in stale:
            shutil.rmtree(directory, ignore_errors=True)
        if stale:
            log.info("dropped %d CPR partial saves %s", len(stale), which)

    def _partial_tick(self) -> None:
        """CPR-MFU/SSU: every ``r * T_save`` each PS saves its ``r`` most-used (or sampled)
        rows next to the last checkpoint; a restored PS takes them over the checkpoint's."""
        cpr = self.spec.checkpoint.cpr
        base = self.checkpointer.number
        if self.policy != "cpr" or cpr.variant == "vanilla" or base == 0:
            return
        now = time.time()
        if now - self._last_partial < cpr.r * self.checkpointer.interval_s:
            return
        self._last_partial = now
        directory = self.layout.partial_dir(base, len(self.layout.partial_dirs(base)) + 1)
        try:
            client = self._ps_client()
            try:
                rows = client.partial_save(directory, cpr.variant, cpr.r)
            finally:
                client.close()
        except (LookupError, grpc.RpcError) as exc:
            log.warning("partial save %s failed (%s); the next one is due", directory.name, exc)
            return
        self.partial_saves += 1
        log.info("partial save %s (%s): %d rows", directory.name, cpr.variant, rows)

    @property
    def pls(self) -> float:
        """Portion of lost samples: lost updates over all samples times the embedding PS."""
        total = self.queue.total_samples * self.spec.plan.num_ps
        return self.lost_samples / total if total else 0.0

    def _checkpoint_committed(self, directory: Path, times: CheckpointTimes) -> None:
        """Copy it to durable storage (``checkpoint_uri``, in the background); with a known
        failure rate, re-plan the checkpoint interval (and CPR's benefit check) from what this
        checkpoint cost (``core.checkpoint_policy.plan_checkpoints``)."""
        if self.mirror is not None:
            self.mirror.submit(directory)
        kept = {checkpoint_number(d.name) for d in self.layout.checkpoint_dirs()}
        for partial in self.layout.partial_dirs():  # partial saves of removed checkpoints
            if int(partial.name.split("-")[1]) not in kept:
                shutil.rmtree(partial, ignore_errors=True)
        cfg = self.spec.checkpoint
        if cfg.mtbf_s is None:
            return
        restores = [e["seconds"] for e in self.recoveries if e["role"] == "ps" and e["seconds"]]
        costs = CheckpointCosts(
            save_s=max(times.pause_s, 1e-3),
            load_s=statistics.median(restores) if restores else times.durable_s,
            mtbf_s=cfg.mtbf_s,
            num_emb_ps=self.spec.plan.num_ps,
        )
        plan = plan_checkpoints(cfg, costs)
        if plan.interval_s is not None:
            self.checkpointer.interval_s = plan.interval_s
        if (plan.policy, plan.reason) != (self.policy, self.policy_reason):
            log.info("checkpoint policy %s: %s", plan.policy, plan.reason)
        self.policy, self.policy_reason = plan.policy, plan.reason
        if self.policy != "cpr":
            self._drop_partial_saves(f"(the job runs as {self.policy} now)")
        advice = judge_choice(cfg, costs)
        if advice is not None and advice != self.policy_advice:
            log.warning("%s", advice)  # once per change: the costs are measured each time
        self.policy_advice = advice

    def _applied_samples(self) -> int:
        """Samples whose batches every PS has applied (0 if a PS cannot say)."""
        applied = self._applied_everywhere("resumed samples not counted")
        return 0 if applied is None else self.queue.samples_in(applied)

    # -- resources ---------------------------------------------------------------------------
    def _autoscale(self) -> None:
        """Profile the nodes and let the autoscaler propose a plan (the trigger applies it)."""
        now = time.time()
        if now - self._last_autoscale < self.spec.autoscale.interval_s:
            return
        self._last_autoscale = now
        running = {
            n.node_id: n.role
            for n in self.nodes.values()
            if n.state == NodeState.RUNNING and n.role in ("ps", "worker")
        }
        self.profiler.sample(running, now)
        step_times = {
            n.node_id: n.step_time_ms
            for n in self.nodes.values()
            if n.role == "worker" and n.state == NodeState.RUNNING and n.step_time_ms > 0
        }
        rate = self._rate_since_last_tick(now)
        plan = self.spec.plan
        if len(step_times) < plan.num_workers:  # a worker is (re)starting: not this plan's speed
            self.autoscaler.plan_changed(now)
            return
        if self.queue.counts()["todo"] > 0 and rate is not None:  # the tail is no sample
            self.autoscaler.record(now, plan, rate, list(step_times.values()))
        remaining = self.queue.total_samples - self.queue.done_samples
        self.autoscaler.propose(now, plan, self.profiler, step_times, remaining)

    def _rate_since_last_tick(self, now: float) -> float | None:
        """Samples/s the workers trained since the last tick (per-node counters, so a worker
        that restarts from zero does not count negative)."""
        counts = {n.node_id: n.samples for n in self.nodes.values() if n.role == "worker"}
        previous, since = self._tick_samples
        self._tick_samples = (counts, now)
        if since is None or now <= since:
            return None
        trained = sum(max(0, c - previous.get(node, c)) for node, c in counts.items())
        return trained / (now - since)

    def request_plan(self, body: master_api.PlanRequest) -> PlanRecord:
        """Propose the requested counts as a plan (the trigger applies it)."""
        with self._lock:
            if self.state in TERMINAL_STATES:
                raise ValueError(f"the job is {self.state}: nothing to resize")
            counts = {
                k: v
                for k, v in (("num_workers", body.num_workers), ("num_ps", body.num_ps))
                if v is not None
            }
            plan = self.spec.plan.model_copy(update=counts)
            record = self.autoscaler.request(time.time(), self.spec.plan, plan, body.reason)
            self.mirror_state(force=True)
            return record

    def apply_plan(self, plan_id: int) -> PlanRecord:
        """Apply a proposed plan: start or stop workers. Changes to the PS or to node sizes need
        live migration (elastic scaling) and are declined with that reason."""
        with self._lock:
            record = next((p for p in self.autoscaler.plans if p.id == plan_id), None)
            if record is None:
                raise KeyError(f"no plan {plan_id}")
            if not record.pending:
                return record  # applying twice is a no-op (a re-created trigger may retry)
            plan = record.plan
            current = self.spec.plan
            if self.state != JobState.RUNNING:
                record.decline(f"the job is {self.state}")
                return record
            counts = {"num_workers": current.num_workers, "num_ps": current.num_ps}
            if plan.model_copy(update=counts) != current:
                why = self._resize_nodes(plan)
                if why.startswith("declined"):
                    record.decline(why)
                else:
                    record.mark_applied(time.time(), why)
                    self.autoscaler.applied(time.time())
                    self.mirror_state(force=True)
                return record
            if plan.num_ps != current.num_ps:
                if self._ecrm:
                    note = "checkpoint_policy='ecrm': a PS resize would need the parity encoded "
                    record.decline(note + "again for the new PS count")
                    return record
                if self.resize is not None:
                    record.decline("another PS resize is in progress")
                    return record
                self._begin_resize(record, plan)
                return record
            self._set_workers(plan)
            self.autoscaler.applied(time.time())
            record.mark_applied(time.time())
            log.info("applied plan %d: %s", plan_id, plan.model_dump())
            self.mirror_state(force=True)
            return record

    def _resize_nodes(self, plan: ResourcePlan) -> str:
        """New node sizes (a hot PS's bigger node, bigger workers): each running node of the
        role is resized in place where the launcher and cluster can, else replaced (its exit
        is then a relaunch at the new size, not a failure). Returns the plan's note."""
        current = self.spec.plan
        if not self.launcher.can(Capability.RESIZE):
            return (
                "declined: node sizes are fixed on this launcher (local nodes share one "
                "machine); worker and PS counts change"
            )
        if (plan.num_ps, plan.num_workers) != (current.num_ps, current.num_workers):
            return "declined: change node sizes and node counts in separate plans"
        sizes, before = _node_sizes(plan), _node_sizes(current)
        changed = {role for role in sizes if sizes[role] != before[role]}
        done: dict[str, list[str]] = {"in-place": [], "replace": []}
        for node in list(self.nodes.values()):
            if node.role in changed and node.exit_code is None and not node.stopping:
                how = self.launcher.resize(node.node_id, node.role, *sizes[node.role])
                node.replacing = how == "replace"
                done[how].append(node.node_id)
        self.spec = self.spec.model_copy(update={"plan": plan})
        self.layout.write_spec(self.spec)
        return f"resized in place: {done['in-place']}; replaced (relaunched): {done['replace']}"

    def _set_workers(self, plan: ResourcePlan) -> None:
        """Start or stop workers to ``plan.num_workers`` and make ``plan`` the job's plan. A
        stopped worker's shards go back to the queue, resumed from their first batch not
        applied on every PS; the other workers do not pause."""
        current = self.spec.plan
        for i in range(current.num_workers, plan.num_workers):
            self._start(f"worker-{i}", "worker")
        for i in range(plan.num_workers, current.num_workers):
            node = self.nodes.get(f"worker-{i}")
            if node is not None and node.exit_code is None:
                node.stopping = True
                self.launcher.stop(node.node_id)
            self._reconcile(self.queue.release_worker(f"worker-{i}"))
        self.spec = self.spec.model_copy(update={"plan": plan})
        self.layout.write_spec(self.spec)  # a relaunched master keeps the plan

    # -- PS resize (docs/elastic-scaling.md) ---------------------------------------------------
    def _begin_resize(self, record: PlanRecord, plan: ResourcePlan) -> None:
        """Start the new PS (training goes on); ``_advance_resize`` does the rest."""
        old = self.spec.plan.num_ps
        for i in range(old, plan.num_ps):
            self._start(f"ps-{i}", "ps")
        self.resize = Resize(record, plan, old)
        record.mark_applying(f"PS {old} -> {plan.num_ps}: starting")
        self.message = f"resizing the PS {old} -> {plan.num_ps}"
        log.info("plan %d: %s", record.id, self.message)
        self.mirror_state(force=True)

    def _advance_resize(self, resize: Resize) -> None:
        if resize.phase == "starting":
            new = [self.nodes[f"ps-{i}"] for i in range(resize.old_num_ps, resize.plan.num_ps)]
            if all(n.state == NodeState.RUNNING and n.address for n in new):
                resize.phase, resize.paused_at = "draining", time.time()
                resize.record.note = "new PS ready; leases held while the workers drain"
            return
        if self.queue.counts()["doing"] or self.checkpointer.pending is not None:
            return  # leased shards finish (their pushes land) and a checkpoint commits first
        self._migrate(resize)

    def _migrate(self, resize: Resize) -> None:
        """Every PS hands the rows it no longer owns to their new owners, workers switch to
        the new layout on their next lease, removed PS stop. No worker trains meanwhile."""
        started = time.time()
        top = max(resize.old_num_ps, resize.plan.num_ps)
        addresses = [str(self.nodes[f"ps-{i}"].address) for i in range(top)]
        client = PSClient(addresses, self._token)
        try:
            ledgers = [applied for applied, _ in client.ledgers()[: resize.old_num_ps]]
            if any(applied != ledgers[0] for applied in ledgers):
                # A push landed on some PS only (its worker died): moved rows would carry a
                # batch their new owner's ledger lacks. The shard retrains it; try again later.
                self._cancel_resize(resize, "the PS ledgers disagree (a worker died mid-push)")
                return
            replies = client.reshard(addresses[: resize.plan.num_ps])
        except grpc.RpcError as exc:
            self._finish(
                JobState.FAILED,
                f"PS resize {resize.old_num_ps} -> {resize.plan.num_ps} failed while moving "
                f"rows ({exc.code()}: {exc.details()}); a retry resumes from checkpoint "
                f"{self.checkpoints}",
            )
            return
        finally:
            client.close()
        for i in range(resize.plan.num_ps, resize.old_num_ps):
            node = self.nodes[f"ps-{i}"]
            node.stopping = True
            self.launcher.stop(node.node_id)
        self.spec = self.spec.model_copy(
            update={"plan": self.spec.plan.model_copy(update={"num_ps": resize.plan.num_ps})}
        )
        self.layout.write_spec(self.spec)
        self._next_layout()
        self._set_workers(resize.plan)
        now = time.time()
        moved = sum(int(r["moved_rows"][0]) for r in replies)
        resize.record.mark_applied(
            now,
            f"PS {resize.old_num_ps} -> {resize.plan.num_ps}: {moved} rows moved",
            moved_rows=moved,
            migration_s=round(now - started, 3),
            pause_s=round(now - (resize.paused_at or started), 3),
        )
        self.resize = None
        self.autoscaler.applied(now)
        self.checkpointer.start_soon()  # the next checkpoint is of the new layout
        self.message = "training"
        log.info("plan %d applied: %s", resize.record.id, resize.record.note)
        self.mirror_state(force=True)

    def _cancel_resize(self, resize: Resize, why: str) -> None:
        for i in range(resize.old_num_ps, resize.plan.num_ps):
            node = self.nodes.get(f"ps-{i}")
            if node is not None and node.exit_code is None:
                node.stopping = True
                self.launcher.stop(node.node_id)
        resize.record.decline(why)
        self.resize = None
        self.message = "training"
        log.warning("PS resize %d -> %d declined: %s", resize.old_num_ps, resize.plan.num_ps, why)

    def checkpoint(self) -> Path | None:
        """Take a checkpoint and wait until it is committed (``Checkpointer.checkpoint``)."""
        return self.checkpointer.checkpoint()

    @property
    def checkpoints(self) -> int:
        """The number of the last committed checkpoint (0: none)."""
        return self.checkpointer.number

    def _complete(self) -> None:
        """Save the model from the PS, write the result, and mark the job succeeded."""
        addresses = self.cluster().ps
        client = PSClient(addresses, self._token)
        try:
            rows = client.save(self.layout.model_dir)
            ledgers = client.ledgers()
        finally:
            client.close()
        atomic_write_json(
            self.layout.model_dir / "model.json",
            {
                "job_id": self.spec.job_id,
                "model": self.spec.model,
                "features": self.features.model_dump(),
                "embedding_groups": [
                    {"name": g.name, "dim": g.dim, "tables": [t.__dict__ for t in g.tables]}
                    for g in EmbeddingPlacement.from_features(self.features).groups
                ],
                "num_ps": self.spec.plan.num_ps,
                "partitions": [f"ps-{i}.npz" for i in range(self.spec.plan.num_ps)],
            },
        )
        train_s = (self.train_finished_at or time.time()) - (self.train_started_at or time.time())
        samples = self.queue.done_samples
        this_run = samples - self.samples_resumed
        self.result = {
            "samples_trained": samples,
            "samples_resumed": self.samples_resumed,
            "samples_trained_this_run": this_run,
            "train_seconds": round(train_s, 3),
            "samples_per_second": round(this_run / train_s, 1) if train_s > 0 else 0.0,
            "auc": self.evaluation["auc"] if self.evaluation else None,
            "logloss": self.evaluation["logloss"] if self.evaluation else None,
            "eval_samples": self.evaluation["samples"] if self.evaluation else 0,
            "embedding_rows": rows,
            "model_dir": str(self.layout.model_dir),
            "plan": self.spec.plan.model_dump(),
            "accounting": {
                **self.queue.accounting(),
                "batches": batch_accounting(self.queue.expected_keys(), ledgers),
            },
            "recovery": self._recovery_summary(),
        }
        quarantined = self.queue.quarantined_shards()
        message = f"trained {samples} samples"
        if quarantined:
            message += (
                f"; {len(quarantined)} shard(s) quarantined after repeated worker deaths and not "
                f"trained: {[(q['shard_id'], q['start'], q['end']) for q in quarantined]}"
            )
        if self.mirror is not None:  # ``_durable`` waited for the copy (or gave up)
            if not self.mirror.flush(timeout=0) or self.mirror.last_error:
                message += f"; the last checkpoint was not copied to {self.spec.checkpoint_uri}"
            if self.mirror.last is not None:
                self.result["durable_checkpoint"] = self.mirror.last.summary()
        self._finish(JobState.SUCCEEDED, message)

    def _recovery_summary(self) -> dict[str, Any]:
        seconds: dict[str, list[float]] = collections.defaultdict(list)
        for event in self.recoveries:
            if event["seconds"] is not None:
                seconds[event["role"]].append(event["seconds"])
        return {
            "restarts": self.restarts,
            "master_restarts": self.master_restarts,
            "recoveries": len(self.recoveries),
            "standby_takeovers": self.standby_takeovers,
            "recovery_seconds": {role: sorted(v) for role, v in seconds.items()},
            "checkpoints": self.checkpoints,
            "resumed_from": self.resumed_from,
            "quarantined": self.queue.quarantined_shards(),
            "checkpoint_policy": self.policy,
            "checkpoint_policy_reason": self.policy_reason,
            "checkpoint_policy_advice": self.policy_advice,
            "checkpoint_interval_s": self.checkpointer.interval_s,
            "partial_saves": self.partial_saves,
            "lost_batches": self.lost_batches,
            "lost_samples": self.lost_samples,
            "pls": round(self.pls, 6),
            "ecrm_rebuilds": [self.rebuilds[i] for i in sorted(self.rebuilds)],
        }

    def shutdown_nodes(self) -> None:
        self.launcher.stop_all()
        with self._lock:
            for node in self.nodes.values():
                if node.state in (NodeState.STARTING, NodeState.RUNNING):
                    node.state = NodeState.STOPPED
            self.mirror_state(force=True)


def _node_sizes(plan: ResourcePlan) -> dict[str, tuple[float, int]]:
    """(cores, MB) of each node role under ``plan``."""
    return {
        "ps": (plan.ps_cpu, plan.ps_memory_mb),
        "worker": (plan.worker_cpu, plan.worker_memory_mb),
        "evaluator": (plan.worker_cpu, plan.worker_memory_mb),
    }


def _tail(path: Any, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as fh:
            return "".join(collections.deque(fh, maxlen=lines))
    except OSError:
        return "(no log)"
