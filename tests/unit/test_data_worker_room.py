"""The master's data-worker room behind the real API: data workers start with training, serve
through lease replies once ready, come back when they fail, and leave by draining."""

from __future__ import annotations

import time
from collections.abc import Callable

from master_rig import Job, start_running

from airflow_rover.core.data_autoscaler import DataWorkerDecision
from airflow_rover.core.spec import DataWorkersConfig
from airflow_rover.master.data_workers import DRAIN_TIMEOUT_S
from airflow_rover.master.nodes import NodeInfo


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
    beat = {"steps": 9, "samples": 900, "step_time_ms": 3.0}
    assert job.post("/nodes/data-1/heartbeat", beat) == {"stop": True}  # finish and leave
    assert job.post("/nodes/data-0/heartbeat", beat) == {"stop": False}
    assert job.launcher.stopped == []  # its calls in flight may finish
    assert room.status()["running"] == 1 and room.leaving("data-1")
    job.launcher.exit("data-1", 0)
    job.master.step()
    assert not room.leaving("data-1") and job.master.nodes["data-1"].state == "succeeded"
    assert data_started(job) == ["data-0", "data-1"]  # not relaunched
    decisions = job.status()["data_workers"]["decisions"]
    assert [(d["previous"], d["count"], d["rule"]) for d in decisions] == [(2, 1, "queue-full")]
    assert room.summary() == {"mode": "auto", "count": 1, "decisions": 1}
    room.decide(DataWorkerDecision(time.time(), 2, 1, "input-wait", "test"))
    job.master.step()
    assert data_started(job) == ["data-0", "data-1", "data-1"]  # back, under the same name


def test_a_data_worker_that_does_not_leave_is_stopped(make_job: Callable[..., Job]) -> None:
    job = make_job(data_workers=DataWorkersConfig(mode="auto", min=1, max=3, count=2))
    start_running(job)
    room = job.master.data_workers
    room.decide(DataWorkerDecision(time.time(), 1, 2, "queue-full", "test"))
    room.tick([], now=time.time())
    room.tick([], now=time.time() + DRAIN_TIMEOUT_S - 5)
    assert job.launcher.stopped == []
    room.tick([], now=time.time() + DRAIN_TIMEOUT_S + 1)
    assert job.launcher.stopped == ["data-1"]


def test_off_means_no_data_workers_and_no_section(make_job: Callable[..., Job]) -> None:
    job = make_job()
    start_running(job)
    assert data_started(job) == []
    assert "data_workers" not in job.status()
    assert job.lease("worker-0")["data_workers"] == []


def test_windows_are_read_between_heartbeats_and_drive_the_policy(
    make_job: Callable[..., Job],
) -> None:
    """Two trainers that waited half of their time: one data worker more. The rates come from
    the heartbeats' own times, so a tick that lands between beats changes nothing."""
    job = make_job(data_workers=DataWorkersConfig(mode="auto", min=0, max=2, interval_s=10))
    start_running(job)
    room = job.master.data_workers
    trainers = [job.master.nodes[f"worker-{i}"] for i in (0, 1)]

    def beat(at: float, samples: int, steps: int, waited: float) -> None:
        for node in trainers:
            node.samples, node.steps, node.input_wait_s, node.beat_at = samples, steps, waited, at

    t0 = 1000.0
    beat(t0, 0, 0, 0.0)
    room.tick(trainers, now=t0 + 0.5)
    beat(t0 + 4, 1024, 4, 2.0)
    room.tick(trainers, now=t0 + 11)  # long enough, but under MIN_STEPS steps each: no window
    assert room.decisions == []
    beat(t0 + 8, 2048, 8, 4.0)
    room.tick(trainers, now=t0 + 12)
    assert [(d.previous, d.count, d.rule) for d in room.decisions] == [(0, 1, "input-wait")]
    assert room.last is not None
    assert room.last.samples_per_s == 2 * 2048 / 8  # per trainer between its beats, summed
    assert room.last.input_wait == 0.5
    assert "waited 50%" in room.decisions[0].reason
    room.tick(trainers, now=t0 + 13)  # the room starts the new one at its next tick
    assert data_started(job) == ["data-0"]


def test_the_budget_s_room_stops_steps_up_and_shows(make_job: Callable[..., Job]) -> None:
    """The trigger's cap (``POST /data-workers/cap``): trainers that wait get no data worker
    beyond it; it removes none."""
    job = make_job(data_workers=DataWorkersConfig(mode="auto", min=0, max=3, interval_s=1))
    start_running(job)
    section = job.post("/data-workers/cap", {"cap": 0})
    assert section["budget_cap"] == 0
    room = job.master.data_workers
    trainer = job.master.nodes["worker-0"]
    for at, samples, waited in ((1000.0, 0, 0.0), (1010.0, 2560, 6.0)):
        trainer.samples, trainer.steps, trainer.input_wait_s, trainer.beat_at = (
            samples,
            samples // 64,
            waited,
            at,
        )
        room.tick([trainer], now=at + 0.5)
    assert room.last is not None and room.last.input_wait == 0.6
    assert room.decisions == [] and room.target == 0  # no room in the budget
    job.post("/data-workers/cap", {"cap": None})
    assert "budget_cap" not in job.status()["data_workers"]


def test_a_window_holds_every_trainer_or_is_not_taken(make_job: Callable[..., Job]) -> None:
    """A window opened before a trainer's first heartbeat would count the others alone: in
    bench/data_workers.py (2 trainers) the first window read 7,371 samples/s for 15,000."""
    job = make_job(data_workers=DataWorkersConfig(mode="auto", min=0, max=2, interval_s=1))
    start_running(job)
    room = job.master.data_workers
    trainers = [NodeInfo("worker-0", "worker"), NodeInfo("worker-1", "worker")]

    def beat(at: float, *samples: int) -> None:
        for node, count in zip(trainers, samples, strict=True):
            if count >= 0:
                node.samples, node.steps, node.beat_at = count, count // 100, at

    beat(100.0, 0, -1)  # worker-1 has not reported yet
    room.tick(trainers, now=100.0)
    beat(101.0, 1000, 0)
    room.tick(trainers, now=101.0)
    assert room.last is None  # worker-0 alone: not a window of the job
    beat(102.0, 2000, 1000)
    room.tick(trainers, now=102.0)
    assert room.last is not None and room.last.samples_per_s == 2000.0
