"""Flash checkpoints: a snapshot into shared memory, persisted in the background, committed only
once every part is durable, checksummed, and skipped with a logged reason when a part does not
verify. In-process (real gRPC parameter servers, a JobMaster with a recording launcher); the
same with real processes and SIGKILL is ``tests/integration/test_checkpoint_integrity.py``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from airflow_rover.core.checkpoint_files import (
    CorruptCheckpoint,
    PartDigest,
    checkpoint_record,
    read_digest,
    verify_checkpoint,
    write_npz,
)
from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.job_dir import ENV_FLASH_DIR, JobDir, atomic_write_json
from airflow_rover.core.spec import (
    FeatureConfig,
    JobSpec,
    RecoveryConfig,
    ResourcePlan,
    TableConfig,
    TrainingConfig,
)
from airflow_rover.core.states import JobState
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.data.synthetic import GeneratedDataset, SyntheticConfig, generate_dataset
from airflow_rover.launchers.base import write_job
from airflow_rover.master.job import JobMaster
from airflow_rover.master.node_launcher import NodeLauncher
from airflow_rover.ps import flash as flash_module
from airflow_rover.ps.__main__ import restore
from airflow_rover.ps.flash import FlashCheckpointer, ShmSlot, choose_restore
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc import master_api
from airflow_rover.rpc.ps_client import PSClient

TOKEN = "flash-token-0123456789"
ADAGRAD = Optimizer("adagrad", 0.1)
SEED = 5


def _path(value: Path) -> np.ndarray:
    return np.frombuffer(str(value).encode(), dtype=np.uint8)


def _flash_req(target: Path, owner: int = 0) -> dict[str, np.ndarray]:
    return {
        "path": _path(target),
        "mode": np.frombuffer(b"flash", dtype=np.uint8),
        "owner": np.array([owner], dtype=np.int64),
    }


def _status(ps: ParameterServer, target: Path) -> int:
    req = {"path": _path(target), "mode": np.frombuffer(b"status", dtype=np.uint8)}
    return int(ps.save(req)["state"][0])


def _wait_persisted(ps: ParameterServer, target: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _status(ps, target) == 1:
        assert time.monotonic() < deadline, "the persist did not end"
        time.sleep(0.01)
    assert _status(ps, target) == 2


@pytest.fixture(autouse=True)
def flash_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Slots under the test's own folder (the default is /dev/shm)."""
    path = tmp_path / "shm"
    monkeypatch.setenv(ENV_FLASH_DIR, str(path))
    return path


class Gate:
    """Holds every background persist until ``open()``: a slow disk, on demand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.event = threading.Event()
        self.fail: str | None = None
        real = flash_module.write_npz

        def gated(path: Path, arrays: Iterable[tuple[str, np.ndarray]]) -> PartDigest:
            assert self.event.wait(30), "the test never opened the gate"
            if self.fail:
                raise OSError(self.fail)
            return real(path, arrays)

        monkeypatch.setattr(flash_module, "write_npz", gated)

    def open(self) -> None:
        self.event.set()


# -- checksummed files --------------------------------------------------------------------------
ARRAYS = {
    "table/t/ids": np.arange(7, dtype=np.int64),
    "table/t/rows": np.random.default_rng(0).normal(size=(7, 16)).astype(np.float32),
    "dense_version": np.array([3], dtype=np.int64),
    "scalar": np.array(2.5, dtype=np.float32),
    "empty": np.empty((0, 4), dtype=np.float32),
}


def test_a_part_is_a_plain_npz_carrying_its_own_sha256(tmp_path: Path) -> None:
    digest = write_npz(tmp_path / "ps-0.npz", ARRAYS.items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ps-0.npz"]  # no temporary left
    assert read_digest(tmp_path / "ps-0.npz") == digest
    assert digest.bytes == (tmp_path / "ps-0.npz").stat().st_size
    with np.load(tmp_path / "ps-0.npz") as npz:
        assert sorted(npz.files) == sorted(ARRAYS)
        for name, value in ARRAYS.items():
            assert npz[name].dtype == value.dtype and npz[name].shape == value.shape
            np.testing.assert_array_equal(npz[name], value)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda b: b.__setitem__(len(b) // 2, b[len(b) // 2] ^ 0x01), "checksum mismatch"),
        (lambda b: b.__setitem__(0, b[0] ^ 0x80), "checksum mismatch"),
        (lambda b: b.__delitem__(slice(len(b) - 10, len(b))), "no checksum"),
        (lambda b: b.__delitem__(slice(40, len(b))), "truncated"),
    ],
    ids=["a flipped bit mid-file", "a flipped first byte", "cut short", "a stub"],
)
def test_any_damage_to_a_part_is_detected(
    tmp_path: Path, damage: Callable[[bytearray], None], reason: str
) -> None:
    path = tmp_path / "ps-0.npz"
    write_npz(path, ARRAYS.items())
    data = bytearray(path.read_bytes())
    damage(data)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match=reason):
        read_digest(path)


def _commit(layout: JobDir, number: int, queue: dict[str, Any], num_ps: int = 2) -> Path:
    """A committed checkpoint as the master writes one (parts, queue.json, LATEST)."""
    directory = layout.checkpoint_dir(number)
    parts = {}
    for i in range(num_ps):
        arrays = {"ledger/applied": np.arange(number * 10, dtype=np.int64), "n": np.array([i])}
        parts[f"ps-{i}.npz"] = write_npz(directory / f"ps-{i}.npz", arrays.items())
    atomic_write_json(directory / "queue.json", checkpoint_record(queue, parts))
    layout.commit_checkpoint(directory)
    return directory


def _flip_byte(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        (lambda d: _flip_byte(d / "ps-1.npz"), "ps-1.npz: checksum mismatch"),
        (lambda d: (d / "ps-0.npz").unlink(), "ps-0.npz: missing"),
        (lambda d: (d / "queue.json").unlink(), "queue.json missing (never committed)"),
        (
            lambda d: (d / "queue.json").write_text(
                (d / "queue.json").read_text().replace('"done": [\n    4', '"done": [\n    5')
            ),
            "queue.json: checksum mismatch",
        ),
        (lambda d: _flip_byte(d / "queue.json", 0), "queue.json unreadable"),
        (
            lambda d: write_npz(d / "ps-0.npz", [("other", np.zeros(3))]),
            "the manifest says",
        ),
    ],
    ids=[
        "corrupt part",
        "missing part",
        "never committed",
        "queue edited",
        "queue garbled",
        "swap",
    ],
)
def test_latest_checkpoint_skips_one_that_does_not_verify_and_says_why(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    spoil: Callable[[Path], None],
    reason: str,
) -> None:
    layout = JobDir(tmp_path / "job")
    first = _commit(layout, 1, {"done": [1, 2]})
    second = _commit(layout, 2, {"done": [4]})
    assert layout.latest_checkpoint() == second
    spoil(second)
    with caplog.at_level(logging.WARNING, logger="airflow_rover.core.job_dir"):
        assert layout.latest_checkpoint() == first
    assert (layout.checkpoints / "LATEST").read_text() == "ckpt-000002"
    assert verify_checkpoint(second) is not None
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("checkpoint ckpt-000002 skipped: ") for m in messages), messages
    assert any(reason in m for m in messages), messages
    assert any("resuming from ckpt-000001 instead of ckpt-000002" in m for m in messages)


def test_no_verified_checkpoint_means_a_fresh_start(tmp_path: Path) -> None:
    layout = JobDir(tmp_path / "job")
    assert layout.latest_checkpoint() is None
    only = _commit(layout, 1, {"done": []})
    _flip_byte(only / "ps-0.npz")
    assert layout.latest_checkpoint() is None


def test_a_checkpoint_newer_than_latest_is_not_used(tmp_path: Path) -> None:
    """Only LATEST and older are candidates: a newer directory was never committed."""
    layout = JobDir(tmp_path / "job")
    first = _commit(layout, 1, {"done": []})
    _commit(layout, 2, {"done": []})
    (layout.checkpoints / "LATEST").write_text("ckpt-000001")
    assert layout.latest_checkpoint() == first


# -- the PS: flash save, background persist ------------------------------------------------------
FEATURES = FeatureConfig(
    num_dense=1, tables=(TableConfig(name="a", column="C1", vocab_size=5000, dim=8),)
)
LAYOUT = EmbeddingPlacement.from_features(FEATURES)
GROUP = LAYOUT.groups[0].name


def _push(ps: ParameterServer, key: int, ids: np.ndarray) -> None:
    grads = np.full((ids.size, 8), 0.01 * (key + 1), dtype=np.float32)
    push = {"key": np.array([key]), f"ids/{GROUP}": ids, f"grad/{GROUP}": grads}
    assert ps.push(push) == {}


def _trained(index: int = 0, num_ps: int = 1, keys: int = 3) -> ParameterServer:
    ps = ParameterServer(index, num_ps, LAYOUT, ADAGRAD, SEED)
    ps.init_dense({"dense/w": np.ones((3, 2), np.float32)})
    for key in range(keys):
        _push(ps, key, np.arange(key * 100, key * 100 + 300, dtype=np.int64))
    ps.push(
        {
            "key": np.array([1]),
            f"ids/{GROUP}": np.array([1]),
            f"grad/{GROUP}": np.ones((1, 8), np.float32),
        }
    )  # a retry
    return ps


def _assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_flash_save_replies_before_the_part_is_durable_and_keeps_that_point_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Save RPC returns once the state is in shared memory; pushes go on while the part
    is written; the part holds the state (and ledger) of the snapshot, not later pushes."""
    gate = Gate(monkeypatch)
    ps = _trained()
    expected = ps.snapshot()
    target = tmp_path / "job" / "checkpoints" / "ckpt-000001" / "ps-0.npz"
    reply = ps.save(_flash_req(target))
    assert int(reply["rows"][0]) == ps.tables[GROUP].size
    assert int(reply["bytes"][0]) > 0 and 0 < float(reply["pause_s"][0]) <= float(
        reply["save_s"][0]
    )
    assert _status(ps, target) == 1  # persisting
    assert not target.exists()
    _push(ps, 50, np.arange(4000, 4100, dtype=np.int64))  # training goes on meanwhile
    gate.open()
    _wait_persisted(ps, target)
    reply = ps.save({"path": _path(target), "mode": np.frombuffer(b"status", np.uint8)})
    digest = read_digest(target)
    assert reply["sha256"].tobytes().decode() == digest.sha256
    assert int(reply["bytes"][0]) == digest.bytes
    with np.load(target) as npz:
        _assert_same(dict(npz), expected)
        assert 50 not in npz["ledger/applied"].tolist()
    assert ps.flash is not None
    meta = ps.flash.slot.read_meta()
    assert meta is not None and meta["persisted"]["sha256"] == digest.sha256


def test_the_ledger_is_copied_as_logged_and_sorted_only_by_the_persister(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing sorts or walks the ledger before the Save call replies: the slot holds its keys
    in the order they were applied; the durable part lists them sorted all the same."""
    gate = Gate(monkeypatch)
    ps = ParameterServer(0, 1, LAYOUT, ADAGRAD, SEED)
    for key in (7, 2, 5):
        _push(ps, key, np.arange(key * 10, key * 10 + 20, dtype=np.int64))
    target = tmp_path / "c" / "ckpt-000001" / "ps-0.npz"
    ps.save(_flash_req(target))
    assert ps.flash is not None
    meta = ps.flash.slot.read_meta()
    assert meta is not None and meta["sort"] == ["ledger/applied"]
    views = ps.flash.slot.arrays(meta)
    assert views["ledger/applied"].tolist() == [7, 2, 5]  # copied as logged, at the reply
    del views
    gate.open()
    _wait_persisted(ps, target)
    with np.load(target) as npz:
        assert npz["ledger/applied"].tolist() == [2, 5, 7]


def test_a_second_flash_save_waits_for_the_first_persist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slot holds the snapshot being persisted: a new one is refused until it is done."""
    gate = Gate(monkeypatch)
    ps = _trained()
    first = tmp_path / "c" / "ckpt-000001" / "ps-0.npz"
    ps.save(_flash_req(first))
    with pytest.raises(ValueError, match="still persisting"):
        ps.save(_flash_req(first.parent.parent / "ckpt-000002" / "ps-0.npz"))
    gate.open()
    _wait_persisted(ps, first)
    second = first.parent.parent / "ckpt-000002" / "ps-0.npz"
    ps.save(_flash_req(second))
    _wait_persisted(ps, second)
    assert read_digest(second).sha256 == read_digest(first).sha256  # nothing changed between


def test_a_failed_persist_is_reported_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch)
    gate.fail = "No space left on device"
    ps = _trained()
    target = tmp_path / "c" / "ckpt-000001" / "ps-0.npz"
    ps.save(_flash_req(target))
    gate.open()
    deadline = time.monotonic() + 10
    while _status(ps, target) == 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    reply = ps.save({"path": _path(target), "mode": np.frombuffer(b"status", np.uint8)})
    assert int(reply["state"][0]) == 3
    assert "No space left on device" in reply["error"].tobytes().decode()
    assert _status(ps, tmp_path / "elsewhere.npz") == 0  # a part this PS never snapshotted


def test_the_slot_grows_during_the_copy_when_rows_outgrew_the_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows created between the estimate and the pause: the copy grows the slot itself."""
    ps = _trained()
    monkeypatch.setattr(ps, "_state_bytes", lambda: 0)
    expected = ps.snapshot()
    target = tmp_path / "c" / "ckpt-000001" / "ps-0.npz"
    ps.save(_flash_req(target))
    _wait_persisted(ps, target)
    assert ps.flash is not None and ps.flash.slot.capacity > 0
    with np.load(target) as npz:
        _assert_same(dict(npz), expected)


def test_every_save_reuses_the_slot_the_first_one_allocated(tmp_path: Path) -> None:
    """The same file and mapping, at the same size, for each checkpoint: no save allocates
    shared memory again while the state fits."""
    ps = _trained()
    inodes, capacities = [], []
    for number in (1, 2, 3):
        _push(ps, 10 + number, np.arange(5, dtype=np.int64))  # training between checkpoints
        target = tmp_path / "c" / f"ckpt-{number:06d}" / "ps-0.npz"
        ps.save(_flash_req(target))
        _wait_persisted(ps, target)
        assert ps.flash is not None
        inodes.append(ps.flash.slot.data_path.stat().st_ino)
        capacities.append(ps.flash.slot.capacity)
    assert len(set(inodes)) == 1 and len(set(capacities)) == 1 and capacities[0] > 0


def test_the_persister_grows_a_nearly_full_slot_before_the_next_save_needs_it(
    tmp_path: Path,
) -> None:
    """A snapshot that fills the slot past 1 / HEADROOM (the state grew since the slot was
    sized): the persister grows it, so the next save, of a state grown further, finds room."""
    flash = FlashCheckpointer(ShmSlot(tmp_path / "shm" / "job", 0))
    mib = 1 << 20
    flash.begin(mib)  # sized for an early, small state
    sized = flash.slot.capacity
    state = np.ones(int(sized * 0.9) // 8, dtype=np.int64)
    flash.copy([("table/t/rows", state)])
    flash.finish(tmp_path / "c" / "ckpt-000001" / "ps-0.npz", 0, 0.0)
    flash.wait()
    assert flash.slot.capacity >= state.nbytes * flash_module.HEADROOM > sized
    grown = flash.slot.capacity
    flash.begin(int(state.nbytes * 1.2))  # the next save: more rows than the old slot held
    assert flash.slot.capacity == grown
    flash.close()


# -- a (re)starting PS: from the verified checkpoint, or from shared memory ----------------------
@pytest.fixture
def dead_pid() -> int:
    """The pid of a process that has exited (the PS that crashed)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _crashing_ps(layout: JobDir, pid: int) -> ParameterServer:
    """A trained PS whose slot is named for process ``pid`` (as if it ran there)."""
    ps = _trained()
    ps.flash = FlashCheckpointer(ShmSlot(layout.flash_dir, 0, pid))
    return ps


def _commit_ps(layout: JobDir, number: int, pss: list[ParameterServer], owner: int = 0) -> Path:
    """Flash-save every PS into checkpoint ``number`` and commit it as the master does."""
    directory = layout.checkpoint_dir(number)
    parts = {}
    for ps in pss:
        target = directory / f"ps-{ps.index}.npz"
        ps.save(_flash_req(target, owner))
        _wait_persisted(ps, target)
        parts[target.name] = read_digest(target)
    atomic_write_json(directory / "queue.json", checkpoint_record({"done": []}, parts))
    layout.commit_checkpoint(directory)
    return directory


def _new_ps() -> ParameterServer:
    return ParameterServer(0, 1, LAYOUT, ADAGRAD, SEED)


def _slots(layout: JobDir) -> list[str]:
    return sorted(p.name for p in layout.flash_dir.glob("ps-*"))


def test_a_restart_takes_the_committed_part_from_shared_memory_when_it_is_the_same(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, dead_pid: int
) -> None:
    layout = JobDir(tmp_path / "job")
    ps = _crashing_ps(layout, dead_pid)
    _commit_ps(layout, 1, [ps])
    with caplog.at_level(logging.INFO, logger="airflow_rover.ps"):
        restored = restore(_new_ps, layout, "ps-0", 0)
    assert "restored from shared memory: shared memory holds ckpt-000001/ps-0.npz" in caplog.text
    _assert_same(restored.snapshot(), ps.snapshot())
    assert _slots(layout) == []  # the dead PS's memory is given back


def test_a_relaunched_ps_restores_and_persists_a_newer_snapshot_of_the_running_master(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, dead_pid: int
) -> None:
    """The PS died after its snapshot for ckpt-2 was in shared memory, before its part was
    written: relaunched under the same master, it restores that snapshot (not the older
    ckpt-1) and writes the part, so the master's checkpoint can still complete."""
    layout = JobDir(tmp_path / "job")
    ps = _crashing_ps(layout, dead_pid)
    _commit_ps(layout, 1, [ps], owner=os.getpid())
    _push(ps, 7, np.arange(10, dtype=np.int64))
    atomic_write_json(layout.master_file, {"address": "http://x", "pid": os.getpid()})
    assert ps.flash is not None
    ps.flash._persist_in_background = lambda meta, slot=None: None  # type: ignore[method-assign]
    target = layout.checkpoint_dir(2) / "ps-0.npz"
    ps.save(_flash_req(target, owner=os.getpid()))  # ... and the PS dies here
    assert not target.exists()

    with caplog.at_level(logging.INFO, logger="airflow_rover.ps"):
        restored = restore(_new_ps, layout, "ps-0", 0)
    assert "shared memory holds a newer snapshot (ckpt-000002, not persisted yet)" in caplog.text
    assert 7 in restored.ledger.applied
    _assert_same(restored.snapshot(), ps.snapshot())
    _wait_persisted(restored, target)
    with np.load(target) as npz:
        _assert_same(dict(npz), ps.snapshot())
    assert _slots(layout) == []  # persisted: the orphan slot is gone


def test_a_newer_snapshot_of_another_master_is_not_used(tmp_path: Path, dead_pid: int) -> None:
    """A new master resumes its queue from the last verified checkpoint: its PS do the same."""
    layout = JobDir(tmp_path / "job")
    ps = _crashing_ps(layout, dead_pid)
    _commit_ps(layout, 1, [ps], owner=1)
    at_checkpoint = ps.snapshot()
    _push(ps, 7, np.arange(10, dtype=np.int64))
    ps.save(_flash_req(layout.checkpoint_dir(2) / "ps-0.npz", owner=1))
    _wait_persisted(ps, layout.checkpoint_dir(2) / "ps-0.npz")
    atomic_write_json(layout.master_file, {"address": "http://x", "pid": 2})
    choice = choose_restore(layout, 0)
    assert choice.slot is None and choice.checkpoint == layout.checkpoint_dir(1)
    assert choice.why == "the snapshot in shared memory is not usable here"
    restored = restore(_new_ps, layout, "ps-0", 0)
    _assert_same(restored.snapshot(), at_checkpoint)
    assert _slots(layout) == []


def test_a_slot_caught_mid_copy_is_never_read(tmp_path: Path, dead_pid: int) -> None:
    layout = JobDir(tmp_path / "job")
    ps = _crashing_ps(layout, dead_pid)
    _commit_ps(layout, 1, [ps])
    assert ps.flash is not None
    ps.flash.slot.invalidate()  # what a PS killed during the copy leaves
    choice = choose_restore(layout, 0)
    assert choice.slot is None and choice.why == "no snapshot in shared memory"
    assert len(choice.orphans) == 1


def test_the_slot_of_a_live_process_is_never_taken(tmp_path: Path) -> None:
    """A PS still exiting (its master died) keeps its slot; its successor does not touch it."""
    layout = JobDir(tmp_path / "job")
    _commit_ps(layout, 1, [_trained()])  # this process's own slot
    assert choose_restore(layout, 0).orphans == []


# -- the master: snapshot, persist in background, commit --------------------------------------
NUM_TRAIN = 1000


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> GeneratedDataset:
    root = tmp_path_factory.mktemp("data")
    return generate_dataset(root, SyntheticConfig(num_train=NUM_TRAIN, num_eval=100, seed=2))


class FakeLauncher(NodeLauncher):
    def __init__(self) -> None:
        self.codes: dict[str, int | None] = {}

    def start(self, node_id: str, role: str) -> None:
        self.codes[node_id] = None

    def exit_codes(self) -> dict[str, int | None]:
        return dict(self.codes)

    def stop(self, node_id: str) -> None:
        pass

    def stop_all(self) -> None:
        pass


class Rig:
    def __init__(self, root: Path, dataset: GeneratedDataset, interval_s: float) -> None:
        self.spec = JobSpec(
            job_id="flash-job.1",
            train_data=str(dataset.train_dir),
            embedding_dim=4,
            plan=ResourcePlan(num_workers=1, num_ps=2),
            training=TrainingConfig(shard_size=250, batch_size=64, optimizer="adagrad"),
            recovery=RecoveryConfig(checkpoint_interval_s=interval_s),
        )
        self.layout = JobDir(root)
        self.spec = write_job(self.layout, self.spec)
        self.master = JobMaster(self.layout, self.spec, FakeLauncher(), TOKEN)
        self.embedding = EmbeddingPlacement.from_features(self.master.spec.resolved_features)
        self.ps: dict[int, ParameterServer] = {}
        self.servers: list[grpc.Server] = []

    def start_ps(self, index: int, ps: ParameterServer | None = None) -> None:
        t = self.spec.training
        ps = ps or ParameterServer(
            index, 2, self.embedding, Optimizer(t.optimizer, t.learning_rate), t.seed
        )
        server, port = start_server(ps, TOKEN, threads=2)
        self.servers.append(server)
        self.ps[index] = ps
        self.master.node_ready(f"ps-{index}", master_api.NodeReady(address=f"127.0.0.1:{port}"))

    def run(self) -> None:
        self.master.step()
        for i in range(2):
            self.start_ps(i)
        self.master.step()
        assert self.master.state == JobState.RUNNING, self.master.message

    def push(self, key: int) -> None:
        group = self.embedding.groups[0]
        client = PSClient(self.master.cluster().ps, TOKEN, timeout_s=10)
        try:
            ids = {group.name: np.arange(key, key + 8, dtype=np.int64)}
            client.push(ids, {group.name: np.full((8, group.dim), 0.01, np.float32)}, {}, key=key)
        finally:
            client.close()

    def close(self) -> None:
        for server in self.servers:
            server.stop(None)


@pytest.fixture
def make_rig(tmp_path: Path, dataset: GeneratedDataset) -> Iterator[Callable[..., Rig]]:
    rigs: list[Rig] = []

    def make(interval_s: float = 0.0) -> Rig:
        rig = Rig(tmp_path / "job", dataset, interval_s)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        rig.close()


def _tick_until(rig: Rig, done: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the supervisor never got there"
        rig.master.step()
        time.sleep(0.01)


def test_a_periodic_checkpoint_never_waits_for_the_disk_and_commits_once_all_parts_are_durable(
    make_rig: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = Gate(monkeypatch)
    rig = make_rig(interval_s=0.05)
    rig.run()
    rig.push(0)
    time.sleep(0.06)
    started = time.monotonic()
    rig.master.step()  # takes the snapshot: the PS copy into shared memory, no disk
    assert time.monotonic() - started < 5
    pending = rig.master.checkpointer.pending
    assert pending is not None and pending.directory == rig.layout.checkpoint_dir(1)
    rig.push(1)  # training goes on; the checkpoint holds the queue and state of the snapshot
    for _ in range(3):
        rig.master.step()  # persists still held: nothing committed, the master not blocked
    assert rig.layout.latest_checkpoint() is None
    assert not (rig.layout.checkpoints / "LATEST").exists()
    assert rig.master.status()["recovery"]["checkpoints"] == 0
    gate.open()
    _tick_until(rig, lambda: rig.master.checkpoints == 1)
    first = rig.layout.checkpoint_dir(1)
    assert (rig.layout.checkpoints / "LATEST").read_text() == "ckpt-000001"
    assert sorted(p.name for p in first.iterdir()) == ["ps-0.npz", "ps-1.npz", "queue.json"]
    assert verify_checkpoint(first) is None
    saved = json.loads((first / "queue.json").read_text())
    assert set(saved["checkpoint"]["parts"]) == {"ps-0.npz", "ps-1.npz"}
    for i in range(2):
        with np.load(first / f"ps-{i}.npz") as npz:
            assert npz["ledger/applied"].tolist() == [0]


def test_a_part_that_fails_to_persist_abandons_the_checkpoint(
    make_rig: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    rig = make_rig()
    rig.run()
    rig.push(0)
    first = rig.master.checkpoint()
    assert first == rig.layout.checkpoint_dir(1)
    gate = Gate(monkeypatch)
    gate.fail = "disk full"
    gate.open()
    with caplog.at_level(logging.WARNING, logger="airflow_rover.master.job"):
        assert rig.master.checkpoint() is None
    assert "checkpoint ckpt-000002 abandoned: ps-0 could not persist its part" in caplog.text
    assert "disk full" in caplog.text
    assert rig.layout.latest_checkpoint() == first
    assert rig.master.status()["recovery"]["checkpoints"] == 1


def test_a_ps_relaunched_without_its_snapshot_abandons_the_checkpoint(
    make_rig: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gate = Gate(monkeypatch)
    rig = make_rig(interval_s=0.05)
    rig.run()
    time.sleep(0.06)
    rig.master.step()
    assert rig.master.checkpointer.pending is not None
    rig.start_ps(1)  # ps-1 came back as a new process that never took this snapshot
    with caplog.at_level(logging.WARNING, logger="airflow_rover.master.job"):
        rig.master.step()
    assert rig.master.checkpointer.pending is None
    assert "abandoned: ps-1 no longer has its snapshot (relaunched)" in caplog.text
    gate.open()
    assert rig.layout.latest_checkpoint() is None


def test_master_and_ps_resume_from_the_same_checkpoint_when_the_newest_is_corrupt(
    make_rig: Callable[..., Rig], caplog: pytest.LogCaptureFixture
) -> None:
    """ckpt-2's ps-1 part has a flipped byte: a new master resumes its queue from ckpt-1 and
    both PS restore ckpt-1, ps-0 included although its own ckpt-2 part is intact."""
    rig = make_rig()
    rig.run()
    rig.push(0)
    first = rig.master.checkpoint()
    rig.push(1)
    second = rig.master.checkpoint()
    assert first is not None and second is not None
    _flip_byte(second / "ps-1.npz")
    assert verify_checkpoint(second) is not None

    with caplog.at_level(logging.WARNING, logger="airflow_rover.core.job_dir"):
        resumed = JobMaster(rig.layout, rig.spec, FakeLauncher(), TOKEN)
    assert resumed.resumed_from == str(first)
    assert resumed.checkpoints == 1
    assert "checkpoint ckpt-000002 skipped: ps-1.npz: checksum mismatch" in caplog.text
    t = rig.spec.training
    for index in range(2):
        restored = restore(
            lambda i=index: ParameterServer(
                i, 2, rig.embedding, Optimizer(t.optimizer, t.learning_rate), t.seed
            ),
            rig.layout,
            f"ps-{index}",
            index,
        )
        assert restored.ledger.applied == {0}


def test_waiting_for_a_commit_gives_up_at_once_when_a_ps_is_gone(
    make_rig: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """checkpoint() runs inside a supervisor tick: it never waits on a PS that died."""
    gate = Gate(monkeypatch)  # held: the parts stay unwritten
    rig = make_rig(interval_s=0.05)
    rig.run()
    time.sleep(0.06)
    rig.master.step()
    assert rig.master.checkpointer.pending is not None
    rig.close()  # the PS go away mid-persist
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="airflow_rover.master.job"):
        assert rig.master.checkpoint() is None
    assert time.monotonic() - started < 30
    assert "checkpoint ckpt-000001 abandoned: no answer" in caplog.text
    assert rig.layout.latest_checkpoint() is None
    gate.fail = "the PS is gone"
    gate.open()


def test_no_room_in_shared_memory_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    ps = _trained()
    with pytest.raises(ValueError, match=r"no room for a \d+ MB snapshot in .*\$ROVER_FLASH_DIR"):
        ps.save(_flash_req(tmp_path / "c" / "ckpt-000001" / "ps-0.npz"))
    _push(ps, 99, np.arange(5, dtype=np.int64))  # the apply lock was never taken or is free


def test_slots_of_processes_long_gone_are_swept(tmp_path: Path, dead_pid: int) -> None:
    """A job killed outright never runs its PS again: a later PS gives its memory back."""
    layout = JobDir(tmp_path / "gone-job")
    ps = _crashing_ps(layout, dead_pid)
    ps.save(_flash_req(layout.checkpoint_dir(1) / "ps-0.npz"))
    _wait_persisted(ps, layout.checkpoint_dir(1) / "ps-0.npz")
    assert len(_slots(layout)) == 2
    FlashCheckpointer.for_job(JobDir(tmp_path / "other-job").checkpoints, 0)
    assert len(_slots(layout)) == 2  # recent: its PS may still be relaunched
    hour_ago = time.time() - 2 * 3600
    for path in layout.flash_dir.iterdir():
        os.utime(path, (hour_ago, hour_ago))
    FlashCheckpointer.for_job(JobDir(tmp_path / "other-job").checkpoints, 0)
    assert not layout.flash_dir.exists()
