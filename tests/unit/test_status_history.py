"""What the job's status keeps over time for a reader (the Airflow UI plugin): its throughput
since the master started, and its last committed checkpoints. The history itself is driven
with the time passed in; the master's part runs a real ``JobMaster`` (``master_rig``), with a
real parameter server where checkpoints are taken."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from master_rig import BATCH_SIZE, SHARD_SIZE, TOKEN, FakeLauncher, Job, start_running

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.master.checkpointer import CheckpointTimes
from airflow_rover.master.job import JobMaster
from airflow_rover.master.throughput_history import MAX_POINTS, ThroughputHistory
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc.ps_client import PSClient


# -- throughput ---------------------------------------------------------------------------------
def test_one_throughput_point_at_most_every_interval_rounded_to_a_tenth() -> None:
    history = ThroughputHistory(interval_s=2.0)
    added = [history.record(t, rate) for t, rate in [(0.0, 1.04), (1.0, 9.0), (2.0, 2.26)]]
    added += [history.record(3.9, 9.0), history.record(4.0, 3.0)]
    assert added == [True, False, True, False, True]
    assert history.to_json() == [
        {"at": 0.0, "samples_per_second": 1.0},
        {"at": 2.0, "samples_per_second": 2.3},
        {"at": 4.0, "samples_per_second": 3.0},
    ]
    json.dumps(history.to_json(), allow_nan=False)


def test_a_full_throughput_history_thins_its_older_half_and_keeps_the_whole_span() -> None:
    """At ``MAX_POINTS`` every other point of the older half goes: a long job keeps its start
    and its shape, the older part at a coarser step, the newest at the full one."""
    history = ThroughputHistory()
    for i in range(MAX_POINTS):
        history.record(2.0 * i, float(i))
    assert len(history) == MAX_POINTS
    history.record(2.0 * MAX_POINTS, 1.0)
    points = history.to_json()
    half = MAX_POINTS // 2
    assert len(points) == half // 2 + half + 1
    assert [p["at"] for p in points[: half // 2]] == [4.0 * i for i in range(half // 2)]
    assert [p["at"] for p in points[half // 2 :]] == [2.0 * i for i in range(half, MAX_POINTS + 1)]
    for i in range(MAX_POINTS + 1, 20 * MAX_POINTS):  # a job 20 times as long
        history.record(2.0 * i, 1.0)
        assert len(history) <= MAX_POINTS
    times = [p["at"] for p in history.to_json()]
    assert times[0] == 0.0 and times[-1] == 2.0 * (20 * MAX_POINTS - 1)
    assert times == sorted(times)
    steps = np.diff(times)
    print(f"after {20 * MAX_POINTS} ticks: {len(times)} points, steps {sorted(set(steps))} s")
    assert steps[-1] == 2.0 and steps[0] > steps[-1]


def test_bad_history_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="max_points=1: accepted: an integer >= 2"):
        ThroughputHistory(max_points=1)


def test_the_master_charts_its_throughput_while_training_only(make_job) -> None:
    """A point per supervisor tick (at most every 2 s) while the job trains, the window rate
    of that moment; none while pending or once stopped; ``state.json`` carries them."""
    job = make_job()
    job.master.step()
    assert job.status()["throughput_history"] == []  # pending: the PS are starting
    start_running(job)
    (first,) = job.status()["throughput_history"]
    assert first["samples_per_second"] == 0.0 and first["at"] <= time.time()
    job.master.step()
    assert len(job.status()["throughput_history"]) == 1  # under 2 s later: no new point
    job.master.throughput_history.interval_s = 0.0  # every tick from here
    for samples in (0, 4 * BATCH_SIZE):
        job.post("/nodes/worker-0/heartbeat", {"steps": 1, "samples": samples, "step_time_ms": 1})
    rate = job.master.throughput.rate()
    job.master.step()
    second = job.status()["throughput_history"][-1]
    assert second["samples_per_second"] == round(rate, 1) > 0
    assert second["at"] >= first["at"]
    job.post("/stop", {"reason": "enough"})
    job.master.step()
    history = job.status()["throughput_history"]
    assert len(history) == 2
    assert json.loads(job.layout.state_file.read_text())["throughput_history"] == history


# -- checkpoints -------------------------------------------------------------------------------
@pytest.fixture
def trained_job(make_job, tmp_path: Path) -> Iterator[tuple[Job, PSClient]]:
    """A running job whose ps-0 is a real parameter server; its checkpoints are copied to
    ``tmp_path / "store"``."""
    job = make_job(checkpoint_uri=(tmp_path / "store").as_uri())
    job.master.step()
    placement = EmbeddingPlacement.from_features(job.master.spec.resolved_features)
    ps = ParameterServer(0, 1, placement, Optimizer("adagrad", 0.05), 0)
    server, port = start_server(ps, TOKEN, threads=2)
    client = PSClient([f"127.0.0.1:{port}"], TOKEN)
    try:
        start_running(job, f"127.0.0.1:{port}")
        yield job, client
    finally:
        client.close()
        server.stop(None)


def train_shards(job: Job, client: PSClient, count: int) -> None:
    """Worker-0 trains ``count`` shards: one keyed push per batch, then reports them done."""
    group = EmbeddingPlacement.from_features(job.master.spec.resolved_features).groups[0]
    ids = {group.name: np.arange(10, dtype=np.int64)}
    grads = {group.name: np.full((10, group.dim), 0.01, np.float32)}
    for _ in range(count):
        shard = job.lease("worker-0")["shard"]
        for index, _start in enumerate(range(shard["start"], shard["end"], BATCH_SIZE)):
            client.push(ids, grads, {}, key=shard["first_key"] + index)
        assert job.done("worker-0", shard["shard_id"])


def test_the_status_lists_each_committed_checkpoint(trained_job, tmp_path: Path) -> None:
    """Each commit adds its number, time, samples done at the snapshot, size on disk and the
    URI of its durable copy; the list reaches ``state.json``, and a relaunched master starts
    from the checkpoints still in the job directory."""
    job, client = trained_job
    store = tmp_path / "store"
    taken = []
    for shards in (2, 3):
        train_shards(job, client, shards)
        before = time.time()
        directory = job.master.checkpoint()
        assert directory is not None
        taken.append((directory, before, time.time()))
    history = job.status()["recovery"]["checkpoint_history"]
    print(json.dumps(history, indent=1))
    assert [e["id"] for e in history] == [1, 2]
    assert [e["samples"] for e in history] == [2 * SHARD_SIZE, 5 * SHARD_SIZE]
    for entry, (directory, before, after) in zip(history, taken, strict=True):
        assert set(entry) == {"id", "at", "samples", "bytes", "uri"}
        assert before <= entry["at"] <= after
        files = [p for p in directory.rglob("*") if p.is_file()]
        assert entry["bytes"] == sum(p.stat().st_size for p in files) > 0
        assert entry["uri"] == (store / directory.name).as_uri()
    assert job.master.checkpointing.mirror is not None
    assert job.master.checkpointing.mirror.flush(30)
    assert (store / taken[-1][0].name / "queue.json").is_file()  # the URI names the copy
    job.master.mirror_state(force=True)
    mirrored = json.loads(job.layout.state_file.read_text())
    assert mirrored["recovery"]["checkpoint_history"] == history

    relaunched = JobMaster(job.layout, job.layout.read_spec(), FakeLauncher(), TOKEN)
    again = relaunched.status()["recovery"]["checkpoint_history"]
    assert [(e["id"], e["samples"], e["bytes"], e["uri"]) for e in again] == [
        (e["id"], e["samples"], e["bytes"], e["uri"]) for e in history
    ]


def test_without_a_checkpoint_uri_the_entry_names_the_local_directory(make_job) -> None:
    """And an entry whose ``queue.json`` cannot be read says so (no samples) without failing
    the commit."""
    job = make_job()
    start_running(job)
    directory = job.layout.checkpoint_dir(1)
    directory.mkdir(parents=True)
    (directory / "ps-0.npz").write_bytes(b"x" * 100)
    job.master.checkpointing.committed(directory, CheckpointTimes(0.001, 0.01, 100))
    (entry,) = job.status()["recovery"]["checkpoint_history"]
    assert entry["uri"] == str(directory) and entry["bytes"] == 100
    assert entry["id"] == 1 and entry["samples"] is None
