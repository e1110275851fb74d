"""The master's data-worker room behind the real API: data workers start with training, serve
through lease replies once ready, come back when they fail, and leave by draining."""

from __future__ import annotations

import time
from collections.abc import Callable

from master_rig import Job, start_running

from airflow_rover.core.data_autoscaler import DataWorkerDecision
from airflow_rover.core.spec import DataWorkersConfig
from airflow_rover.master.data_workers import DRAIN_S


def data_started(job: Job) -> list[str]:
    return [node for node, role in job.launcher.started if role == "data"]


def test_fixed_data_workers_start_with_training_and_serve_once_ready(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(data_workers=DataWorkersConfig(mode="fixed", count=2))
    start_running(job)
    assert data_started(job) == ["data-0", "data-1"]
    assert job.lease("worker-0")["data_workers"] == []  # none ready: trainers prepare batches
    job.post("/nodes/data-1/ready", {"address": "127.0.0.1:7061"})
    job.post("/nodes/data-0/ready", {"address": "127.0.0.1:7060"})
    assert job.lease("worker-0")["data_workers"] == ["127.0.0.1:7060", "127.0.0.1:7061"]
    section = job.status()["data_workers"]
    assert (section["mode"], section["target"], section["running"]) == ("fixed", 2, 2)


def test_a_failed_data_worker_is_relaunched_and_off_the_list_meanwhile(
    make_job: Callable[..., Job],
) -> None:
    job = make_job(data_workers=DataWorkersConfig(mode="fixed", count=2))
    start_running(job)
    job.post("/nodes/data-0/ready", {"address": "127.0.0.1:7060"})
    job.post("/nodes/data-1/ready", {"address": "127.0.0.1:7061"})
    job.launcher.exit("data-1", -9)
    job.master.step()
    assert data_started(job) == ["data-0", "data-1", "data-1"]
    assert job.lease("worker-0")["data_workers"] == ["127.0.0.1:7060"]
    assert job.status()["state"] == "running"
    assert job.status()["recovery"]["restarts"] == 1
    job.post("/nodes/data-1/ready", {"address": "127.0.0.1:7062"})
    assert job.lease("worker-0")["data_workers"] == ["127.0.0.1:7060", "127.0.0.1:7062"]
    assert job.status()["recovery"]["recovery_seconds"]["data"]  # timed like any node's


def test_a_step_down_drains_before_it_stops(make_job: Callable[..., Job]) -> None:
    job = make_job(data_workers=DataWorkersConfig(mode="auto", min=1, max=3, count=2))
    start_running(job)
    for i in (0, 1):
        job.post(f"/nodes/data-{i}/ready", {"address": f"127.0.0.1:706{i}"})
    room = job.master.data_workers
    room.decide(DataWorkerDecision(time.time(), 1, 2, "queue-full", "test"))
    job.master.step()
    assert job.lease("worker-0")["data_workers"] == ["127.0.0.1:7060"]  # no new shard for it
    assert "data-1" not in job.launcher.stopped  # its calls in flight may finish
    room.tick([], now=time.time() + DRAIN_S + 1)
    assert job.launcher.stopped == ["data-1"]
    decisions = job.status()["data_workers"]["decisions"]
    assert [(d["previous"], d["count"], d["rule"]) for d in decisions] == [(2, 1, "queue-full")]
    assert room.summary() == {"mode": "auto", "count": 1, "decisions": 1}
    room.decide(DataWorkerDecision(time.time(), 2, 1, "input-wait", "test"))
    job.master.step()
    assert data_started(job) == ["data-0", "data-1", "data-1"]  # back, under the same name


def test_off_means_no_data_workers_and_no_section(make_job: Callable[..., Job]) -> None:
    job = make_job()
    start_running(job)
    assert data_started(job) == []
    assert "data_workers" not in job.status()
    assert job.lease("worker-0")["data_workers"] == []
