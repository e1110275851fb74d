"""Flash checkpoints with real processes: a PS SIGKILLed while it persists its part, and a
corrupted part found at a restart.

The job master runs in the test process (its real API on a local port, so the PS processes
register as they do in a job) with the real local launcher for its parameter servers
(``python -m airflow_rover.ps``); no workers are started: the test pushes keyed batches itself.

- A PS killed while writing its part of ``ckpt-2`` leaves ``ckpt-1`` the latest. Relaunched by
  the same master, it restores the ``ckpt-2`` snapshot from shared memory and writes the part,
  and the master commits ``ckpt-2``; relaunched for another master, it restores ``ckpt-1`` from
  disk and the master gives ``ckpt-2`` up.
- A byte flipped in ``ckpt-2/ps-1.npz``: a new master resumes from ``ckpt-1`` and both PS
  restore ``ckpt-1``, each logging why ``ckpt-2`` was skipped.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import uvicorn

from airflow_rover.core.checkpoint_files import verify_checkpoint
from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.job_dir import JobDir, atomic_write_json
from airflow_rover.core.spec import FeatureConfig, JobSpec, TableConfig
from airflow_rover.core.states import JobState
from airflow_rover.data.synthetic import GeneratedDataset, SyntheticConfig, generate_dataset
from airflow_rover.launchers.local import LocalNodeLauncher
from airflow_rover.master.app import create_app
from airflow_rover.master.job import JobMaster
from airflow_rover.master.node_launcher import Role
from airflow_rover.rpc.ps_client import PSClient

pytestmark = [pytest.mark.slow]

TABLE = "big"
DIM = 16
KEY_BASE = 10**9


class PSOnlyLauncher(LocalNodeLauncher):
    """The real launcher for the PS; workers and the evaluator are the test's part."""

    def start(self, node_id: str, role: Role) -> None:
        if role == "ps":
            super().start(node_id, role)


class Job:
    """A JobMaster serving its API in a thread, with real PS processes."""

    def __init__(self, layout: JobDir, spec: JobSpec, master_pid: int) -> None:
        self.layout = layout
        self.spec = spec
        self.token = layout.ensure_token()
        assert spec.features is not None
        (self.group,) = (g.name for g in EmbeddingPlacement.from_features(spec.features).groups)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        address = f"http://127.0.0.1:{sock.getsockname()[1]}"
        # What the master process announces; a relaunched PS compares the master's pid with
        # the one its snapshot was taken for.
        atomic_write_json(layout.master_file, {"address": address, "pid": master_pid})
        self.launcher = PSOnlyLauncher(layout, address)
        self.master = JobMaster(layout, spec, self.launcher, self.token)
        config = uvicorn.Config(
            create_app(self.master, self.token), log_level="warning", access_log=False
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]})
        self.thread.start()

    def step_until(self, done: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not after {timeout_s} s; {self.master.message}")
            self.master.step()
            time.sleep(0.05)

    def running(self) -> None:
        self.step_until(lambda: self.master.state == JobState.RUNNING, "all PS up")

    def push(self, key: int, ids: np.ndarray) -> None:
        """A keyed push of batch ``key`` (offset past the job's own batch keys, so no shard
        of the queue ever looks trained)."""
        client = PSClient(self.master.cluster().ps, self.token, timeout_s=120)
        try:
            grads = np.full((ids.size, DIM), 0.01 * (key + 1), dtype=np.float32)
            client.push({self.group: ids}, {self.group: grads}, {}, key=KEY_BASE + key)
        finally:
            client.close()

    def rows(self, ids: np.ndarray, training: bool = False) -> np.ndarray:
        """The rows of ``ids``: read as a worker does (counted as accesses) when ``training``,
        else as an evaluation reads them."""
        client = PSClient(self.master.cluster().ps, self.token, timeout_s=60)
        try:
            return client.pull({self.group: ids}, dense=False, create=training)[0][self.group]
        finally:
            client.close()

    def ledgers(self) -> list[set[int]]:
        client = PSClient(self.master.cluster().ps, self.token, timeout_s=60)
        try:
            return [{k - KEY_BASE for k in applied} for applied, _ in client.ledgers()]
        finally:
            client.close()

    def log(self, node_id: str) -> str:
        return self.layout.log_file(node_id).read_text(errors="replace")

    def close(self) -> None:
        self.master.shutdown_nodes()
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> GeneratedDataset:
    root = tmp_path_factory.mktemp("data")
    return generate_dataset(root, SyntheticConfig(num_train=2000, num_eval=200, seed=3))


@pytest.fixture
def make_job(tmp_path: Path, dataset: GeneratedDataset) -> Iterator[Callable[..., Job]]:
    jobs: list[Job] = []
    layout = JobDir(tmp_path / "job")

    def make(vocab: int, master_pid: int | None = None, **spec_extra: object) -> Job:
        spec = JobSpec(
            job_id="flash-integrity.1",
            train_data=str(dataset.train_dir),
            features=FeatureConfig(
                num_dense=1,
                tables=(TableConfig(name=TABLE, column="C1", vocab_size=vocab, dim=DIM),),
            ),
            plan={"num_ps": 2, "num_workers": 1},
            training={"optimizer": "adagrad", "learning_rate": 0.1},
            recovery={"checkpoint_interval_s": 0.3},
            **spec_extra,  # type: ignore[arg-type]
        )
        layout.write_spec(spec)
        job = Job(layout, spec, os.getpid() if master_pid is None else master_pid)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.close()
    shutil.rmtree(layout.flash_dir, ignore_errors=True)


ROWS = 4_000_000  # 2 M rows x dim 16 (+ Adagrad state) per PS: ~0.3 GB parts, ~0.5 s to persist


@pytest.mark.parametrize("same_master", [True, False], ids=["same master", "another master"])
def test_a_ps_killed_while_persisting_leaves_the_previous_checkpoint_latest(
    make_job: Callable[..., Job], same_master: bool
) -> None:
    job = make_job(ROWS, master_pid=None if same_master else 1)
    job.running()
    for key in range(4):
        job.push(key, np.arange(key * ROWS // 4, (key + 1) * ROWS // 4, dtype=np.int64))
    first = job.master.checkpoint()
    assert first == job.layout.checkpoint_dir(1)
    job.push(4, np.arange(0, 1000, dtype=np.int64))  # after ckpt-1, in ckpt-2's snapshot

    # ckpt-2: the next supervisor tick takes the snapshot; its parts are written in background
    time.sleep(job.spec.recovery.checkpoint_interval_s)
    job.master.step()
    second = job.layout.checkpoint_dir(2)
    writing = second / ".ps-0.npz.tmp"
    deadline = time.monotonic() + 30
    while not writing.exists():
        assert time.monotonic() < deadline, "ps-0 never started writing its part"
        time.sleep(0.001)
    pid = job.launcher.pid("ps-0")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # mid-write
    while job.launcher.exit_codes()["ps-0"] is None:
        time.sleep(0.01)

    assert not (second / "ps-0.npz").exists()
    assert writing.exists()  # a half-written part, never named as one
    job.master.step()  # the master polls ckpt-2's parts: not all persisted, nothing committed
    assert (job.layout.checkpoints / "LATEST").read_text() == "ckpt-000001"
    assert job.layout.latest_checkpoint() == first
    assert job.master.checkpoints == 1
    assert job.master.state == JobState.RECOVERING  # and it relaunched ps-0

    job.running()  # ps-0 relaunched and restored
    job.step_until(lambda: job.master.checkpointer.pending is None, "ckpt-2 settled")
    ledgers = job.ledgers()
    if same_master:
        assert "shared memory holds a newer snapshot (ckpt-000002, not persisted yet)" in job.log(
            "ps-0"
        )
        assert (job.layout.checkpoints / "LATEST").read_text() == "ckpt-000002"
        assert job.layout.latest_checkpoint() == second
        assert verify_checkpoint(second) is None
        assert ledgers[0] == {0, 1, 2, 3, 4}  # the relaunched PS lost nothing of the snapshot
        with np.load(second / "ps-0.npz") as npz:
            assert (npz["ledger/applied"] - KEY_BASE).tolist() == [0, 1, 2, 3, 4]
    else:
        assert f"restored {first / 'ps-0.npz'}" in job.log("ps-0")
        assert (job.layout.checkpoints / "LATEST").read_text() == "ckpt-000001"
        assert job.layout.latest_checkpoint() == first
        assert ledgers[0] == {0, 1, 2, 3}  # back to ckpt-1: batch 4 is retrained on ps-0 only
    assert ledgers[1] == {0, 1, 2, 3, 4}  # ps-1 never stopped


def test_a_corrupted_part_is_skipped_by_the_new_master_and_every_ps(
    make_job: Callable[..., Job], caplog: pytest.LogCaptureFixture
) -> None:
    job = make_job(20_000)
    job.running()
    job.push(0, np.arange(0, 20_000, dtype=np.int64))
    first = job.master.checkpoint()
    job.push(1, np.arange(0, 500, dtype=np.int64))
    second = job.master.checkpoint()
    assert first is not None and second is not None
    job.close()  # the whole job stops (the PS give their shared memory back)

    data = bytearray((second / "ps-1.npz").read_bytes())
    data[len(data) // 2] ^= 0x10
    (second / "ps-1.npz").write_bytes(bytes(data))

    again = make_job(20_000)  # a new master on the same job directory, as after a retry
    assert again.master.resumed_from == str(first)
    again.running()
    assert again.ledgers() == [{0}, {0}]
    for node in ("ps-0", "ps-1"):
        log = again.log(node)
        assert "checkpoint ckpt-000002 skipped: ps-1.npz: checksum mismatch" in log, log
        assert f"restored {first / node}.npz" in log, log


def test_a_new_master_under_cpr_restores_the_checkpoint_not_the_partial_saves_after_it(
    make_job: Callable[..., Job],
) -> None:
    """CPR-MFU's partial saves hold rows newer than their checkpoint, for a lost PS to take
    over while the others keep their progress. A new master (a retry) resumes the whole job
    from the checkpoint and trains every batch after it again: the partial saves of the old
    attempt must not be restored, or their rows would get those batches twice."""
    cpr = {"checkpoint": {"policy": "cpr", "mtbf_s": 3600, "cpr": {"variant": "mfu"}}}
    job = make_job(20_000, **cpr)
    job.running()
    hot = np.arange(0, 500, dtype=np.int64)
    job.push(0, np.arange(0, 20_000, dtype=np.int64))
    first = job.master.checkpoint()
    assert first is not None
    at_checkpoint = job.rows(hot)
    job.push(1, hot)  # after the checkpoint: the batch a resumed job trains again
    after = job.rows(hot, training=True)  # the most used rows, for MFU
    assert not np.array_equal(after, at_checkpoint)
    partial = job.layout.partial_dir(1, 1)
    client = PSClient(job.master.cluster().ps, job.token, timeout_s=60)
    try:
        assert client.partial_save(partial, "mfu", 0.1) > 0
    finally:
        client.close()
    job.close()

    again = make_job(20_000, **cpr)
    assert again.master.resumed_from == str(first)
    again.running()
    assert again.ledgers() == [{0}, {0}]  # batch 1 is trained again...
    np.testing.assert_array_equal(again.rows(hot), at_checkpoint)  # ...on the checkpoint's rows
    assert again.layout.partial_dirs(1) == []  # the old attempt's saves: gone, not restored
