"""Fault tolerance end to end, in-process: a JobMaster with a recording launcher and real
parameter servers on gRPC. Workers are played by the test: it leases shards and pushes one keyed
gradient per batch, then "kills" nodes through the launcher's exit codes. What is checked is
exactly-once at batch granularity: where a requeued shard resumes (from the PS ledgers), that a
fully pushed shard is not retrained, that checkpoints resume a new master, and that a poison
shard is quarantined and reported instead of failing the job.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from master_rig import FakeLauncher

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.policies import CheckpointPolicyConfig
from airflow_rover.core.spec import JobSpec, RecoveryConfig, ResourcePlan, TrainingConfig
from airflow_rover.core.states import JobState
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.data.synthetic import GeneratedDataset, SyntheticConfig, generate_dataset
from airflow_rover.launchers.base import write_job
from airflow_rover.master.checkpointer import CheckpointTimes
from airflow_rover.master.job import JobMaster
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc import master_api
from airflow_rover.rpc.ps_client import PSClient

TOKEN = "recovery-token-0123456789"
NUM_TRAIN = 1000
SHARD_SIZE = 250
BATCH_SIZE = 64
NUM_SHARDS = NUM_TRAIN // SHARD_SIZE  # 4, one epoch
PER_SHARD = -(-SHARD_SIZE // BATCH_SIZE)  # 4 batches: 64, 64, 64, 58 samples
NUM_BATCHES = NUM_SHARDS * PER_SHARD


class Rig:
    """A JobMaster, its fake launcher, and real parameter servers the test starts for it."""

    def __init__(self, layout: JobDir, spec: JobSpec) -> None:
        self.layout = layout
        self.spec = spec
        self.launcher = FakeLauncher()
        self.master = JobMaster(layout, spec, self.launcher, TOKEN)
        self.embedding = EmbeddingPlacement.from_features(self.master.spec.resolved_features)
        self.ps: dict[int, ParameterServer] = {}
        self.servers: list[grpc.Server] = []

    # -- nodes -----------------------------------------------------------------------------
    def start_ps(self, index: int, restore_from: Path | None = None) -> None:
        """Serve ps-<index> (restored from a checkpoint, as a relaunched PS does) and report
        it ready to the master."""
        t = self.spec.training
        ps = ParameterServer(
            index,
            self.spec.plan.num_ps,
            self.embedding,
            Optimizer(t.optimizer, t.learning_rate),
            t.seed,
        )
        if restore_from is not None:
            with np.load(restore_from / f"ps-{index}.npz") as npz:
                ps.restore(dict(npz))
        server, port = start_server(ps, TOKEN, threads=2)
        self.servers.append(server)
        self.ps[index] = ps
        self.master.node_ready(f"ps-{index}", master_api.NodeReady(address=f"127.0.0.1:{port}"))

    def run(self) -> None:
        """Drive the master to RUNNING with every PS up."""
        self.master.step()
        for i in range(self.spec.plan.num_ps):
            self.start_ps(i)
        self.master.step()
        assert self.master.state == JobState.RUNNING, self.master.message

    def kill(self, node_id: str, code: int = 1) -> None:
        self.launcher.exit(node_id, code)
        self.master.step()

    # -- a worker's side ---------------------------------------------------------------------
    def lease(self, worker: str) -> master_api.ShardOut:
        reply = self.master.lease(worker)
        assert reply.status == "ok" and reply.shard is not None, reply
        return reply.shard

    def done(self, worker: str, shard_id: int) -> bool:
        return self.master.shard_done(shard_id, master_api.ShardDone(node_id=worker))

    def _request(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        group = self.embedding.groups[0]
        ids = {group.name: np.arange(8, dtype=np.int64)}
        return ids, {group.name: np.full((8, group.dim), 0.01, np.float32)}

    def push(self, shard: master_api.ShardOut, batches: int | None = None) -> None:
        """Push a keyed gradient for the first ``batches`` batches of a leased shard (all by
        default) to every PS, the way a worker's PSClient does."""
        starts = list(range(shard.start, shard.end, BATCH_SIZE))[:batches]
        client = PSClient(self.master.cluster().ps, TOKEN, timeout_s=10)
        try:
            ids, grads = self._request()
            for index, _ in enumerate(starts):
                client.push(ids, grads, {}, key=shard.first_key + index)
        finally:
            client.close()

    def checkpoint_between_shards(self) -> Path:
        """worker-0 trains shard 0, a checkpoint is taken, then it trains shard 1 (done after
        the checkpoint); returns the checkpoint."""
        checkpoint = None
        for sid in (0, 1):
            shard = self.lease("worker-0")
            self.push(shard)
            assert self.done("worker-0", sid)
            if sid == 0:
                checkpoint = self.master.checkpoint()
        assert checkpoint is not None
        return checkpoint

    def push_to(self, index: int, key: int) -> None:
        """A push that reached ps-<index> only (its worker died mid-way through the fan-out)."""
        ids, grads = self._request()
        (name,) = ids
        push = {"key": np.array([key]), f"ids/{name}": ids[name], f"grad/{name}": grads[name]}
        assert self.ps[index].push(push) == {}

    def finish(self, worker: str = "worker-1") -> dict:
        """Train every shard left (pushing each batch) and step until the job ends."""
        while (reply := self.master.lease(worker)).status == "ok":
            assert reply.shard is not None
            self.push(reply.shard)
            assert self.done(worker, reply.shard.shard_id)
        assert reply.status == "done", reply
        self.master.step()
        status = self.master.status()
        assert status["state"] == "succeeded", status["message"]
        return status

    def ledgers(self) -> list[set[int]]:
        return [set(self.ps[i].ledger.applied) for i in sorted(self.ps)]

    def close(self) -> None:
        for server in self.servers:
            server.stop(None)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> GeneratedDataset:
    root = tmp_path_factory.mktemp("data")
    return generate_dataset(root, SyntheticConfig(num_train=NUM_TRAIN, num_eval=200, seed=1))


@pytest.fixture
def job_spec(dataset: GeneratedDataset) -> Callable[..., JobSpec]:
    def make(num_ps: int = 1, lease_s: float = 60.0, **recovery: float) -> JobSpec:
        return JobSpec(
            job_id="recovery-job.1",
            train_data=str(dataset.train_dir),
            embedding_dim=4,
            plan=ResourcePlan(num_workers=2, num_ps=num_ps),
            training=TrainingConfig(
                shard_size=SHARD_SIZE,
                batch_size=BATCH_SIZE,
                optimizer="adagrad",
                shard_lease_s=lease_s,
            ),
            recovery=RecoveryConfig(**recovery),
        )

    return make


@pytest.fixture
def make_rig(job_spec: Callable[..., JobSpec], tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    rigs: list[Rig] = []

    def make(spec: JobSpec | None = None, **kw: float) -> Rig:
        spec = spec or job_spec(**kw)
        layout = JobDir(tmp_path / "job")
        spec = write_job(layout, spec)
        rig = Rig(layout, spec)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


def _as_tuple(shard: master_api.ShardOut) -> tuple[int, int, int, int]:
    return shard.shard_id, shard.start, shard.end, shard.first_key


# -- (a) a dead worker's shard resumes at its first batch not applied everywhere -------------
@pytest.mark.parametrize("pushed", [0, 1, 3])
def test_dead_workers_shard_resumes_at_the_first_unapplied_batch(
    make_rig: Callable[..., Rig], pushed: int
) -> None:
    """Batches 0..pushed-1 reached the PS before the worker died: the shard is leased again
    from batch ``pushed`` (its start sample and key), the worker relaunched."""
    rig = make_rig()
    rig.run()
    shard = rig.lease("worker-0")
    assert _as_tuple(shard) == (0, 0, SHARD_SIZE, 0)
    rig.push(shard, batches=pushed)
    rig.kill("worker-0")

    assert rig.launcher.started.count(("worker-0", "worker")) == 2
    assert rig.master.queue.failures[0] == 1
    again = rig.lease("worker-1")
    assert _as_tuple(again) == (0, pushed * BATCH_SIZE, SHARD_SIZE, pushed)
    assert rig.ledgers() == [set(range(pushed))]

    rig.push(again)
    assert rig.done("worker-1", 0)
    result = rig.finish()["result"]
    assert result["accounting"]["batches"] == {
        "expected": NUM_BATCHES,
        "trained_once": NUM_BATCHES,
        "never_trained": 0,
        "partially_trained": 0,
        "retried_pushes_turned_away": 0,
    }
    assert result["accounting"]["done_once"] == NUM_SHARDS
    assert result["accounting"]["requeued"] == 1
    assert result["samples_trained"] == NUM_TRAIN


def test_batch_applied_on_one_ps_only_is_retried_and_turned_away_there(
    make_rig: Callable[..., Rig],
) -> None:
    """With 2 PS a worker died mid-push of batch 2: ps-0 has it, ps-1 does not. The shard
    resumes at batch 2; the retried push is applied by ps-1 and turned away by ps-0."""
    rig = make_rig(num_ps=2)
    rig.run()
    shard = rig.lease("worker-0")
    rig.push(shard, batches=2)
    rig.push_to(0, shard.first_key + 2)
    rig.kill("worker-0")

    again = rig.lease("worker-1")
    assert _as_tuple(again) == (0, 2 * BATCH_SIZE, SHARD_SIZE, 2)
    rig.push(again)
    assert rig.ledgers() == [{0, 1, 2, 3}, {0, 1, 2, 3}]
    assert dict(rig.ps[0].ledger.rejected) == {2: 1}
    assert rig.ps[0].pushes == rig.ps[1].pushes == 4  # each batch applied once per PS
    assert rig.done("worker-1", 0)
    batches = rig.finish()["result"]["accounting"]["batches"]
    assert batches["trained_once"] == batches["expected"] == NUM_BATCHES
    assert batches["retried_pushes_turned_away"] == 1


# -- (b) every batch pushed, shard never reported: settled, not retrained ---------------------
def test_fully_pushed_shard_of_a_dead_worker_is_settled_not_leased_again(
    make_rig: Callable[..., Rig],
) -> None:
    """The worker died after its last push and before reporting: the shard is DONE (once) and
    the next lease is the next shard."""
    rig = make_rig()
    rig.run()
    shard = rig.lease("worker-0")
    rig.push(shard)
    rig.kill("worker-0")

    queue = rig.master.queue
    assert queue.is_done(0) and queue.completions[0] == 1
    assert queue.counts() == {"todo": NUM_SHARDS - 1, "doing": 0, "done": 1, "quarantined": 0}
    assert not rig.done("worker-0", 0)  # the dead worker's late report is void
    result = rig.finish()["result"]
    assert rig.launcher.started.count(("worker-1", "worker")) == 1
    assert result["accounting"]["done_once"] == NUM_SHARDS
    assert result["accounting"]["done_more_than_once"] == 0
    assert result["accounting"]["batches"]["trained_once"] == NUM_BATCHES
    assert result["samples_trained"] == NUM_TRAIN


def test_expired_lease_of_a_fully_pushed_shard_is_settled(make_rig: Callable[..., Rig]) -> None:
    """Same on a lease that expired (a hung worker): the supervisor settles it from the ledger."""
    rig = make_rig(lease_s=0.2)
    rig.run()
    shard = rig.lease("worker-0")
    rig.push(shard)
    time.sleep(0.3)
    rig.master.step()
    assert rig.master.queue.is_done(0)
    assert not rig.done("worker-0", 0)
    assert rig.lease("worker-1").shard_id == 1


def test_partial_saves_are_dropped_once_cpr_falls_back_to_full(
    make_rig: Callable[..., Rig], job_spec: Callable[..., JobSpec]
) -> None:
    """Under full recovery a restored PS's missing batches are trained again, so CPR's partial
    saves (rows past their checkpoint) must not be restored once CPR's benefit check has
    switched the job to full: the commit that switches deletes them."""
    cpr = CheckpointPolicyConfig.model_validate(
        {"policy": "cpr", "mtbf_s": 600.0, "cpr": {"variant": "mfu"}}
    )
    rig = make_rig(job_spec().model_copy(update={"checkpoint": cpr}))
    rig.run()
    first = rig.master.checkpoint()
    assert first is not None and rig.master.policy.name == "cpr"  # a save of ms against 600 s
    partial = rig.layout.partial_dir(1, 1)
    partial.mkdir(parents=True)
    (partial / "ps-0.npz").write_bytes(b"rows past ckpt-1")
    # A save of 5 min against a failure every 10: CPR's interval (2 min) costs 300%, full 150%.
    rig.master.checkpointing.committed(first, CheckpointTimes(300.0, 300.0, 1))
    assert rig.master.policy.name == "full"
    assert rig.layout.partial_dirs() == []


# -- (c) checkpoints: a new master resumes from the last one ----------------------------------
def test_checkpoint_writes_ps_partitions_queue_and_latest(make_rig: Callable[..., Rig]) -> None:
    """checkpoint() saves every PS partition, then queue.json, then names it in LATEST; only
    the last two checkpoints are kept."""
    rig = make_rig(num_ps=2)
    rig.run()
    shard = rig.lease("worker-0")
    rig.push(shard)
    assert rig.done("worker-0", shard.shard_id)

    first = rig.master.checkpoint()
    assert first == rig.layout.checkpoint_dir(1)
    assert sorted(p.name for p in first.iterdir()) == ["ps-0.npz", "ps-1.npz", "queue.json"]
    assert (rig.layout.checkpoints / "LATEST").read_text() == "ckpt-000001"
    assert rig.layout.latest_checkpoint() == first
    saved = json.loads((first / "queue.json").read_text())
    assert saved["done"] == [0]
    for i in range(2):
        with np.load(first / f"ps-{i}.npz") as npz:
            assert npz["ledger/applied"].tolist() == [0, 1, 2, 3]
            assert int(npz["num_ps"][0]) == 2
    assert rig.master.status()["recovery"]["checkpoints"] == 1

    rig.master.checkpoint()
    rig.master.checkpoint()
    assert sorted(p.name for p in rig.layout.checkpoints.iterdir()) == [
        "LATEST",
        "ckpt-000002",
        "ckpt-000003",
    ]


def test_failed_checkpoint_leaves_the_previous_one_standing(make_rig: Callable[..., Rig]) -> None:
    """A PS that cannot save (here: gone) makes checkpoint() return None; LATEST is unchanged."""
    rig = make_rig()
    rig.run()
    assert rig.master.checkpoint() is not None
    rig.close()  # the PS goes away
    assert rig.master.checkpoint() is None
    assert rig.layout.latest_checkpoint() == rig.layout.checkpoint_dir(1)
    assert rig.master.status()["recovery"]["checkpoints"] == 1


def test_new_master_resumes_its_queue_from_the_checkpoint(
    make_rig: Callable[..., Rig], job_spec: Callable[..., JobSpec]
) -> None:
    """Shard 0 done and shard 1 half pushed at the checkpoint, one more batch pushed after it.
    A new master on the same job dir (with a PS restored from the checkpoint) resumes shard 1
    at the first batch the checkpoint lacks, and the job ends with every batch once."""
    spec = job_spec()
    rig = make_rig(spec)
    rig.run()
    shard = rig.lease("worker-0")
    rig.push(shard)
    assert rig.done("worker-0", 0)
    holding = rig.lease("worker-0")
    rig.push(holding, batches=2)
    checkpoint = rig.master.checkpoint()
    assert checkpoint is not None
    rig.push_to(0, holding.first_key + 2)  # lost: after the checkpoint
    rig.close()  # the whole job goes down (master and PS)

    resumed = make_rig(spec)
    assert resumed.master.resumed_from == str(checkpoint)
    assert resumed.master.checkpoints == 1
    queue = resumed.master.queue
    assert queue.is_done(0) and queue.is_todo(1)  # the lease did not survive the master
    assert queue.to_dict()["todo"][0] == 1
    resumed.master.step()
    resumed.start_ps(0, restore_from=checkpoint)
    resumed.master.step()
    assert resumed.master.state == JobState.RUNNING
    assert resumed.ledgers() == [{0, 1, 2, 3, 4, 5}]
    assert resumed.master.samples_resumed == SHARD_SIZE + 2 * BATCH_SIZE

    again = resumed.lease("worker-0")
    assert _as_tuple(again) == (1, SHARD_SIZE + 2 * BATCH_SIZE, 2 * SHARD_SIZE, PER_SHARD + 2)
    resumed.push(again)
    assert resumed.done("worker-0", 1)
    status = resumed.finish()
    result = status["result"]
    assert result["samples_trained"] == NUM_TRAIN
    assert result["samples_resumed"] == SHARD_SIZE + 2 * BATCH_SIZE
    assert result["samples_trained_this_run"] == NUM_TRAIN - result["samples_resumed"]
    assert result["accounting"]["batches"]["trained_once"] == NUM_BATCHES
    assert result["accounting"]["batches"]["retried_pushes_turned_away"] == 0
    assert status["recovery"]["resumed_from"] == str(checkpoint)


def test_new_master_settles_a_shard_the_checkpoint_has_every_batch_of(
    make_rig: Callable[..., Rig], job_spec: Callable[..., JobSpec]
) -> None:
    """A shard leased at checkpoint time with all its batches in the checkpoint is DONE on
    resume, without a lease."""
    spec = job_spec()
    rig = make_rig(spec)
    rig.run()
    holding = rig.lease("worker-0")
    rig.push(holding)
    checkpoint = rig.master.checkpoint()
    rig.close()

    resumed = make_rig(spec)
    resumed.master.step()
    resumed.start_ps(0, restore_from=checkpoint)
    resumed.master.step()
    assert resumed.master.queue.is_done(0)
    assert resumed.lease("worker-0").shard_id == 1
    assert resumed.master.samples_resumed == SHARD_SIZE


# -- a dead PS: restored from the checkpoint, lost work retrained -----------------------------
def test_ps_restored_from_a_checkpoint_reopens_a_shard_it_lost(
    make_rig: Callable[..., Rig],
) -> None:
    """Shard 1 was done after the last checkpoint; the PS dies and comes back from the
    checkpoint without its batches: shard 1 is reopened and trained again, once."""
    rig = make_rig()
    rig.run()
    checkpoint = rig.checkpoint_between_shards()
    held = rig.lease("worker-1")

    rig.kill("ps-0", 137)
    assert rig.master.state == JobState.RECOVERING
    assert rig.launcher.stopped == []  # the workers wait for the PS
    assert rig.master.queue.is_todo(held.shard_id)
    assert rig.master.lease("worker-0").status == "wait"
    rig.start_ps(0, restore_from=checkpoint)
    rig.master.step()

    assert rig.master.state == JobState.RUNNING
    assert rig.master.ps_set.version == 1  # the waiting workers reconnect
    queue = rig.master.queue
    assert queue.is_todo(1) and not queue.is_done(1)
    again = rig.lease("worker-0")
    assert _as_tuple(again) == (1, SHARD_SIZE, 2 * SHARD_SIZE, PER_SHARD)
    rig.push(again)
    assert rig.done("worker-0", 1)
    status = rig.finish()
    accounting = status["result"]["accounting"]
    assert accounting["done_once"] == NUM_SHARDS
    assert accounting["batches"]["trained_once"] == NUM_BATCHES
    assert status["recovery"]["restarts"] == 1
    assert list(status["recovery"]["recovery_seconds"]) == ["ps"]


def test_cpr_lost_updates_stay_in_the_pls_of_a_job_resumed_from_a_checkpoint(
    make_rig: Callable[..., Rig], job_spec: Callable[..., JobSpec]
) -> None:
    """Under CPR a restored PS's missing batches are forgiven: recorded as applied, their
    updates lost. A checkpoint taken after that holds the loss in its rows and ledgers, so a
    new master resuming from it (a retry) still counts those samples in the job's PLS."""
    cpr = CheckpointPolicyConfig.model_validate({"policy": "cpr", "mtbf_s": 3600.0})
    spec = job_spec(num_ps=2).model_copy(update={"checkpoint": cpr})  # one PS: nothing to keep
    rig = make_rig(spec)
    rig.run()
    first = rig.checkpoint_between_shards()
    rig.kill("ps-0", 137)
    rig.start_ps(0, restore_from=first)
    rig.master.step()
    assert rig.master.state == JobState.RUNNING
    assert (rig.master.lost.batches, rig.master.lost.samples) == (PER_SHARD, SHARD_SIZE)
    pls = rig.master.pls
    assert pls > 0
    second = rig.master.checkpoint()  # shard 1 forgiven: done, its updates lost
    assert second is not None
    rig.close()

    resumed = make_rig(spec)
    assert resumed.master.resumed_from == str(second)
    assert (resumed.master.lost.batches, resumed.master.lost.samples) == (PER_SHARD, SHARD_SIZE)
    resumed.master.step()
    for index in (0, 1):
        resumed.start_ps(index, restore_from=second)
    resumed.master.step()
    assert resumed.master.state == JobState.RUNNING
    status = resumed.finish()
    assert status["recovery"]["lost_samples"] == SHARD_SIZE
    assert status["recovery"]["pls"] == pytest.approx(pls)


def test_ps_that_keeps_dying_fails_the_job_naming_the_budget(
    make_rig: Callable[..., Rig],
) -> None:
    """Past recovery.max_node_restarts a dead PS fails the job (and says which setting)."""
    rig = make_rig(max_node_restarts=1)
    rig.run()
    rig.kill("ps-0", 137)
    assert rig.master.state == JobState.RECOVERING
    rig.kill("ps-0", 137)
    status = rig.master.status()
    assert status["state"] == "failed"
    assert "ps-0 exited with code 137" in status["message"]
    assert "no restarts left (1 used, recovery.max_node_restarts=1)" in status["message"]


# -- (d) poison shards are quarantined, the job still finishes --------------------------------
def test_shard_that_kills_its_worker_is_quarantined_and_the_job_finishes(
    make_rig: Callable[..., Rig],
) -> None:
    """Shard 0 kills every worker that takes it: after max_shard_failures deaths it is
    quarantined (reported by id and sample range), the rest trains and the job succeeds."""
    rig = make_rig(max_shard_failures=3)
    rig.run()
    for attempt in range(3):
        shard = rig.lease("worker-0")
        assert shard.shard_id == 0
        if attempt == 0:
            rig.push(shard, batches=1)  # some progress before the first death
        assert shard.start == (0 if attempt == 0 else BATCH_SIZE)
        rig.kill("worker-0")
    queue = rig.master.queue
    assert queue.quarantined == {0}
    assert queue.counts() == {"todo": NUM_SHARDS - 1, "doing": 0, "done": 0, "quarantined": 1}
    assert rig.launcher.started.count(("worker-0", "worker")) == 4  # relaunched each time

    status = rig.finish()
    report = {"shard_id": 0, "epoch": 0, "start": 0, "end": SHARD_SIZE, "failures": 3}
    assert status["message"] == (
        f"trained {NUM_TRAIN - SHARD_SIZE} samples; 1 shard(s) quarantined after repeated "
        f"worker deaths and not trained: [(0, 0, {SHARD_SIZE})]"
    )
    result = status["result"]
    assert result["accounting"]["quarantined"] == [report]
    assert status["recovery"]["quarantined"] == [report]
    assert status["progress"]["shards"]["quarantined"] == 1
    assert result["accounting"]["never_done"] == 1
    assert result["accounting"]["batches"] == {
        "expected": NUM_BATCHES - PER_SHARD,  # the quarantined shard's batches are not expected
        "trained_once": NUM_BATCHES - PER_SHARD,
        "never_trained": 0,
        "partially_trained": 0,
        "retried_pushes_turned_away": 0,
    }
    assert status["recovery"]["restarts"] == 3


def test_ps_lost_exits_do_not_quarantine_a_shard(make_rig: Callable[..., Rig]) -> None:
    """A worker that exits with EXIT_PS_LOST is not the shard's fault, however often."""
    rig = make_rig(max_shard_failures=1, max_node_restarts=0)
    rig.run()
    for _ in range(3):
        assert rig.lease("worker-0").shard_id == 0
        rig.kill("worker-0", master_api.EXIT_PS_LOST)
    assert rig.master.queue.quarantined == set()
    assert rig.master.state == JobState.RUNNING
    assert rig.finish()["result"]["accounting"]["quarantined"] == []


def test_resume_with_an_unreachable_ps_does_not_crash_the_supervisor(
    make_rig: Callable[..., Rig], job_spec: Callable[..., JobSpec]
) -> None:
    """If the ledgers cannot be read on resume, the master waits for them (no worker trains on a
    queue the PS may contradict) and its supervisor keeps going."""
    spec = job_spec()
    rig = make_rig(spec)
    rig.run()
    assert rig.master.checkpoint() is not None
    rig.close()

    resumed = make_rig(spec)
    resumed.master.step()
    resumed.master.node_ready("ps-0", master_api.NodeReady(address="127.0.0.1:1"))
    resumed.master.step()
    assert resumed.master.state == JobState.PENDING
    resumed.master.step()
    assert resumed.master.state == JobState.PENDING


def test_a_job_left_with_no_trainable_shard_fails_instead_of_scoring_nothing(
    make_rig: Callable[..., Rig],
) -> None:
    """Every shard kills its worker (killed: no crash record to compare) until every one is
    quarantined: the job fails, not retried, naming the shards and how their workers died,
    instead of saving and scoring a model trained on 0 samples."""
    rig = make_rig(max_shard_failures=1, max_node_restarts=100)
    rig.run()
    for shard_id in range(NUM_SHARDS):
        assert rig.lease("worker-0").shard_id == shard_id
        rig.kill("worker-0", -9)
    rig.master.step()
    status = rig.master.status()
    assert status["state"] == "failed", status["message"]
    assert status["message"].startswith(
        f"no trainable shard left, not retried: all {NUM_SHARDS} shard(s) not trained are "
        "quarantined after repeated worker deaths and no sample was trained: 0 (samples 0-250), "
    )
    assert "Their workers died of: worker-0 exited with code -9 (4 shard(s))" in status["message"]
    failure = status["failure"]
    assert (failure["kind"], failure["retryable"]) == ("no_trainable_shard", False)
    assert [q["shard_id"] for q in failure["quarantined"]] == list(range(NUM_SHARDS))
    assert ("evaluator", "evaluator") not in rig.launcher.started


# -- (e) the held-out split is scored by a worker, or by a node of its own ---------------------
def _trained_with_eval(
    make_rig: Callable[..., Rig], job_spec: Callable[..., JobSpec], dataset: GeneratedDataset
) -> Rig:
    """A job with a held-out split whose every shard worker-1 trained: evaluating."""
    rig = make_rig(job_spec().model_copy(update={"eval_data": str(dataset.eval_dir)}))
    rig.run()
    while (reply := rig.master.lease("worker-1")).status == "ok":
        assert reply.shard is not None
        rig.push(reply.shard)
        assert rig.done("worker-1", reply.shard.shard_id)
    assert reply.status == "wait"  # done training, it may score the held-out split
    rig.master.step()
    assert rig.master.state == JobState.EVALUATING
    return rig


def _scored_by(rig: Rig, node_id: str) -> dict:
    report = master_api.EvalReport(node_id=node_id, auc=0.7, logloss=0.5, samples=200)
    rig.master.report_evaluation(report)
    rig.kill(node_id, 0)
    status = rig.master.status()
    assert status["state"] == "succeeded", status["message"]
    assert status["result"]["auc"] == 0.7
    return status


def test_the_first_worker_to_ask_scores_the_held_out_split_and_no_node_starts(
    make_rig: Callable[..., Rig], job_spec: Callable[..., JobSpec], dataset: GeneratedDataset
) -> None:
    rig = _trained_with_eval(make_rig, job_spec, dataset)
    assert rig.master.claim_evaluation("worker-1") and not rig.master.claim_evaluation("worker-0")
    with pytest.raises(PermissionError, match="worker-1 scores the held-out split"):
        rig.master.report_evaluation(
            master_api.EvalReport(node_id="worker-0", auc=0.7, logloss=0.5, samples=200)
        )
    rig.kill("worker-0", 0)  # told it is not the one: it exits
    _scored_by(rig, "worker-1")
    assert ("evaluator", "evaluator") not in rig.launcher.started


def test_a_worker_that_dies_scoring_is_replaced_by_an_evaluator_node(
    make_rig: Callable[..., Rig], job_spec: Callable[..., JobSpec], dataset: GeneratedDataset
) -> None:
    rig = _trained_with_eval(make_rig, job_spec, dataset)
    assert rig.master.claim_evaluation("worker-0")
    rig.kill("worker-0", -9)
    assert rig.launcher.started[-1] == ("evaluator", "evaluator")
    assert not rig.master.claim_evaluation("worker-1")  # the node scores it now
    _scored_by(rig, "evaluator")


def test_with_no_worker_left_to_ask_an_evaluator_node_scores(
    make_rig: Callable[..., Rig], job_spec: Callable[..., JobSpec], dataset: GeneratedDataset
) -> None:
    rig = _trained_with_eval(make_rig, job_spec, dataset)
    rig.launcher.exit("worker-0", 0)
    assert ("evaluator", "evaluator") not in rig.launcher.started  # worker-1 may still ask
    rig.kill("worker-1", 0)
    assert rig.launcher.started[-1] == ("evaluator", "evaluator")
    _scored_by(rig, "evaluator")


def test_a_ps_lost_while_a_worker_scores_stops_it_and_sends_training_back(
    make_rig: Callable[..., Rig], job_spec: Callable[..., JobSpec], dataset: GeneratedDataset
) -> None:
    """The worker scoring is stopped; with the PS back from the final checkpoint the workers
    start again, training is over at once, and the first to ask scores again."""
    rig = _trained_with_eval(make_rig, job_spec, dataset)
    assert rig.master.claim_evaluation("worker-1")
    rig.kill("ps-0", 137)
    assert rig.master.state == JobState.RECOVERING
    assert "worker-1" in rig.launcher.stopped
    rig.kill("worker-1", -15)  # it ends of the stop: not a failure
    checkpoint = rig.layout.latest_checkpoint()  # the one taken when training was over
    assert checkpoint is not None
    rig.start_ps(0, restore_from=checkpoint)
    rig.master.step()
    assert rig.launcher.started.count(("worker-1", "worker")) == 2
    rig.master.step()
    assert rig.master.state == JobState.EVALUATING
    assert rig.master.claim_evaluation("worker-0")
    _scored_by(rig, "worker-0")
