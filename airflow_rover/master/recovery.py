"""Node exits and restarts: a dead worker's shards go back to the queue, a lost PS is recovered
as the checkpoint policy says, every relaunch is counted against ``recovery.max_node_restarts``
and timed until the node is back (``docs/fault-tolerance.md``)."""

from __future__ import annotations

import collections
import logging
import time
from typing import Any, Protocol

from airflow_rover.core.crashes import Crash
from airflow_rover.core.policies import CheckpointPolicy, MasterPort
from airflow_rover.core.shards import Shard
from airflow_rover.core.spec import ResourcePlan
from airflow_rover.core.states import TERMINAL_STATES, JobState, NodeState
from airflow_rover.master.autoscaler import Autoscaler
from airflow_rover.master.crash_watch import CrashWatch, last_words
from airflow_rover.master.data_workers import DataWorkerRoom
from airflow_rover.master.dispatch import ShardDispatch
from airflow_rover.master.job_core import JobCore
from airflow_rover.master.node_launcher import Capability
from airflow_rover.master.nodes import NodeInfo
from airflow_rover.master.oom_relaunch import OomRelaunch
from airflow_rover.rpc.master_api import EXIT_PS_LOST

log = logging.getLogger(__name__)


class RecoveringJob(JobCore, Protocol):
    """What recovery uses of the job beyond its core."""

    policy: CheckpointPolicy
    dispatch: ShardDispatch
    port: MasterPort
    data_workers: DataWorkerRoom
    autoscaler: Autoscaler

    def set_plan(self, plan: ResourcePlan) -> None:
        """Make ``plan`` the job's (a relaunched master keeps it)."""

    def lost_ps(self) -> None:
        """A PS is lost: the end of training is to be judged again once it is back."""


def _event(node: str, role: str, cause: str, detected_at: float) -> dict[str, Any]:
    return {
        "node": node,
        "role": role,
        "cause": cause,
        "detected_at": detected_at,
        "ready_at": None,
        "seconds": None,
    }


class NodeRecovery:
    """Reacts to node exits (called with the job's lock held); keeps the recovery record."""

    def __init__(self, job: RecoveringJob, master_restarts: int = 0) -> None:
        self.job = job
        self.restarts = 0
        self.master_restarts = master_restarts
        self.recoveries: list[dict[str, Any]] = []
        self.standby_takeovers = 0  # lost PS replaced by the spare process (standby_ps)
        self.crashes = CrashWatch(job.spec.recovery.deterministic_after)
        self.oom = OomRelaunch(job)
        if master_restarts:  # a keeper relaunched this master: time its recovery
            deaths = (job.job_dir.read_json(job.job_dir.keeper_file) or {}).get("master_deaths")
            died_at = deaths[-1]["died_at"] if deaths else time.time()
            self.recoveries.append(_event("master", "master", "the job master died", died_at))

    def node_ready(self, node: NodeInfo) -> None:
        """Recoveries this node ends (its own, or, for a worker, the master's)."""
        for event in self.recoveries:
            back = event["node"] == node.node_id or (
                event["role"] == "master" and node.role == "worker"
            )
            if back and event["ready_at"] is None:
                event["ready_at"] = node.last_seen
                event["seconds"] = round(node.last_seen - event["detected_at"], 3)

    def check_exits(self) -> None:
        """React to every node process that ended since the last tick, PS first."""
        job = self.job
        exits = [(n, c) for n, c in job.nodes.launcher.exit_codes().items() if c is not None]
        exits.sort(key=lambda item: job.nodes[item[0]].role != "ps")
        for node_id, code in exits:
            node = job.nodes[node_id]
            if node.exit_code is not None:
                continue
            node.exit_code = code
            crash = self.crashes.take(node_id)
            if node.stopping:
                node.state = NodeState.STOPPED
            # A PS is never done by itself: one that exits 0 unasked was stopped by someone
            # else (a SIGTERM), and its rows are lost.
            elif code == 0 and node.role != "ps":
                node.state = NodeState.SUCCEEDED
            elif not self._failed(node, code, crash):
                return  # the job failed

    def _failed(self, node: NodeInfo, code: int, crash: Crash | None = None) -> bool:
        """Recover a node that failed; False if the job cannot (no restarts left, or a
        failure no restart can fix)."""
        job = self.job
        node.state = NodeState.FAILED
        cause = f"{node.node_id} exited with code {code}"
        if crash is not None:
            cause += f" ({crash.summary()})"
        replaced, node.replacing = node.replacing, False
        if replaced:
            cause = f"{node.node_id} replaced to resize it"
        elif (grown := self.oom.grow(node)) is not None:
            cause = f"{cause}; {grown}"
        held = job.queue.held_by(node.node_id) if node.role == "worker" else []
        released = self._worker_lost(node, code, replaced) if node.role == "worker" else []
        # a worker that lost its PS is not at fault, nor a node replaced to resize it: their
        # restarts do not count
        counted = not replaced and not (node.role == "worker" and code == EXIT_PS_LOST)
        if counted and self._deterministic(node, crash, held[0].shard_id if held else None, cause):
            return False
        limit = job.spec.recovery.max_node_restarts
        if counted and self.restarts >= limit:
            job.finish(
                JobState.FAILED,
                f"{cause}; no restarts left ({self.restarts} used, "
                f"recovery.max_node_restarts={limit}); {len(released)} shard(s) returned to "
                f"TODO. {last_words(node.node_id, crash, job.job_dir.log_file(node.node_id))}",
            )
            return False
        if node.role == "ps":
            self._ps_lost(node, cause, counted)
        elif (node.role, job.state) in (
            ("evaluator", JobState.EVALUATING),
            ("worker", JobState.RUNNING),
        ) or (node.role == "data" and job.data_workers.wants(node.node_id)):
            self.restart(node, cause, counted)
        # a worker lost during PS recovery is started with the others when the PS is back
        return True

    def crash_reported(self, node_id: str, crash: Crash) -> None:
        """A node is about to exit of ``crash``: fail the job now if that same exception
        struck elsewhere before (``core.crashes.RepeatedFailures``)."""
        job = self.job
        held = job.queue.held_by(node_id) if job.nodes[node_id].role == "worker" else []
        verdict = self.crashes.reported(node_id, crash, held[0].shard_id if held else None)
        if verdict is not None and job.state not in TERMINAL_STATES:
            job.finish(JobState.FAILED, self.crashes.deterministic(verdict, job.queue))

    def _deterministic(
        self, node: NodeInfo, crash: Crash | None, shard_id: int | None, cause: str
    ) -> bool:
        """Fail the job if nothing is left that can train. True if it failed."""
        self.crashes.died(crash, shard_id, cause)
        message = self.crashes.nothing_left_to_train(self.job.queue)
        if message is None:
            return False
        self.job.finish(JobState.FAILED, message)
        return True

    def _worker_lost(self, node: NodeInfo, code: int, replaced: bool) -> list[Shard]:
        """Requeue a dead worker's shards from their first batch some PS has not applied; a
        death that was not the PS's fault counts against the shards (poison quarantine)."""
        job = self.job
        failed = code != EXIT_PS_LOST and not replaced
        before = set(job.queue.quarantined)
        released = job.queue.release_worker(node.node_id, failed=failed)
        for shard in job.queue.quarantined_shards():
            if shard["shard_id"] not in before:
                log.error(
                    "shard %d (epoch %d, samples %d-%d) quarantined after %d worker deaths",
                    shard["shard_id"],
                    shard["epoch"],
                    shard["start"],
                    shard["end"],
                    shard["failures"],
                )
        if job.state == JobState.RUNNING:
            job.dispatch.reconcile(released)
        else:
            job.dispatch.reconcile_pending = True
        return released

    def _ps_lost(self, node: NodeInfo, cause: str, counted: bool) -> None:
        """Relaunch the PS as the policy says (it restores its partition from the last
        checkpoint, or under ECRM starts empty and is rebuilt from parity while the workers
        train on), then resume the queue from every PS's ledger."""
        job = self.job
        loss = job.policy.on_ps_lost(job.port, int(node.node_id.rsplit("-", 1)[1]), cause)
        if loss is None:
            return  # the policy failed the job
        job.state = JobState.RECOVERING
        job.lost_ps()
        job.message = f"{cause}; relaunching it {loss.how}"
        log.warning(job.message)
        for other in job.nodes:  # (``lost_ps`` stopped the node scoring the held-out split)
            if other.role == "worker" and not loss.workers_train_on:
                job.queue.release_worker(other.node_id)  # it waits for the PS
        job.dispatch.reconcile_pending = True
        node.address = None
        self.restart(node, cause, counted)
        job.mirror_state(force=True)

    def restart(self, node: NodeInfo, cause: str, counted: bool = True) -> None:
        """Start ``node`` again (a lost PS: the spare, where one waits)."""
        nodes = self.job.nodes
        self.restarts += counted
        self.recoveries.append(_event(node.node_id, node.role, cause, time.time()))
        restarts = node.restarts + 1
        if node.role == "ps" and self._standby and nodes.launcher.take_standby(node.node_id):
            nodes[node.node_id] = NodeInfo(node.node_id, node.role)
            self.standby_takeovers += 1
            how = "a spare PS took over"
        else:
            nodes.start(node.node_id, node.role)
            how = "relaunched it"
        nodes[node.node_id].restarts = restarts
        log.warning("%s; %s (restart %d of the job)", cause, how, self.restarts)

    @property
    def _standby(self) -> bool:
        """Whether the job keeps a spare PS (``recovery.standby_ps``) and its launcher can."""
        launcher = self.job.nodes.launcher
        return self.job.spec.recovery.standby_ps and launcher.can(Capability.STANDBY)

    def keep_standby(self) -> None:
        """Keep the spare PS started (not while the policy recovers: it takes a core)."""
        if self._standby and not self.job.policy.busy:
            self.job.nodes.launcher.start_standby()

    def summary(self) -> dict[str, Any]:
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
        }
