"""Straggler mitigation: a worker much slower than the fastest leases slices of shards in
proportion to its speed, and the rest of a sliced shard is next in line for anyone."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.shards import ShardQueue
from airflow_rover.core.spec import JobSpec, ResourcePlan, TrainingConfig
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.launchers.base import write_job
from airflow_rover.master.job import JobMaster
from airflow_rover.master.node_launcher import NodeLauncher
from airflow_rover.rpc import master_api

SHARD, BATCH = 1024, 64  # 16 batches per shard


class IdleLauncher(NodeLauncher):
    """Starts nothing: the test plays the nodes through the master's methods."""

    def start(self, node_id: str, role: str) -> None: ...

    def exit_codes(self) -> dict[str, int | None]:
        return {}

    def stop(self, node_id: str) -> None: ...

    def stop_all(self) -> None: ...


def test_a_slice_lease_returns_the_rest_of_the_shard_to_the_front() -> None:
    queue = ShardQueue(num_samples=3 * SHARD, shard_size=SHARD, batch_size=BATCH)
    piece = queue.lease("slow", 0.0, 60.0, max_batches=4)
    assert piece is not None and (piece.shard_id, piece.start, piece.end) == (0, 0, 4 * BATCH)
    assert queue.first_key(piece) == 0
    assert queue.complete(0, "slow")
    assert not queue.is_done(0)
    rest = queue.lease("fast", 0.0, 60.0)
    assert rest is not None and (rest.shard_id, rest.start, rest.end) == (0, 4 * BATCH, SHARD)
    assert queue.first_key(rest) == 4  # keys continue where the slice stopped
    assert queue.complete(0, "fast")
    assert queue.is_done(0) and queue.completions[0] == 1


def test_a_renewed_slice_lease_is_still_a_slice() -> None:
    """A heartbeat renews the lease; completing the slice must not complete the shard (the
    batches past the slice were never trained: 8 of them went missing under load)."""
    queue = ShardQueue(num_samples=3 * SHARD, shard_size=SHARD, batch_size=BATCH)
    queue.lease("slow", 0.0, 60.0, max_batches=4)
    assert queue.renew("slow", 30.0, 60.0) == 1
    assert queue.complete(0, "slow")
    assert not queue.is_done(0)
    rest = queue.lease("fast", 40.0, 60.0)
    assert rest is not None and (rest.shard_id, rest.start) == (0, 4 * BATCH)


def test_a_slice_larger_than_the_shard_is_the_whole_shard() -> None:
    queue = ShardQueue(num_samples=SHARD, shard_size=SHARD, batch_size=BATCH)
    whole = queue.lease("w", 0.0, 60.0, max_batches=100)
    assert whole is not None and whole.end == SHARD
    assert queue.complete(0, "w") and queue.finished


@pytest.fixture
def master(tmp_path: Path) -> JobMaster:
    data = generate_dataset(tmp_path / "data", SyntheticConfig(num_train=8 * SHARD, seed=0))
    spec = JobSpec(
        job_id="straggler",
        train_data=str(data.train_dir),
        plan=ResourcePlan(num_workers=2, num_ps=1),
        training=TrainingConfig(shard_size=SHARD, batch_size=BATCH),
    )
    layout = JobDir(tmp_path / "job")
    spec = write_job(layout, spec)
    m = JobMaster(layout, spec, IdleLauncher(), "token")
    m.step()  # starts ps-0
    m.node_ready("ps-0", master_api.NodeReady(address="127.0.0.1:1"))
    m.step()  # PS ready: workers start, training begins
    for worker in ("worker-0", "worker-1"):
        m.node_ready(worker, master_api.NodeReady())
    return m


def beat(master: JobMaster, worker: str, step_ms: float) -> None:
    master.heartbeat(worker, master_api.Heartbeat(steps=10, samples=640, step_time_ms=step_ms))


def test_the_slow_worker_leases_slices_in_proportion_to_its_speed(master: JobMaster) -> None:
    beat(master, "worker-0", 10.0)
    beat(master, "worker-1", 40.0)  # four times slower
    fast = master.lease("worker-0").shard
    slow = master.lease("worker-1").shard
    assert fast is not None and fast.end - fast.start == SHARD
    assert slow is not None and slow.end - slow.start == 4 * BATCH  # 16 batches / 4


def test_workers_of_similar_speed_lease_whole_shards(master: JobMaster) -> None:
    beat(master, "worker-0", 10.0)
    beat(master, "worker-1", 15.0)
    for worker in ("worker-0", "worker-1"):
        shard = master.lease(worker).shard
        assert shard is not None and shard.end - shard.start == SHARD
