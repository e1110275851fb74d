"""The master's HTTP API over a real JobMaster: auth, validation, shard dispatch and outcomes.

Nodes are not started: a small in-memory launcher records start/stop calls and reports the
exit codes a test sets, because these tests are about the API and the master's state machine.
Where the master talks to a parameter server (saving the model), a real one is started.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException
from fastapi.routing import APIRoute
from master_rig import (
    AUTH,
    BATCH_SIZE,
    BATCHES_PER_SHARD,
    EPOCHS,
    NUM_SHARDS,
    NUM_TRAIN,
    SHARD_SIZE,
    TOKEN,
    FakeLauncher,
    Job,
    P,
    new_job,
    observable,
    start_running,
)

from airflow_rover.core.autoscale_prior import Prior
from airflow_rover.core.deadline import JobDeadline
from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.optimizer import ScalingCosts
from airflow_rover.core.plans import PlanRecord
from airflow_rover.core.policies import CheckpointPolicyConfig
from airflow_rover.core.prior_config import AutoscalePrior
from airflow_rover.core.spec import AutoscaleConfig, RecoveryConfig
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.data.synthetic import GeneratedDataset
from airflow_rover.launchers.local import LocalNodeLauncher, notify_exit
from airflow_rover.master.checkpointer import CheckpointTimes
from airflow_rover.master.job import JobMaster
from airflow_rover.master.nodes import NodeInfo
from airflow_rover.master.serve import supervise
from airflow_rover.operators.training import ElasticTrainingOperator
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc import master_api
from airflow_rover.rpc.ps_client import PSClient
from airflow_rover.triggers.elastic_job import ElasticJobTrigger


def no_shard(status: str, ps_set_version: int = 0) -> dict:
    """A lease reply without a shard (no data workers in these jobs)."""
    return {"status": status, "shard": None, "ps_set_version": ps_set_version, "data_workers": []}


def test_a_ready_node_wakes_the_supervisor(make_job) -> None:
    """A relaunched PS that reports ready is acted on at once, not at the next tick."""
    job = make_job()
    job.master.step()
    job.master.wake.clear()
    job.post("/nodes/ps-0/ready", {"address": "127.0.0.1:1"})
    assert job.master.wake.is_set()


def test_the_rows_the_ps_took_of_init_from_reach_the_status(make_job) -> None:
    """Each PS says what it loaded of the model the job continues and what it evicted; a PS
    that loads again (it died before any checkpoint) replaces its own report."""
    job = make_job()
    job.master.step()
    assert job.status()["recovery"]["initial_rows"] is None  # not started from a model
    ready = {"address": "127.0.0.1:1", "initial_rows": {"loaded": 70, "evicted": 5}}
    job.post("/nodes/ps-0/ready", ready)
    job.post("/nodes/ps-0/ready", {**ready, "initial_rows": {"loaded": 60, "evicted": 4}})
    assert job.status()["recovery"]["initial_rows"] == {"loaded": 60, "evicted": 4}
    refused = job.api.post(
        P + "/nodes/ps-0/ready",
        json={**ready, "initial_rows": {"loaded": -1, "evicted": 0}},
        headers=AUTH,
    )
    assert refused.status_code == 422, refused.text


def test_the_local_launcher_signals_a_node_process_exit() -> None:
    """The master's wake-up on a lost node: set by the waiter thread as the process ends."""
    exited = threading.Event()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    waiter = threading.Thread(target=notify_exit, args=(proc, exited), daemon=True)
    waiter.start()
    assert not exited.is_set()
    assert exited.wait(10)
    assert proc.poll() == 0


def _drain(
    job: Job,
    workers: tuple[str, ...] = ("worker-0", "worker-1"),
    train: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Workers take turns leasing and completing shards until the queue says done (or, with
    a held-out split, to wait for the evaluation); ``train`` (if given) is called with each
    leased shard before it is reported."""
    shards: list[dict] = []
    turn = 0
    over = "wait" if job.master.spec.eval_data else "done"
    while True:
        reply = job.lease(workers[turn % len(workers)])
        if reply["status"] != "ok":
            assert reply == no_shard(over)
            return shards
        shard = reply["shard"]
        if train is not None:
            train(shard)
        assert job.done(workers[turn % len(workers)], shard["shard_id"])
        shards.append(shard)
        turn += 1


# -- authentication ----------------------------------------------------------------------------
ROUTES: list[tuple[str, str, dict | None]] = [
    ("GET", "/status", None),
    ("GET", "/cluster", None),
    ("POST", "/nodes/ps-0/ready", {"address": "10.0.0.66:9"}),
    ("POST", "/nodes/worker-0/heartbeat", {"steps": 5, "samples": 99, "step_time_ms": 1.0}),
    ("POST", "/shards/lease", {"node_id": "worker-0"}),
    ("POST", "/shards/0/done", {"node_id": "worker-0"}),
    ("POST", "/nodes/worker-0/release", None),
    ("POST", "/nodes/worker-0/crash", {"exc_type": "ValueError", "message": "x", "where": "f"}),
    ("POST", "/nodes/worker-0/evaluate", None),
    ("POST", "/evaluation", {"node_id": "worker-0", "auc": 0.9, "logloss": 0.1, "samples": 5}),
    ("GET", "/plans", None),
    ("POST", "/plans", {"num_workers": 9}),
    ("POST", "/plans/1/apply", None),
    ("POST", "/plans/1/decline", {"reason": "too dear"}),
    ("POST", "/data-workers/cap", {"cap": 64}),
    ("POST", "/stop", {"reason": "intruder"}),
]
BAD_HEADERS = [
    {},
    {"Authorization": "Bearer wrong"},
    {"Authorization": f"Bearer {TOKEN}x"},
    {"Authorization": f"Bearer {TOKEN[:-1]}"},
    {"Authorization": f"Basic {TOKEN}"},
    {"Authorization": TOKEN},
    {"Authorization": "Bearer"},
    {"Authorization": "Bearer "},
]


def test_route_list_covers_the_whole_api(make_job) -> None:
    """The auth test below exercises every route the app serves (a new route must be added)."""
    job = make_job()
    served = {
        (m, r.path.removeprefix(P))
        for r in job.api.app.routes
        if isinstance(r, APIRoute)
        for m in r.methods
    }
    tested = {
        (m, path.replace("ps-0", "{node_id}").replace("worker-0", "{node_id}"))
        for m, path, _ in ROUTES
    }
    tested = {(m, p.replace("/shards/0/", "/shards/{shard_id}/")) for m, p in tested}
    tested = {(m, p.replace("/plans/1/", "/plans/{plan_id}/")) for m, p in tested}
    assert served == tested


@pytest.mark.parametrize("headers", BAD_HEADERS, ids=lambda h: h.get("Authorization", "none"))
def test_every_route_rejects_missing_or_wrong_token(make_job, headers: dict) -> None:
    """401 with a Bearer challenge on every route, and the job is untouched."""
    job = make_job()
    start_running(job)
    assert job.lease("worker-0")["shard"]["shard_id"] == 0
    before = observable(job)
    for method, path, body in ROUTES:
        reply = job.api.request(method, P + path, json=body, headers=headers)
        assert reply.status_code == 401, (method, path, reply.text)
        assert reply.headers["www-authenticate"] == "Bearer"
        assert reply.json() == {"detail": "missing or wrong job token"}
    assert observable(job) == before


def test_auth_is_checked_before_the_body(make_job) -> None:
    """A wrong token with a malformed body is 401, not 422: nothing is revealed to strangers."""
    job = make_job()
    for method, path, _ in ROUTES:
        if method == "POST":
            reply = job.api.post(P + path, content=b"{not json", headers={"Authorization": "x"})
            assert reply.status_code == 401, path


# -- status and start-up -----------------------------------------------------------------------
def test_status_shape_through_start_up(make_job) -> None:
    """Status has a stable shape; states go pending -> running as ps-0 becomes ready."""
    job = make_job()
    status = job.status()
    assert set(status) == {
        "job_id",
        "state",
        "message",
        "progress",
        "throughput",
        "throughput_history",
        "plan",
        "plan_approval",
        "autoscale",
        "nodes",
        "evaluation",
        "started_at",
        "finished_at",
        "duration_s",
        "recovery",
        "plans",
        "profile",
        "result",
        "failure",
    }
    assert status["failure"] is None
    assert status["job_id"] == "unit-job.1"
    assert status["state"] == "pending"
    assert status["progress"] == {
        "samples_done": 0,
        "samples_resumed": 0,
        "samples_total": NUM_TRAIN * EPOCHS,
        "fraction": 0.0,
        "shards": {"todo": NUM_SHARDS, "doing": 0, "done": 0, "quarantined": 0},
    }
    assert status["recovery"] == {
        "restarts": 0,
        "master_restarts": 0,
        "recoveries": 0,
        "standby_takeovers": 0,
        "recovery_seconds": {},
        "checkpoints": 0,
        "resumed_from": None,
        "started_from": "scratch",
        "initial_rows": None,
        "quarantined": [],
        "checkpoint_policy": "full",
        "checkpoint_policy_reason": "as requested",
        "checkpoint_policy_advice": None,
        "checkpoint_interval_s": job.master.spec.recovery.checkpoint_interval_s,
        "checkpoint_history": [],
        "partial_saves": 0,
        "lost_batches": 0,
        "lost_samples": 0,
        "pls": 0.0,
        "ecrm_rebuilds": [],
    }
    assert status["plan"] == job.master.spec.plan.model_dump()
    assert status["nodes"] == []
    assert status["throughput"] == 0.0 and status["throughput_history"] == []
    assert status["plan_approval"] is False
    assert status["autoscale"] == {
        "enabled": True,
        "weight": 1.0,
        "min_workers": 1,
        "max_workers": 4,
        "min_ps": 1,
        "max_ps": 4,
        "min_worker_cpu": None,
        "max_worker_cpu": None,
        "min_ps_cpu": None,
        "max_ps_cpu": 8.0,
        "min_ps_memory_mb": None,
        "max_ps_memory_mb": None,
        "start": "cold",
        "prior_jobs": [],
        "prior_parts": [],
    }
    assert status["evaluation"] is None and status["result"] is None
    assert status["finished_at"] is None
    json.dumps(status)

    job.master.step()
    (ps,) = job.status()["nodes"]
    assert ps == {
        "id": "ps-0",
        "role": "ps",
        "state": "starting",
        "address": None,
        "steps": 0,
        "samples": 0,
        "step_time_ms": 0.0,
        "exit_code": None,
        "restarts": 0,
    }
    # No cluster (and no workers) until the parameter servers are up.
    assert job.api.get(P + "/cluster", headers=AUTH).status_code == 409
    job.master.step()
    assert job.launcher.started == [("ps-0", "ps")]

    assert job.post("/nodes/ps-0/ready", {"address": "127.0.0.1:5555"}) == {"ok": True}
    assert job.get("/cluster") == {
        "job_id": "unit-job.1",
        "ps": ["127.0.0.1:5555"],
        "ps_set_version": 0,
    }
    job.master.step()
    assert job.launcher.started == [("ps-0", "ps"), ("worker-0", "worker"), ("worker-1", "worker")]
    status = job.status()
    assert status["state"] == "running"
    assert [n["id"] for n in status["nodes"]] == ["ps-0", "worker-0", "worker-1"]
    assert [n["state"] for n in status["nodes"]] == ["running", "starting", "starting"]
    mirrored = json.loads(job.layout.state_file.read_text())
    assert mirrored["state"] == "running"


def test_lease_while_pending_says_wait(make_job) -> None:
    """Before training starts a known node is told to wait; a not-yet-started worker is 404."""
    job = make_job()
    job.master.step()
    reply = job.api.post(P + "/shards/lease", json={"node_id": "worker-0"}, headers=AUTH)
    assert reply.status_code == 404
    assert job.post("/shards/lease", {"node_id": "ps-0"}) == {
        "status": "wait",
        "shard": None,
        "ps_set_version": 0,
        "data_workers": [],
    }


# -- shard dispatch ----------------------------------------------------------------------------
def test_heartbeat_records_progress(make_job) -> None:
    """Heartbeats update the node's figures and answer stop=false while the job runs."""
    job = make_job()
    start_running(job)
    assert job.post("/nodes/worker-0/heartbeat", {"steps": 3, "samples": 192, "step_time_ms": 2.5})
    assert job.post(
        "/nodes/worker-0/heartbeat",
        {"steps": 6, "samples": 384, "step_time_ms": 2.0, "input_wait_s": 1.25},
    ) == {"stop": False}
    nodes = {n["id"]: n for n in job.status()["nodes"]}
    node = nodes["worker-0"]
    assert (node["steps"], node["samples"], node["step_time_ms"]) == (6, 384, 2.0)
    # A trainer's input wait (seconds, in all) is in its node, for any window a reader picks.
    assert node["input_wait_s"] == 1.25
    assert "input_wait_s" not in nodes["ps-0"]


def test_lease_done_cycle_until_all_shards_are_done(make_job) -> None:
    """Two workers lease and complete every shard once; status then shows all samples done."""
    job = make_job()
    start_running(job)
    shards = _drain(job)
    assert [s["shard_id"] for s in shards] == list(range(NUM_SHARDS))
    assert shards[0] == {"shard_id": 0, "epoch": 0, "start": 0, "end": SHARD_SIZE, "first_key": 0}
    assert shards[-1] == {
        "shard_id": NUM_SHARDS - 1,
        "epoch": EPOCHS - 1,
        "start": NUM_TRAIN - SHARD_SIZE,
        "end": NUM_TRAIN,
        "first_key": (NUM_SHARDS - 1) * BATCHES_PER_SHARD,
    }
    # Batch keys never collide: each shard owns BATCHES_PER_SHARD consecutive keys.
    assert [s["first_key"] for s in shards] == [i * BATCHES_PER_SHARD for i in range(NUM_SHARDS)]
    progress = job.status()["progress"]
    assert progress == {
        "samples_done": NUM_TRAIN * EPOCHS,
        "samples_resumed": 0,
        "samples_total": NUM_TRAIN * EPOCHS,
        "fraction": 1.0,
        "shards": {"todo": 0, "doing": 0, "done": NUM_SHARDS, "quarantined": 0},
    }
    assert job.lease("worker-1") == no_shard("done")


def test_lease_says_wait_while_others_hold_the_last_shards(make_job) -> None:
    """With nothing left in TODO but shards in flight, idle workers wait instead of finishing."""
    job = make_job()
    start_running(job)
    for _ in range(NUM_SHARDS - 1):
        shard = job.lease("worker-0")["shard"]
        assert job.done("worker-0", shard["shard_id"])
    last = job.lease("worker-0")["shard"]
    assert job.lease("worker-1") == no_shard("wait")
    assert job.done("worker-0", last["shard_id"])
    assert job.lease("worker-1") == no_shard("done")


def test_done_from_a_worker_that_does_not_hold_the_shard(make_job) -> None:
    """Only the holder's report counts; others (and repeats) are accepted: false."""
    job = make_job()
    start_running(job)
    shard_id = job.lease("worker-0")["shard"]["shard_id"]
    assert job.post(f"/shards/{shard_id}/done", {"node_id": "worker-1"}) == {"accepted": False}
    assert job.post(f"/shards/{shard_id}/done", {"node_id": "ghost"}) == {"accepted": False}
    assert job.post("/shards/5/done", {"node_id": "worker-0"}) == {"accepted": False}
    assert job.post("/shards/99999/done", {"node_id": "worker-0"}) == {"accepted": False}
    assert job.post("/shards/-1/done", {"node_id": "worker-0"}) == {"accepted": False}
    shards = job.status()["progress"]["shards"]
    assert shards == {"todo": NUM_SHARDS - 1, "doing": 1, "done": 0, "quarantined": 0}
    assert job.done("worker-0", shard_id)
    assert not job.done("worker-0", shard_id)
    shards = job.status()["progress"]["shards"]
    assert shards == {"todo": NUM_SHARDS - 1, "doing": 0, "done": 1, "quarantined": 0}


def test_expired_lease_goes_back_and_the_late_report_is_rejected(make_job) -> None:
    """A lease not renewed in time is requeued by the supervisor and handed to another worker."""
    job = make_job(lease_s=0.3)
    start_running(job)
    shard_id = job.lease("worker-0")["shard"]["shard_id"]
    time.sleep(0.4)
    job.master.step()
    assert job.status()["progress"]["shards"]["doing"] == 0
    assert job.lease("worker-1")["shard"]["shard_id"] == shard_id
    assert not job.done("worker-0", shard_id)
    assert job.done("worker-1", shard_id)


def test_heartbeat_renews_leases(make_job) -> None:
    """A worker that keeps heart-beating keeps its shard past the original deadline."""
    job = make_job(lease_s=1.0)
    start_running(job)
    shard_id = job.lease("worker-0")["shard"]["shard_id"]
    time.sleep(0.6)
    job.post("/nodes/worker-0/heartbeat", {"steps": 1, "samples": 64, "step_time_ms": 1.0})
    time.sleep(0.6)  # now past the first deadline, before the renewed one
    job.master.step()
    assert job.status()["progress"]["shards"]["doing"] == 1
    assert job.done("worker-0", shard_id)


# -- validation --------------------------------------------------------------------------------
MALFORMED: list[tuple[str, str, object]] = [
    ("POST", "/nodes/worker-0/heartbeat", {"steps": 1, "samples": -1, "step_time_ms": 1.0}),
    ("POST", "/nodes/worker-0/heartbeat", {"steps": -1, "samples": 1, "step_time_ms": 1.0}),
    ("POST", "/nodes/worker-0/heartbeat", {"steps": 1, "samples": 1, "step_time_ms": -0.5}),
    ("POST", "/nodes/worker-0/heartbeat", {"steps": 1, "samples": 1, "step_time_ms": 1, "x": 1}),
    ("POST", "/nodes/worker-0/heartbeat", {"steps": 1, "samples": 1}),
    ("POST", "/nodes/worker-0/heartbeat", {"steps": 1, "samples": "many", "step_time_ms": 1}),
    ("POST", "/nodes/worker-0/heartbeat", [1, 2, 3]),
    ("POST", "/nodes/ps-0/ready", {"address": "10.0.0.1:1", "port": 1}),
    ("POST", "/nodes/ps-0/ready", {"address": "x" * 201}),
    ("POST", "/nodes/ps-0/ready", {"address": ""}),  # found by the fuzz test: a 500 once
    ("POST", "/nodes/ps-0/ready", {"address": "10.0.0.1"}),
    ("POST", "/nodes/ps-0/ready", {"address": "http://10.0.0.1:1"}),
    ("POST", "/shards/lease", {"node_id": "worker-0", "greedy": True}),
    ("POST", "/shards/lease", {"node_id": ""}),
    ("POST", "/shards/lease", {}),
    ("POST", "/shards/0/done", {"node_id": "worker-0", "samples": 250}),
    ("POST", "/shards/zero/done", {"node_id": "worker-0"}),
    ("POST", "/evaluation", {"node_id": "evaluator", "auc": 1.5, "logloss": 0.1, "samples": 5}),
    ("POST", "/evaluation", {"node_id": "evaluator", "auc": 0.5, "logloss": 0.1, "samples": 0}),
    ("POST", "/stop", {"reason": "x", "force": True}),
    ("POST", "/stop", {"reason": "x" * 501}),
]


def test_malformed_bodies_are_422_and_change_nothing(make_job) -> None:
    """Negative counts, unknown fields, wrong types and bad ranges are refused before use."""
    job = make_job()
    start_running(job)
    assert job.lease("worker-0")["shard"]["shard_id"] == 0
    job.post("/nodes/worker-0/heartbeat", {"steps": 2, "samples": 10, "step_time_ms": 1.0})
    before = observable(job)
    for method, path, body in MALFORMED:
        reply = job.api.request(method, P + path, json=body, headers=AUTH)
        assert reply.status_code == 422, (path, body, reply.text)
    reply = job.api.post(P + "/shards/lease", content=b"{oops", headers=AUTH)
    assert reply.status_code == 422
    assert observable(job) == before


def test_unknown_node_is_404(make_job) -> None:
    """Ready, heartbeat and lease for a node the master never started are 404 and change nothing."""
    job = make_job()
    start_running(job)
    before = observable(job)
    for path, body in [
        ("/nodes/ps-7/ready", {"address": "127.0.0.1:2"}),
        ("/nodes/worker-9/heartbeat", {"steps": 1, "samples": 1, "step_time_ms": 1.0}),
        ("/shards/lease", {"node_id": "nobody"}),
    ]:
        reply = job.api.post(P + path, json=body, headers=AUTH)
        assert reply.status_code == 404, path
        assert "unknown node" in reply.json()["detail"]
    assert observable(job) == before


def test_evaluation_from_an_unknown_node_is_404(make_job) -> None:
    """Only a node the master started may report the held-out evaluation."""
    job = make_job()
    start_running(job)
    body = {"node_id": "nobody", "auc": 0.99, "logloss": 0.01, "samples": 10}
    reply = job.api.post(P + "/evaluation", json=body, headers=AUTH)
    assert reply.status_code == 404
    assert job.status()["evaluation"] is None


# -- outcomes ----------------------------------------------------------------------------------
def _write_log(job: Job, node_id: str, text: str) -> None:
    job.layout.log_file(node_id).parent.mkdir(parents=True, exist_ok=True)
    job.layout.log_file(node_id).write_text(text)


def test_node_exiting_non_zero_fails_the_job_without_restarts_left(make_job) -> None:
    """With no restart budget a crashed worker fails the job: its id, the exhausted setting and
    its log tail in the message, its shards back at the front of TODO."""
    job = make_job(recovery=RecoveryConfig(max_node_restarts=0))
    start_running(job)
    assert [job.lease("worker-0")["shard"]["shard_id"] for _ in range(2)] == [0, 1]
    shard = job.lease("worker-1")["shard"]["shard_id"]
    assert job.done("worker-1", shard)
    _write_log(job, "worker-0", "Traceback (most recent call last):\nboom-42\n")

    job.launcher.exit("worker-1", 0)  # a clean exit is not a failure
    job.master.step()
    assert job.status()["state"] == "running"

    job.launcher.exit("worker-0", 1)
    job.master.step()
    status = job.status()
    assert status["state"] == "failed"
    assert "worker-0 exited with code 1" in status["message"]
    assert "no restarts left (0 used, recovery.max_node_restarts=0)" in status["message"]
    assert "boom-42" in status["message"]
    assert status["finished_at"] is not None
    assert status["progress"]["shards"] == {
        "todo": NUM_SHARDS - 1,
        "doing": 0,
        "done": 1,
        "quarantined": 0,
    }
    assert job.master.queue.to_dict()["todo"][:2] == [0, 1]  # back at the front, in order
    assert job.launcher.started.count(("worker-0", "worker")) == 1  # not relaunched
    nodes = {n["id"]: n for n in status["nodes"]}
    assert (nodes["worker-0"]["state"], nodes["worker-0"]["exit_code"]) == ("failed", 1)
    assert (nodes["worker-1"]["state"], nodes["worker-1"]["exit_code"]) == ("succeeded", 0)
    assert json.loads(job.layout.state_file.read_text())["state"] == "failed"
    # Survivors are told to stop and get no more work; the outcome is final.
    hb = {"steps": 1, "samples": 1, "step_time_ms": 1.0}
    assert job.post("/nodes/worker-1/heartbeat", hb) == {"stop": True}
    assert job.lease("worker-1") == no_shard("done")
    assert job.post("/stop", {"reason": "late"}) == {"state": "failed"}
    job.master.step()
    assert job.status()["message"] == status["message"]


def test_failure_message_counts_the_shards_returned_to_todo(make_job) -> None:
    """The failure message says how many shards the dead worker held (they went back to TODO)."""
    job = make_job(recovery=RecoveryConfig(max_node_restarts=0))
    start_running(job)
    job.lease("worker-0")
    job.lease("worker-0")
    job.launcher.exit("worker-0", 1)
    job.master.step()
    assert "2 shard(s) returned to TODO" in job.status()["message"]


def test_a_node_grows_once_after_an_oom_even_across_a_master_relaunch(
    make_job, monkeypatch: pytest.MonkeyPatch
) -> None:
    """worker-1 killed out of memory comes back with twice its memory; killed so again after
    its master was relaunched (a new master on the same job directory), it is relaunched at
    that size: once per job, not once per master."""
    job = make_job()
    start_running(job)
    monkeypatch.setattr(job.launcher, "exit_reason", lambda node: "OOMKilled", raising=False)
    job.launcher.exit("worker-1", 137)
    job.master.step()
    grown = job.master.spec.plan.size_of("worker-1")
    assert grown[1] == 2 * job.master.spec.plan.worker_memory_mb
    assert [p.rule for p in job.master.autoscaler.plans].count("oom") == 1
    relaunched = JobMaster(job.layout, job.layout.read_spec(), job.launcher, TOKEN)
    assert relaunched.spec.plan.size_of("worker-1") == grown
    # grown already: a failure like any other
    assert relaunched.recovery.oom.grow(NodeInfo("worker-1", "worker")) is None
    assert relaunched.spec.plan.size_of("worker-1") == grown


def test_crashed_worker_is_relaunched_and_its_shards_go_back_to_todo(make_job) -> None:
    """Within the restart budget a crashed worker is relaunched, its shards return to the front
    of TODO (the death counted against the one it was training) and the job keeps running."""
    job = make_job()
    start_running(job)
    assert [job.lease("worker-0")["shard"]["shard_id"] for _ in range(2)] == [0, 1]
    job.launcher.exit("worker-0", 1)
    job.master.step()  # the PS address is fake: its ledger is unreadable, shards resume as-is

    status = job.status()
    assert status["state"] == "running"
    assert job.launcher.started[-1] == ("worker-0", "worker")
    assert job.launcher.started.count(("worker-0", "worker")) == 2
    assert status["progress"]["shards"]["todo"] == NUM_SHARDS
    assert status["progress"]["shards"]["doing"] == 0
    assert job.master.queue.to_dict()["todo"][:3] == [0, 1, 2]
    assert dict(job.master.queue.failures) == {0: 1}  # the shard it was training
    worker = next(n for n in status["nodes"] if n["id"] == "worker-0")
    assert (worker["state"], worker["exit_code"], worker["restarts"]) == ("starting", None, 1)
    assert status["recovery"]["restarts"] == 1
    assert status["recovery"]["recoveries"] == 1

    # The relaunched worker reports ready (its recovery is timed) and gets shard 0 again, whole.
    job.post("/nodes/worker-0/ready", {})
    assert list(job.status()["recovery"]["recovery_seconds"]) == ["worker"]
    assert job.lease("worker-0")["shard"] == {
        "shard_id": 0,
        "epoch": 0,
        "start": 0,
        "end": SHARD_SIZE,
        "first_key": 0,
    }


def test_worker_that_lost_its_ps_is_relaunched_for_free(make_job) -> None:
    """Exit code EXIT_PS_LOST is not the worker's fault: relaunched even with no restart budget,
    and its shards are not counted as failed."""
    job = make_job(recovery=RecoveryConfig(max_node_restarts=0))
    start_running(job)
    job.lease("worker-0")
    job.launcher.exit("worker-0", master_api.EXIT_PS_LOST)
    job.master.step()
    status = job.status()
    assert status["state"] == "running"
    assert job.launcher.started.count(("worker-0", "worker")) == 2
    assert status["recovery"]["restarts"] == 0
    assert job.master.queue.failures[0] == 0
    assert job.master.queue.is_todo(0)


def test_parameter_server_crash_is_recovered(make_job) -> None:
    """A dead PS puts the job in RECOVERING: the workers' shards go back to TODO and no shard is
    handed out, the PS is relaunched; the workers keep running (they wait for it) and once it
    is ready the PS layout version moves on: they reconnect, and only a worker that gave up
    and exited is started again (its exit is no failure)."""
    job = make_job()
    start_running(job)
    assert job.lease("worker-0")["shard"]["shard_id"] == 0
    job.launcher.exit("ps-0", 137)
    job.master.step()

    status = job.status()
    assert status["state"] == "recovering"
    assert "ps-0 exited with code 137" in status["message"]
    assert job.launcher.stopped == []
    assert job.launcher.started.count(("ps-0", "ps")) == 2
    assert status["progress"]["shards"] == {
        "todo": NUM_SHARDS,
        "doing": 0,
        "done": 0,
        "quarantined": 0,
    }
    assert status["recovery"]["restarts"] == 1
    assert job.lease("worker-1") == no_shard("wait")
    assert job.api.get(P + "/cluster", headers=AUTH).status_code == 409  # no PS address yet

    job.launcher.exit("worker-0", master_api.EXIT_PS_LOST)  # gave up waiting: not a failure
    job.master.step()
    assert job.status()["state"] == "recovering"
    assert job.status()["recovery"]["restarts"] == 1

    job.post("/nodes/ps-0/ready", {"address": "127.0.0.1:2"})
    job.master.step()  # the fake PS has no readable ledger: nobody trains until it has one
    assert job.status()["state"] == "recovering"
    assert job.launcher.started.count(("worker-0", "worker")) == 1
    job.master.dispatch.reconcile = lambda shards: True  # type: ignore[method-assign]  # ledger read
    job.master.step()
    status = job.status()
    assert status["state"] == "running", status["message"]
    assert job.launcher.started[-1] == ("worker-0", "worker")  # worker-1 waited it out
    assert job.launcher.started.count(("worker-1", "worker")) == 1
    assert list(status["recovery"]["recovery_seconds"]) == ["ps"]
    assert job.get("/cluster")["ps_set_version"] == 1
    stale = job.post("/shards/lease", {"node_id": "worker-1", "ps_set_version": 0})
    assert stale == no_shard("wait", 1)  # reconnect first
    fresh = job.post("/shards/lease", {"node_id": "worker-1", "ps_set_version": 1})
    assert fresh["shard"]["shard_id"] == 0


def test_a_ps_that_exits_cleanly_unasked_is_lost_not_done(make_job) -> None:
    """A PS the master did not stop has not finished: a SIGTERM from elsewhere (an eviction,
    a dead parent thread) ends it with code 0, and its rows are gone all the same. It had
    been marked SUCCEEDED without a word; the evaluator then failed on its address."""
    job = make_job()
    start_running(job)
    job.launcher.exit("ps-0", 0)
    job.master.step()
    status = job.status()
    assert status["state"] == "recovering"
    assert "ps-0 exited with code 0" in status["message"]
    assert job.launcher.started.count(("ps-0", "ps")) == 2


def test_under_ecrm_the_workers_keep_their_shards_through_a_lost_ps(
    make_job, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ECRM: the workers train on while a lost PS's replacement starts
    (``core.ecrm.degraded``): their shards stay leased and more are handed out. Once the
    replacement is up, every shard leased through the loss is checked against the PS ledgers
    when it is done: the lost PS may have applied one of its batches without its parity
    holders hearing of it. (The PS are fakes here: the ECRM set-up and the ledger read are
    recorded, not made.)"""
    config = CheckpointPolicyConfig.parse({"policy": "ecrm", "ecrm": {"k": 2}})
    job = make_job(num_ps=3, checkpoint=config)
    assert job.master.autoscaler.limits.low("num_ps") == 3  # no plan below ECRM's k + 1 PS
    rebuilt: list[int] = []

    def ecrm_ready() -> bool:
        job.master.policy._live = True
        rebuilt.extend(sorted(job.master.policy._pending))
        job.master.policy._pending.clear()
        return True

    reconciled: list[list[int]] = []

    def reconcile(shards: list) -> bool:
        if shards:
            reconciled.append(sorted(s.shard_id for s in shards))
        return True

    monkeypatch.setattr(job.master.policy, "prepare_ps", lambda master: ecrm_ready())
    monkeypatch.setattr(job.master.dispatch, "reconcile", reconcile)
    job.master.step()
    for i in range(3):
        job.post(f"/nodes/ps-{i}/ready", {"address": f"127.0.0.1:{i + 1}"})
    job.master.step()
    assert job.status()["state"] == "running"
    first = job.lease("worker-0")["shard"]["shard_id"]

    job.launcher.exit("ps-1", 137)
    job.master.step()
    assert job.status()["state"] == "recovering"
    assert [s.shard_id for s in job.master.queue.held_by("worker-0")] == [first]  # kept
    second = job.lease("worker-1")
    assert second["status"] == "ok" and second["ps_set_version"] == 0  # trained through it
    job.post("/nodes/ps-1/ready", {"address": "127.0.0.1:9"})
    reconciled.clear()
    job.master.step()
    assert rebuilt == [1] and job.status()["state"] == "running"
    assert job.get("/cluster")["ps_set_version"] == 1
    assert reconciled == [list(range(NUM_SHARDS))]  # the leased two are skipped in there
    assert job.done("worker-0", first)
    job.master.step()
    assert reconciled[-1] == [first]  # checked against the ledgers once done
    assert job.done("worker-1", second["shard"]["shard_id"])
    job.master.step()
    assert reconciled[-1] == [second["shard"]["shard_id"]]
    third = job.post("/shards/lease", {"node_id": "worker-0", "ps_set_version": 1})["shard"]
    assert job.done("worker-0", third["shard_id"])
    job.master.step()
    assert reconciled[-1] == [second["shard"]["shard_id"]]  # leased after: not checked again


def test_under_ecrm_the_api_answers_while_the_master_waits_on_the_ps(
    make_job, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ECRM: the workers train through a lost PS, so the master's tick must not stall their
    leases while it waits on the PS: the replacement's set-up and the ledger read took about
    0.3 s at a loss, with every worker's lease waiting on them (measured). A shard leased
    during the ledger read is left out of that check and checked once done, at the next
    tick, against ledgers read then. (Fake PS: each call makes a request from another thread,
    which must be answered before the call returns.)"""
    config = CheckpointPolicyConfig.parse({"policy": "ecrm", "ecrm": {"k": 2}})
    job = make_job(num_ps=3, checkpoint=config)

    def answered_meanwhile(request: Callable[[], dict]) -> dict:
        reply: list[dict] = []
        thread = threading.Thread(target=lambda: reply.append(request()))
        thread.start()
        thread.join(timeout=5)
        assert reply, "the API waited for the master's tick"
        return reply[0]

    during: dict[str, dict] = {}

    class SlowPS:  # the master's PSClient, for what this test reaches
        def ecrm_setup(self, *args: object) -> None:
            pass

        def ecrm_rebuild(self, index: int, *args: object) -> dict[str, np.ndarray]:
            during["set-up"] = answered_meanwhile(lambda: job.lease("worker-1"))
            return {"rows_total": np.array([100])}

        def ecrm_status(self, index: int) -> dict[str, np.ndarray]:
            return {"rebuilding": np.array([1])}  # still going: the transition is what counts

        def close(self) -> None:
            pass

    def applied_everywhere(purpose: str) -> set[int]:
        if "ledger read" not in during:
            during["ledger read"] = answered_meanwhile(lambda: job.lease("worker-0"))
        return set()  # no batch anywhere: every shard checked resumes at its start

    checked: list[list[int]] = []
    reconcile = job.master.queue.reconcile

    def recorded(shards: list, applied: set[int]) -> None:
        checked.append(sorted(s.shard_id for s in shards))
        reconcile(shards, applied)

    monkeypatch.setattr(job.master.ps, "client", SlowPS)
    monkeypatch.setattr(job.master, "applied_everywhere", applied_everywhere)
    monkeypatch.setattr(job.master.queue, "reconcile", recorded)
    job.master.step()
    for i in range(3):
        job.post(f"/nodes/ps-{i}/ready", {"address": f"127.0.0.1:{i + 1}"})
    job.master.step()
    assert job.status()["state"] == "running"
    job.launcher.exit("ps-1", 137)
    job.master.step()
    job.post("/nodes/ps-1/ready", {"address": "127.0.0.1:9"})
    job.master.step()  # the replacement's set-up, then the ledger read: the API answers both
    assert job.status()["state"] == "running"
    assert during["set-up"]["status"] == "ok" and during["set-up"]["ps_set_version"] == 0
    meanwhile = during["ledger read"]["shard"]["shard_id"]
    assert during["ledger read"]["ps_set_version"] == 0
    assert sorted({*checked[-1], meanwhile}) == list(range(NUM_SHARDS))  # all but that one
    assert job.done("worker-0", meanwhile)
    job.master.step()
    assert checked[-1] == [meanwhile]  # against the ledgers read now: it lacks its batches
    assert job.master.queue.is_todo(meanwhile)


def test_a_worker_waiting_out_a_lost_ps_hears_of_the_relaunch_at_once(make_job) -> None:
    """``GET /cluster?after=N&wait_s=S`` is held until the layout moves past N (the relaunched
    PS is announced) instead of the worker polling for it; answered at once when it already
    has, and by at most LAYOUT_WAITERS held requests at a time."""
    job = make_job()
    start_running(job)
    job.launcher.exit("ps-0", 137)
    job.master.step()
    got: list[master_api.ClusterInfo] = []
    waiter = threading.Thread(target=lambda: got.append(job.master.cluster(after=0, wait_s=60)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # held: no new layout yet
    job.post("/nodes/ps-0/ready", {"address": "127.0.0.1:2"})
    job.master.dispatch.reconcile = lambda shards: True  # type: ignore[method-assign]  # ledger read
    job.master.step()
    waiter.join(30)  # woken by the new layout, long before its 60 s ran out
    assert not waiter.is_alive()
    assert got[0].ps_set_version == 1 and got[0].ps == ["127.0.0.1:2"]

    reply = job.get("/cluster", params={"after": 0, "wait_s": 5})  # already past: at once
    assert reply["ps_set_version"] == 1
    job.master.ps_set._waits = threading.BoundedSemaphore(1)
    assert job.master.ps_set._waits.acquire(blocking=False)  # the one waiting slot is taken
    started = time.monotonic()
    assert job.get("/cluster", params={"after": 1, "wait_s": 5})["ps_set_version"] == 1
    assert time.monotonic() - started < 5  # answered without waiting
    for bad in ({"after": -1}, {"after": 0, "wait_s": 60}, {"wait_s": -1}):
        assert job.api.get(P + "/cluster", headers=AUTH, params=bad).status_code == 422


def test_parameter_server_crash_fails_the_job_without_restarts_left(make_job) -> None:
    """With no restart budget a PS exiting non-zero while starting fails the job at once."""
    job = make_job(recovery=RecoveryConfig(max_node_restarts=0))
    job.master.step()
    job.launcher.exit("ps-0", 137)
    job.master.step()
    status = job.status()
    assert status["state"] == "failed"
    assert "ps-0 exited with code 137" in status["message"]
    assert "recovery.max_node_restarts=0" in status["message"]
    assert "(no log)" in status["message"]
    assert job.launcher.started == [("ps-0", "ps")]


def test_stop_request(make_job) -> None:
    """POST /stop ends the job as stopped; nodes are told to stop and get no more shards."""
    job = make_job()
    start_running(job)
    job.lease("worker-0")
    assert job.post("/stop", {"reason": "task cleared in Airflow"}) == {"state": "stopped"}
    status = job.status()
    assert status["state"] == "stopped"
    assert status["message"] == "task cleared in Airflow"
    assert status["finished_at"] is not None
    hb = {"steps": 1, "samples": 1, "step_time_ms": 1.0}
    assert job.post("/nodes/worker-0/heartbeat", hb) == {"stop": True}
    assert job.lease("worker-1") == no_shard("done")
    # Later stops and ticks change nothing; a default reason is accepted.
    assert job.post("/stop") == {"state": "stopped"}
    job.master.step()
    assert job.status()["message"] == "task cleared in Airflow"
    assert json.loads(job.layout.state_file.read_text())["state"] == "stopped"
    job.master.shutdown_nodes()
    assert job.launcher.stop_all_calls == 1
    assert {n["state"] for n in job.status()["nodes"]} == {"stopped"}


def test_the_job_and_every_node_are_stopped_at_the_specs_deadline(
    make_job, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the deadline in ``job.json`` the supervisor stops the training job (``stopped``,
    the message naming the deadline and ``max_runtime``) and every node; the trigger's event
    and the task's exception say why. Before it, ticks leave the job training."""
    deadline = JobDeadline.after(timedelta(seconds=2))
    job = make_job(deadline=deadline)
    assert job.layout.read_spec().deadline == deadline  # a relaunched master sees the same
    start_running(job)
    job.master.step()
    assert job.status()["state"] == "running"
    time.sleep(max(deadline.remaining().total_seconds(), 0) + 0.05)

    server = SimpleNamespace(should_exit=False)
    supervisor = threading.Thread(target=supervise, args=(job.master, server, 0), daemon=True)
    supervisor.start()
    supervisor.join(timeout=5)
    server.should_exit = True  # ends a supervisor that let the job run on
    supervisor.join(timeout=5)

    status = job.status()
    assert status["state"] == "stopped"
    at = deadline.at.strftime("%Y-%m-%d %H:%M:%S")
    assert f"deadline {at} UTC" in status["message"]
    assert "max_runtime=0:00:02" in status["message"]
    assert job.launcher.stop_all_calls == 1
    assert {n["state"] for n in status["nodes"]} == {"stopped"}
    assert json.loads(job.layout.state_file.read_text())["message"] == status["message"]

    event = asyncio.run(anext(ElasticJobTrigger(str(job.layout.root)).run())).payload
    assert (event["status"], event["job"]["message"]) == ("stopped", status["message"])
    assert status["message"] in event["message"]
    with DAG(dag_id="deadline_test", schedule=None, start_date=datetime(2026, 1, 1)):
        task = ElasticTrainingOperator(task_id="train", train_data="/data/train")
    monkeypatch.setattr(task, "_record", lambda _context, _job: None)
    with pytest.raises(AirflowException, match=r"stopped: .*ran past its deadline"):
        task.execute_complete({}, event)  # type: ignore[arg-type]


def test_a_worker_gives_its_shards_back_and_they_resume_from_the_ps_ledger(make_job) -> None:
    """A worker that gave up on what it trained (a lost PS, ``worker.training.train``) gives
    its shards back once it is connected again: each resumes at its first batch a PS lacks."""
    job = make_job()
    job.master.step()
    layout = EmbeddingPlacement.from_features(job.master.spec.resolved_features)
    ps = ParameterServer(0, 1, layout, Optimizer("adagrad", 0.05), 0)
    server, port = start_server(ps, TOKEN, threads=2)
    client = PSClient([f"127.0.0.1:{port}"], TOKEN)
    try:
        job.post("/nodes/ps-0/ready", {"address": f"127.0.0.1:{port}"})
        job.master.step()
        group = layout.groups[0]
        ids = {group.name: np.arange(10, dtype=np.int64)}
        grads = {group.name: np.full((10, group.dim), 0.01, np.float32)}
        shard = job.lease("worker-0")["shard"]
        for index in range(2):
            client.push(ids, grads, {}, key=shard["first_key"] + index)
        assert job.post("/nodes/worker-0/release") == {"released": 1}
        assert job.post("/nodes/worker-0/release") == {"released": 0}
        again = job.lease("worker-1")["shard"]
        assert again["shard_id"] == shard["shard_id"]
        assert again["first_key"] == shard["first_key"] + 2
        assert again["start"] == shard["start"] + 2 * BATCH_SIZE
    finally:
        client.close()
        server.stop(None)


@pytest.mark.parametrize("with_eval", [False, True], ids=["train-only", "with-eval"])
def test_full_job_with_a_real_parameter_server(make_job, with_eval: bool) -> None:
    """Drain all shards, (evaluate,) then the master saves the model from a real PS: succeeded."""
    job = make_job(with_eval=with_eval)
    job.master.step()
    ps = ParameterServer(
        0,
        1,
        EmbeddingPlacement.from_features(job.master.spec.resolved_features),
        Optimizer("adagrad", 0.05),
        0,
    )
    server, port = start_server(ps, TOKEN, threads=2)
    try:
        address = f"127.0.0.1:{port}"
        job.post("/nodes/ps-0/ready", {"address": address})
        job.master.step()
        # A worker touches some rows through the address the cluster route gives out, and
        # pushes one keyed gradient per batch of every shard it trains.
        cluster = job.get("/cluster")
        client = PSClient(cluster["ps"], TOKEN)
        group = EmbeddingPlacement.from_features(job.master.spec.resolved_features).groups[0]
        ids = {group.name: np.arange(10, dtype=np.int64)}
        grads = {group.name: np.full((10, group.dim), 0.01, np.float32)}
        client.pull(ids, dense=False)

        def train(shard: dict) -> None:
            batches = range(shard["start"], shard["end"], BATCH_SIZE)
            for index, _ in enumerate(batches):
                client.push(ids, grads, {}, key=shard["first_key"] + index)

        try:
            assert len(_drain(job, train=train)) == NUM_SHARDS
            client.push(ids, grads, {}, key=0)  # a retried push: turned away by the ledger
        finally:
            client.close()
        job.master.step()
        status = job.status()
        if with_eval:
            assert status["state"] == "evaluating"
            assert job.lease("worker-0") == no_shard("done")
            # the first worker to ask scores the held-out split: no node starts for it
            assert job.post("/nodes/worker-1/evaluate") == {"evaluate": True}
            assert job.post("/nodes/worker-0/evaluate") == {"evaluate": False}
            assert job.post("/nodes/worker-1/evaluate") == {"evaluate": True}  # asked again
            job.master.step()
            assert "evaluator" not in {node for node, _ in job.launcher.started}
            assert job.status()["message"] == "scoring the held-out split on worker-1"
            body = {"node_id": "worker-0", "auc": 0.75, "logloss": 0.45, "samples": 500}
            refused = job.api.post(P + "/evaluation", json=body, headers=AUTH)
            assert refused.status_code == 409, refused.text
            assert "worker-1 scores the held-out split" in refused.text
            assert job.post("/evaluation", {**body, "node_id": "worker-1"}) == {"ok": True}
            job.master.step()
            assert job.status()["state"] == "evaluating"  # until the evaluator has exited
            job.launcher.exit("worker-1", 0)
            job.master.step()
            status = job.status()
    finally:
        server.stop(None)

    assert status["state"] == "succeeded", status["message"]
    assert status["message"] == f"trained {NUM_TRAIN * EPOCHS} samples"
    result = status["result"]
    assert result["samples_trained"] == NUM_TRAIN * EPOCHS
    assert result["embedding_rows"] == 10
    assert result["accounting"] == {
        "shards": NUM_SHARDS,
        "done_once": NUM_SHARDS,
        "done_more_than_once": 0,
        "never_done": 0,
        "requeued": 0,
        "quarantined": [],
        "batches": {
            "expected": NUM_SHARDS * BATCHES_PER_SHARD,
            "trained_once": NUM_SHARDS * BATCHES_PER_SHARD,
            "never_trained": 0,
            "partially_trained": 0,
            "retried_pushes_turned_away": 1,
        },
    }
    assert result["samples_resumed"] == 0
    assert result["samples_trained_this_run"] == NUM_TRAIN * EPOCHS
    assert result["recovery"]["restarts"] == 0 and result["recovery"]["quarantined"] == []
    (final,) = status["recovery"]["checkpoint_history"]  # the end of training's checkpoint
    assert final["samples"] == NUM_TRAIN * EPOCHS and "checkpoint_history" not in result["recovery"]
    assert ps.pushes == NUM_SHARDS * BATCHES_PER_SHARD  # the retried push changed nothing
    assert result["auc"] == (0.75 if with_eval else None)
    assert result["eval_samples"] == (500 if with_eval else 0)
    model_dir = Path(result["model_dir"])
    assert sorted(p.name for p in model_dir.iterdir()) == ["model.json", "ps-0.npz"]
    manifest = json.loads((model_dir / "model.json").read_text())
    assert manifest["partitions"] == ["ps-0.npz"] and manifest["job_id"] == "unit-job.1"
    with np.load(model_dir / "ps-0.npz") as npz:
        assert sorted(npz[f"table/{group.name}/ids"].tolist()) == list(range(10))
        assert sorted(npz["ledger/applied"].tolist()) == list(range(NUM_SHARDS * BATCHES_PER_SHARD))
    assert json.loads(job.layout.state_file.read_text())["state"] == "succeeded"


def _propose(job: Job, **changes: object) -> int:
    """Put a proposal in the autoscaler's list as the optimizer would."""
    current = job.master.spec.plan
    plans = job.master.autoscaler.plans
    plans.append(
        PlanRecord.model_validate(
            {
                "id": len(plans) + 1,
                "at": 0.0,
                "plan": current.model_copy(update=changes).model_dump(),
                "previous": current.model_dump(),
                "rule": "idle_ps",
                "reason": "test",
                "state": "proposed",
            }
        )
    )
    return len(plans)


def test_applying_a_plan_starts_workers_once_and_keeps_the_plan(make_job) -> None:
    """More workers: the new ones start, job.json carries the plan, a second apply is a no-op."""
    job = make_job()
    start_running(job)
    plan_id = _propose(job, num_workers=3)
    assert [p["state"] for p in job.get("/plans")] == ["proposed"]
    record = job.post(f"/plans/{plan_id}/apply")
    assert record["state"] == "applied"
    assert job.launcher.started[-1] == ("worker-2", "worker")
    assert job.layout.read_spec().plan.num_workers == 3
    starts = len(job.launcher.started)
    assert job.post(f"/plans/{plan_id}/apply")["state"] == "applied"
    assert len(job.launcher.started) == starts


def test_fewer_workers_stop_the_last_and_return_its_shards(make_job) -> None:
    job = make_job()
    start_running(job)
    assert job.lease("worker-1")["shard"]["shard_id"] == 0
    plan_id = _propose(job, num_workers=1)
    assert job.post(f"/plans/{plan_id}/apply")["state"] == "applied"
    assert job.launcher.stopped == ["worker-1"]
    assert job.status()["progress"]["shards"]["doing"] == 0
    assert job.lease("worker-0")["shard"]["shard_id"] == 0  # back at the front, not a failure
    assert job.master.queue.failures[0] == 0


def test_a_ps_count_change_starts_the_new_ps_and_waits_for_them(make_job) -> None:
    """The resize itself (rows moving) is tested on real PS: tests/unit/test_ps_resize.py and
    tests/integration/test_elastic_resize.py."""
    job = make_job()
    start_running(job)
    plan_id = _propose(job, num_ps=2)
    record = job.post(f"/plans/{plan_id}/apply")
    assert record["state"] == "applying"
    assert job.launcher.started.count(("ps-1", "ps")) == 1
    assert job.post(f"/plans/{plan_id}/apply")["state"] == "applying"  # no second start
    assert job.launcher.started.count(("ps-1", "ps")) == 1
    assert job.lease("worker-0")["status"] == "ok"  # training goes on while ps-1 starts


def test_node_size_changes_are_declined_where_the_launcher_cannot_resize(make_job) -> None:
    job = make_job()
    start_running(job)
    plan_id = _propose(job, ps_cpu=4.0)
    record = job.post(f"/plans/{plan_id}/apply")
    assert record["state"] == "declined"
    assert "node sizes are fixed" in record["note"]


def test_a_requested_plan_is_proposed_and_replaces_a_waiting_one(make_job) -> None:
    job = make_job()
    start_running(job)
    first = _propose(job, num_workers=3)
    record = job.post("/plans", {"num_workers": 1, "reason": "cost cut"})
    assert record["rule"] == "requested" and record["state"] == "proposed"
    assert record["plan"]["num_workers"] == 1 and record["reason"] == "cost cut"
    states = {p["id"]: p["state"] for p in job.get("/plans")}
    assert states[first] == "superseded" and states[record["id"]] == "proposed"
    bad = job.api.post(P + "/plans", json={"num_ps": 0}, headers=AUTH)
    assert bad.status_code == 422 and "num_ps" in bad.text


def test_applying_an_unknown_plan_is_404(make_job) -> None:
    job = make_job()
    start_running(job)
    assert job.api.post(P + "/plans/9/apply", headers=AUTH).status_code == 404


def test_a_costlier_checkpoint_policy_than_the_measured_costs_call_for_is_said_once(
    make_job, caplog: pytest.LogCaptureFixture
) -> None:
    """With a known failure rate each committed checkpoint's measured cost re-plans the
    policy; when the user's choice is expected to cost clearly more than the recommendation
    (ECRM's running overhead against millisecond checkpoints failing once an hour), the job
    says so once, in its log and status."""
    config = CheckpointPolicyConfig.parse({"policy": "ecrm", "mtbf_s": 3600, "ecrm": {"k": 2}})
    job = make_job(num_ps=3, checkpoint=config)
    times = CheckpointTimes(pause_s=0.002, durable_s=0.05, bytes=1 << 20)
    with caplog.at_level("WARNING", logger="airflow_rover.master.job"):
        for n in (1, 2):
            job.master.checkpointing.committed(job.layout.checkpoint_dir(n), times)
    advice = job.status()["recovery"]["checkpoint_policy_advice"]
    assert advice.startswith("checkpoint_policy='ecrm' is expected to cost")
    assert "recommended: full" in advice
    assert [r.getMessage() for r in caplog.records].count(advice) == 1


def test_a_rebuild_marker_left_by_a_former_master_is_cleared(make_job, tmp_path: Path) -> None:
    """A PS marked for an ECRM rebuild starts empty; after a retry or a master restart every
    PS restores from the checkpoint, so no marker may survive into the new master."""
    marker = JobDir(tmp_path / "job").ecrm_rebuild_marker(1)
    marker.parent.mkdir(parents=True)
    marker.touch()
    make_job(
        num_ps=3, checkpoint=CheckpointPolicyConfig.parse({"policy": "ecrm", "ecrm": {"k": 2}})
    )
    assert not marker.exists()


def test_the_local_launcher_keeps_one_spare_and_hands_it_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``recovery.standby_ps``: one spare at a time; taking it writes the assignment the spare
    waits for and makes its process the node's (its exit is then the node's exit)."""
    layout = JobDir(tmp_path / "job")
    exited = threading.Event()
    launcher = LocalNodeLauncher(layout, "http://127.0.0.1:1", exited=exited)
    spawned: list[subprocess.Popen] = []

    def spawn(node_id: str, role: str) -> subprocess.Popen:  # a process, not a PS
        spawned.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))
        return spawned[-1]

    monkeypatch.setattr(launcher, "_spawn", spawn)
    assert not launcher.take_standby("ps-1")  # none started yet
    launcher.start_standby()
    launcher.start_standby()  # one is alive: no second
    assert len(spawned) == 1 and launcher.exit_codes() == {}
    assert launcher.take_standby("ps-1")
    assert layout.standby_assignment("ps-standby-1").read_text() == "ps-1"
    assert launcher.exit_codes() == {"ps-1": None}
    assert not launcher.take_standby("ps-2")  # it was the only one
    launcher.start_standby()
    assert len(spawned) == 2
    spawned[0].kill()
    assert exited.wait(10)  # the taken-over process is watched like any node
    launcher.stop_all(grace_s=5)
    assert all(p.poll() is not None for p in spawned)  # the spare too


def test_a_node_outlives_the_thread_that_asked_for_it(tmp_path: Path) -> None:
    """A node dies with its parent (PR_SET_PDEATHSIG), which the kernel takes to be the thread
    that forked it. The master starts nodes from the API's pool threads too (a resize applied
    by ``POST /plans/{id}/apply``), which retire when idle: a PS started so was SIGTERMed
    about 10 s later, the evaluator then failed ten times on its address and the job failed
    (seen in CI). Nodes are forked from the launcher's own thread, whoever asks. (Forked from
    the asking thread, the same child is gone with -15 once that thread ends.)"""
    launcher = LocalNodeLauncher(JobDir(tmp_path / "job"), "http://127.0.0.1:1")
    started: list[subprocess.Popen] = []
    asker = threading.Thread(
        target=lambda: started.append(
            launcher._fork([sys.executable, "-c", "import time; time.sleep(30)"], "ps-1")
        )
    )
    asker.start()
    asker.join()  # the asking thread is gone
    try:
        time.sleep(0.5)  # the signal would be delivered at once
        assert started[0].poll() is None, f"exited with {started[0].returncode}"
    finally:
        started[0].kill()
        started[0].wait()


def test_a_spare_that_dies_waiting_is_not_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broken spare would otherwise be restarted on every tick."""
    launcher = LocalNodeLauncher(JobDir(tmp_path / "job"), "http://127.0.0.1:1")
    spawned: list[subprocess.Popen] = []

    def spawn(node_id: str, role: str) -> subprocess.Popen:
        spawned.append(subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]))
        return spawned[-1]

    monkeypatch.setattr(launcher, "_spawn", spawn)
    launcher.start_standby()
    spawned[0].wait(10)
    launcher.start_standby()
    launcher.start_standby()
    assert len(spawned) == 1
    assert not launcher.take_standby("ps-0")


WARM_PRIOR = AutoscalePrior(
    grad=1.0,
    upd=6.0,
    sync=0.1,
    emb=3.0,
    bias=0.5,
    hot_share=0.3,
    worker_start_s=21.0,
    ps_reload_s=50.0,
    jobs=("run-1", "run-2"),
)


def test_the_masters_autoscaler_starts_from_the_specs_prior_and_says_so(make_job) -> None:
    warm = make_job(autoscale=AutoscaleConfig(prior=WARM_PRIOR))
    scaler = warm.master.autoscaler
    assert scaler.prior == Prior.from_config(WARM_PRIOR)
    assert scaler.costs() == ScalingCosts(worker_start_s=21.0, ps_reload_s=50.0)
    assert scaler.shape.hot_share == 0.3
    start_running(warm)
    section = warm.status()["autoscale"]
    assert section["start"] == "warm" and section["prior_jobs"] == ["run-1", "run-2"]
    assert section["prior_parts"] == ["coefficients", "hot_share", "scaling_costs"]
    cold = make_job()
    assert cold.master.autoscaler.prior == Prior()
    assert cold.status()["autoscale"]["start"] == "cold"


def test_local_nodes_share_the_hosts_cores_and_the_autoscaler_knows(
    dataset: GeneratedDataset, tmp_path: Path
) -> None:
    """The local launcher's nodes are processes of one machine: the master's autoscaler
    bounds its plans by that machine's cores (``core.host_bound``); a launcher whose nodes
    have their own cores (the default) leaves it unbounded."""
    local = LocalNodeLauncher(JobDir(tmp_path / "local"), "http://127.0.0.1:1")
    assert local.shared_host_cores == len(os.sched_getaffinity(0))
    job = new_job(dataset, tmp_path / "shared")
    try:
        assert job.master.autoscaler.host_cores is None  # FakeLauncher: nodes of their own
    finally:
        job.api.close()
    shared = FakeLauncher()
    shared.shared_host_cores = 3.0
    master = JobMaster(job.layout, job.master.spec, shared, TOKEN)
    assert master.autoscaler.host_cores == 3.0
