"""Tables keyed by raw 64-bit ids (``EmbeddingTable(index="ids")``): each id its own row, and
everything that reads row positions (pull, push, access counters, full and flash checkpoints,
partial saves, a PS resize) works on them as on vocabulary tables."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from test_ps import ADAGRAD, DIMS, SEED, TOKEN, VOCAB, Cluster

from airflow_rover.core.hashing import INIT_SCALE, initial_rows, partition_of
from airflow_rover.core.job_dir import ENV_FLASH_DIR
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.ps.server import ParameterServer
from airflow_rover.ps.tables import EmbeddingTable
from airflow_rover.rpc.ps_client import PSClient

I64 = np.iinfo(np.int64)


def raw_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    """Distinct sorted ids from the whole int64 range, negatives and both extremes included."""
    ids = rng.integers(I64.min, I64.max, n, dtype=np.int64)
    ids[:2] = [I64.min, I64.max]
    return np.unique(ids)


def ids_table(name: str = "t", dim: int = 4, optimizer: Optimizer = ADAGRAD) -> EmbeddingTable:
    return EmbeddingTable(name, dim, vocab_size=1, seed=SEED, optimizer=optimizer, index="ids")


def train(table: EmbeddingTable, batches: list[np.ndarray], seed: int) -> None:
    rng = np.random.default_rng(seed)
    for ids in batches:
        table.lookup(ids)
        table.apply_gradients(ids, rng.normal(size=(ids.size, table.dim)).astype(np.float32))


def test_raw_ids_each_train_their_own_row() -> None:
    """Every id's row is its seeded initial row after exactly its own gradient step: no two
    ids share a row, whatever their values."""
    rng = np.random.default_rng(1)
    ids = raw_ids(rng, 20_000)
    table = ids_table()
    pulled = table.lookup(ids)
    np.testing.assert_array_equal(pulled, initial_rows("t", ids, 4, SEED, INIT_SCALE))
    grads = rng.normal(size=(ids.size, 4)).astype(np.float32)
    table.apply_gradients(ids, grads)
    want, state = pulled.copy(), ADAGRAD.init_state(pulled.shape, rows=True)
    ADAGRAD.apply(want, state, grads)
    np.testing.assert_array_equal(table.lookup(ids, create=False), want)
    np.testing.assert_array_equal(table.fields(ids)["state/accum"], state["accum"])
    assert table.size == ids.size
    assert np.unique(table.index.lookup(ids)).size == ids.size
    assert (table.counts[: table.size] == 1).all()


@pytest.mark.parametrize("name", ["adagrad", "adam"])
def test_an_ids_table_trains_as_a_vocab_table_on_the_same_ids(name: str) -> None:
    optimizer = Optimizer(name, 0.1)  # type: ignore[arg-type]
    rng = np.random.default_rng(2)
    batches = [np.unique(rng.integers(0, 5_000, 700)) for _ in range(15)]
    vocab = EmbeddingTable("t", 8, vocab_size=5_000, seed=SEED, optimizer=optimizer)
    ids = ids_table(dim=8, optimizer=optimizer)
    train(vocab, batches, seed=3)
    train(ids, batches, seed=3)
    a, b = vocab.snapshot(), ids.snapshot()
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_an_unsorted_request_is_accepted_and_a_repeat_rejected() -> None:
    table = ids_table()
    table.lookup(np.array([9, -3, 2**40], dtype=np.int64))
    with pytest.raises(ValueError, match="unique"):
        table.lookup(np.array([5, -3, 5], dtype=np.int64))
    assert table.size == 3


def test_snapshot_restore_and_partial_saves_on_raw_ids() -> None:
    rng = np.random.default_rng(4)
    pool = raw_ids(rng, 3_000)
    hot = pool[:50]
    table = ids_table()
    train(table, [np.unique(np.concatenate([hot, rng.choice(pool, 200)])) for _ in range(8)], 5)
    snapshot = table.snapshot()
    restored = ids_table()
    restored.restore(snapshot)
    for key, value in restored.snapshot().items():
        np.testing.assert_array_equal(value, snapshot[key], err_msg=key)
    np.testing.assert_array_equal(restored.lookup(pool[::-1].copy()), table.lookup(pool[::-1]))
    top = restored.partial_rows("mfu", 50 / restored.size)
    assert set(top["ids"].tolist()) == set(hot.tolist())  # the most accessed: in every batch
    assert (restored.counts[restored.index.lookup(hot)] == 0).all()


def test_pop_rows_and_absorb_move_raw_id_rows_intact() -> None:
    rng = np.random.default_rng(6)
    table = ids_table()
    train(table, [raw_ids(rng, 2_000) for _ in range(3)], 7)
    before = table.snapshot()
    moved = table.pop_rows(lambda ids: partition_of("t", ids, 3) == 2)
    other = ids_table()
    other.absorb(moved)
    assert table.size + other.size == before["ids"].size and other.size > 0
    assert (partition_of("t", table.live_ids, 3) != 2).all()
    for held in (table, other):
        got = held.snapshot()
        at = {int(i): k for k, i in enumerate(before["ids"])}
        rows = np.array([at[int(i)] for i in got["ids"]])
        for key in ("rows", "counts", "seen", "state/accum"):
            np.testing.assert_array_equal(got[key], before[key][rows], err_msg=key)
        np.testing.assert_array_equal(held.index.lookup(got["ids"]), np.arange(held.size))


def ids_cluster(n: int) -> Cluster:
    cluster = Cluster(n)
    for ps in cluster.ps:
        for name in list(ps.tables):
            ps.tables[name] = EmbeddingTable(name, DIMS[name], VOCAB[name], SEED, ADAGRAD, "ids")
    return cluster


def raw_steps(client: PSClient, first_key: int, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for key in range(first_key, first_key + count):
        ids = {name: raw_ids(rng, 80) for name in DIMS}
        client.pull(ids)
        grads = {n: rng.normal(size=(i.size, DIMS[n])).astype(np.float32) for n, i in ids.items()}
        client.push(ids, grads, {}, key=key)


def held_rows(servers: list[ParameterServer]) -> dict[tuple[str, int], bytes]:
    out: dict[tuple[str, int], bytes] = {}
    for ps in servers:
        for name, table in ps.tables.items():
            snap = table.snapshot()
            for i, row_id in enumerate(snap["ids"].tolist()):
                assert (name, row_id) not in out, "a row is held by two PS"
                out[name, row_id] = snap["rows"][i].tobytes() + snap["state/accum"][i].tobytes()
    return out


def test_a_ps_resize_moves_raw_id_rows_by_jump_hash() -> None:
    cluster = ids_cluster(3)
    try:
        for ps in cluster.ps:
            ps.num_ps = 2
        every = PSClient(cluster.addresses, TOKEN, timeout_s=10)
        two = every.connected_to(cluster.addresses[:2])
        raw_steps(two, 0, 4, seed=8)
        before = held_rows(cluster.ps)
        assert any(i < 0 for _, i in before)
        every.reshard(cluster.addresses)
        assert held_rows(cluster.ps) == before
        for ps in cluster.ps:
            for name, table in ps.tables.items():
                assert (partition_of(name, table.live_ids, 3) == ps.index).all()
        raw_steps(every, 4, 2, seed=9)  # training goes on, on three PS
        every.close()
    finally:
        cluster.stop()


def _path(value: Path) -> np.ndarray:
    return np.frombuffer(str(value).encode(), dtype=np.uint8)


@pytest.mark.parametrize("mode", ["sync", "flash"])
def test_full_and_flash_checkpoints_restore_raw_id_tables(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_FLASH_DIR, str(tmp_path / "shm"))
    cluster = ids_cluster(1)
    try:
        client = cluster.client()
        raw_steps(client, 0, 3, seed=10)
        client.close()
        ps = cluster.ps[0]
        expected = ps.snapshot()
        target = tmp_path / "job" / "checkpoints" / "ckpt-000001" / "ps-0.npz"
        req = {"path": _path(target), "mode": np.frombuffer(mode.encode(), np.uint8)}
        ps.save(req)
        status = {"path": _path(target), "mode": np.frombuffer(b"status", np.uint8)}
        deadline = time.monotonic() + 30
        while mode == "flash" and int(ps.save(status)["state"][0]) == 1:
            assert time.monotonic() < deadline, "the persist did not end"
            time.sleep(0.01)
        restored = ids_cluster(1)
        try:
            with np.load(target) as npz:
                restored.ps[0].restore(dict(npz))
            got = restored.ps[0].snapshot()
            assert got.keys() == expected.keys()
            for key in expected:
                np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
            table = restored.ps[0].tables["dim4"]
            assert table.index.lookup(table.live_ids).tolist() == list(range(table.size))
        finally:
            restored.stop()
    finally:
        cluster.stop()
