"""The job master's state machine: shard dispatch, node supervision, status and the result.

API handlers and the supervisor loop share one ``JobMaster`` behind a lock. The master mirrors
its status to ``state.json`` on every phase change (and periodically), so the job's outcome is
readable after the master has exited.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from typing import Any

from airflow_rover.core.embedding_layout import EmbeddingLayout
from airflow_rover.core.features import resolve_features
from airflow_rover.core.layout import JobLayout, atomic_write_json
from airflow_rover.core.shards import ShardQueue
from airflow_rover.core.spec import JobSpec
from airflow_rover.core.states import TERMINAL_STATES, JobState, NodeState
from airflow_rover.data.reader import open_dataset
from airflow_rover.launchers.base import NodeLauncher, Role
from airflow_rover.master import protocol
from airflow_rover.ps.client import PSClient

log = logging.getLogger(__name__)

THROUGHPUT_WINDOW_S = 10.0
STATE_MIRROR_INTERVAL_S = 2.0


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
        }


class JobMaster:
    def __init__(
        self, layout: JobLayout, spec: JobSpec, launcher: NodeLauncher, token: str
    ) -> None:
        self.layout = layout
        self.spec = spec
        self.launcher = launcher
        self._token = token
        self.features = resolve_features(spec)
        num_samples = open_dataset(spec.train_data).num_samples
        t = spec.training
        self.queue = ShardQueue(num_samples, t.shard_size, t.epochs)
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
        self._last_mirror = 0.0

    # -- API operations (called from request handlers) ---------------------------------------
    def cluster(self) -> protocol.ClusterInfo:
        with self._lock:
            ps = [
                self.nodes[f"ps-{i}"].address
                for i in range(self.spec.plan.num_ps)
                if f"ps-{i}" in self.nodes
            ]
            if len(ps) != self.spec.plan.num_ps or any(a is None for a in ps):
                raise LookupError("parameter servers are not all ready yet")
            return protocol.ClusterInfo(job_id=self.spec.job_id, ps=[a for a in ps if a])

    def node_ready(self, node_id: str, body: protocol.NodeReady) -> None:
        with self._lock:
            node = self._node(node_id)
            node.state = NodeState.RUNNING
            node.address = body.address
            node.last_seen = time.time()
            if node.role == "worker" and self.train_started_at is None:
                self.train_started_at = node.last_seen  # the training clock: first worker ready
            log.info("node %s ready%s", node_id, f" at {body.address}" if body.address else "")

    def heartbeat(self, node_id: str, body: protocol.Heartbeat) -> bool:
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

    def lease(self, node_id: str) -> protocol.LeaseReply:
        with self._lock:
            self._node(node_id).last_seen = time.time()
            if self.state != JobState.RUNNING:
                done = self.state in TERMINAL_STATES or self.state == JobState.EVALUATING
                return protocol.LeaseReply(status="done" if done else "wait")
            shard = self.queue.lease(node_id, time.time(), self.spec.training.shard_lease_s)
            if shard is not None:
                return protocol.LeaseReply(
                    status="ok",
                    shard=protocol.ShardOut(
                        shard_id=shard.shard_id, epoch=shard.epoch, start=shard.start, end=shard.end
                    ),
                )
            # Nothing to hand out: others still hold shards that may come back if they die.
            return protocol.LeaseReply(status="done" if self.queue.finished else "wait")

    def shard_done(self, shard_id: int, body: protocol.ShardDone) -> bool:
        with self._lock:
            accepted = self.queue.complete(shard_id, body.node_id)
            if not accepted:
                log.warning("rejected completion of shard %d by %s", shard_id, body.node_id)
            return accepted

    def report_evaluation(self, body: protocol.EvalReport) -> None:
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
            if self.state == JobState.PENDING and self._all_ps_ready():
                for i in range(self.spec.plan.num_workers):
                    self._start(f"worker-{i}", "worker")
                self.state = JobState.RUNNING
                self.message = "training"
                self.mirror_state(force=True)
            elif self.state == JobState.RUNNING:
                for shard in self.queue.expire(time.time()):
                    log.warning("lease of shard %d expired; back to TODO", shard.shard_id)
                if self.queue.finished:
                    self.train_finished_at = time.time()
                    self._record_samples()
                    if self.spec.eval_data:
                        self.state = JobState.EVALUATING
                        self.message = "scoring the held-out split"
                        self._start("evaluator", "evaluator")
                        self.mirror_state(force=True)
                    else:
                        self._complete()
            elif self.state == JobState.EVALUATING and self._evaluation_finished():
                self._complete()
            self.mirror_state()

    def _evaluation_finished(self) -> bool:
        return self.evaluation is not None and self.nodes["evaluator"].exit_code is not None

    def _all_ps_ready(self) -> bool:
        ps = [n for n in self.nodes.values() if n.role == "ps"]
        return bool(ps) and all(n.state == NodeState.RUNNING and n.address for n in ps)

    def _check_exits(self) -> None:
        for node_id, code in self.launcher.exit_codes().items():
            node = self.nodes[node_id]
            if code is None or node.exit_code is not None:
                continue
            node.exit_code = code
            if code == 0:
                node.state = NodeState.SUCCEEDED
                continue
            node.state = NodeState.FAILED
            released = self.queue.release_worker(node_id)
            tail = _tail(self.layout.log_file(node_id))
            self._finish(
                JobState.FAILED,
                f"{node_id} exited with code {code}; {len(released)} shard(s) returned to TODO. "
                f"Last log lines:\n{tail}",
            )
            return

    def _complete(self) -> None:
        """Save the model from the PS, write the result, and mark the job succeeded."""
        addresses = self.cluster().ps
        client = PSClient(addresses, self._token)
        try:
            rows = client.save(self.layout.model_dir)
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
                    for g in EmbeddingLayout.from_features(self.features).groups
                ],
                "num_ps": self.spec.plan.num_ps,
                "partitions": [f"ps-{i}.npz" for i in range(self.spec.plan.num_ps)],
            },
        )
        train_s = (self.train_finished_at or time.time()) - (self.train_started_at or time.time())
        samples = self.queue.done_samples
        self.result = {
            "samples_trained": samples,
            "train_seconds": round(train_s, 3),
            "samples_per_second": round(samples / train_s, 1) if train_s > 0 else 0.0,
            "auc": self.evaluation["auc"] if self.evaluation else None,
            "logloss": self.evaluation["logloss"] if self.evaluation else None,
            "eval_samples": self.evaluation["samples"] if self.evaluation else 0,
            "embedding_rows": rows,
            "model_dir": str(self.layout.model_dir),
            "plan": self.spec.plan.model_dump(),
            "accounting": self.queue.accounting(),
        }
        self._finish(JobState.SUCCEEDED, f"trained {samples} samples")

    def shutdown_nodes(self) -> None:
        self.launcher.stop_all()
        with self._lock:
            for node in self.nodes.values():
                if node.state in (NodeState.STARTING, NodeState.RUNNING):
                    node.state = NodeState.STOPPED
            self.mirror_state(force=True)


def _tail(path: Any, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as fh:
            return "".join(collections.deque(fh, maxlen=lines))
    except OSError:
        return "(no log)"
