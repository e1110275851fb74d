"""A PS resize moves exactly the rows whose owner changes, keeps every value, optimizer state,
access count and dense variable, hands the batch ledger to new PS, and training after it gives
the very numbers a job that never resized gives. A checkpoint of another PS count restores
re-partitioned."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from test_ps import ADAGRAD, DENSE_INIT, DIMS, LAYOUT, SEED, TOKEN, Cluster

from airflow_rover.core.hashing import owner_of, partition_of
from airflow_rover.ps.pieces import in_pieces
from airflow_rover.ps.server import ParameterServer
from airflow_rover.rpc import ps_service
from airflow_rover.rpc.ps_client import PSClient


def steps(client: PSClient, first_key: int, count: int, seed: int) -> list[np.ndarray]:
    """``count`` keyed pull+push steps; returns the rows and dense weights pulled."""
    rng = np.random.default_rng(seed)
    seen: list[np.ndarray] = []
    for key in range(first_key, first_key + count):
        ids = {
            "dim4": np.sort(rng.choice(1300, size=60, replace=False)).astype(np.int64),
            "dim2": np.sort(rng.choice(500, size=30, replace=False)).astype(np.int64),
            "dim1": np.sort(rng.choice(50, size=5, replace=False)).astype(np.int64),
        }
        rows, dense = client.pull(ids)
        seen += [rows[k].copy() for k in sorted(rows)] + [dense[k].copy() for k in sorted(dense)]
        grads = {n: rng.normal(size=(i.size, DIMS[n])).astype(np.float32) for n, i in ids.items()}
        dgrads = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in DENSE_INIT.items()}
        client.push(ids, grads, dgrads, key=key)
    return seen


def all_rows(servers: list[ParameterServer]) -> dict[tuple[str, int], tuple]:
    """(group, id) -> (row, optimizer state, count) across ``servers``; no row held twice."""
    out: dict[tuple[str, int], tuple] = {}
    for ps in servers:
        for name, table in ps.tables.items():
            snap = table.snapshot()
            for i, row_id in enumerate(snap["ids"]):
                assert (name, int(row_id)) not in out, "a row is held by two PS"
                state = tuple(snap[k][i].tobytes() for k in sorted(snap) if k.startswith("state/"))
                out[name, int(row_id)] = (snap["rows"][i].tobytes(), state, int(snap["counts"][i]))
    return out


def assert_placed(servers: list[ParameterServer], num_ps: int) -> None:
    for ps in servers:
        for name, table in ps.tables.items():
            ids = table.snapshot()["ids"]
            assert (partition_of(name, ids, num_ps) == ps.index).all(), (ps.index, name)
        for var in ps.dense.values:
            assert owner_of(var, num_ps) == ps.index


@pytest.fixture
def grown() -> Iterator[Cluster]:
    """Three PS: the first two trained as a 2-PS job; the third new (it knows no rows)."""
    cluster = Cluster(3)
    for ps in cluster.ps:
        ps.num_ps = 2
    old = PSClient(cluster.addresses[:2], TOKEN, timeout_s=10)
    old.init_dense(DENSE_INIT)
    steps(old, 0, 6, seed=1)
    old.close()
    yield cluster
    cluster.stop()


@pytest.mark.parametrize("piece_bytes", [ps_service.PIECE_BYTES, 300], ids=["one", "pieces"])
def test_going_from_2_to_3_ps_moves_only_the_new_ps_rows_and_keeps_every_value(
    grown: Cluster, piece_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In one ``Absorb`` per PS, or in pieces of 300 bytes (a few rows each) as a job whose
    moving rows are over its PS's request limit sends them."""
    monkeypatch.setattr(ps_service, "PIECE_BYTES", piece_bytes)
    before = all_rows(grown.ps)
    dense_before = {k: v for ps in grown.ps for k, v in ps.dense.read().items()}
    moving = sum(
        int((partition_of(name, np.array([i]), 3) == 2).sum()) for name, i in before
    )  # jump hash: every row that moves goes to the new PS
    client = PSClient(grown.addresses, TOKEN, timeout_s=10)
    replies = client.reshard(grown.addresses)
    client.close()
    assert sum(int(r["moved_rows"][0]) for r in replies) == moving > 0
    assert all_rows(grown.ps) == before
    assert_placed(grown.ps, 3)
    dense_after = {k: v for ps in grown.ps for k, v in ps.dense.read().items()}
    assert dense_after.keys() == dense_before.keys()
    for name, value in dense_before.items():
        np.testing.assert_array_equal(dense_after[name], value)
    assert grown.ps[2].ledger.applied == grown.ps[0].ledger.applied == set(range(6))


def test_going_back_from_3_to_2_ps_empties_the_removed_one(grown: Cluster) -> None:
    before = all_rows(grown.ps)
    client = PSClient(grown.addresses, TOKEN, timeout_s=10)
    client.reshard(grown.addresses)
    client.reshard(grown.addresses[:2])
    client.close()
    assert all_rows(grown.ps) == before
    assert_placed(grown.ps[:2], 2)
    assert all(t.size == 0 for t in grown.ps[2].tables.values()) and not grown.ps[2].dense.values


def test_training_across_resizes_matches_a_job_that_never_resized() -> None:
    """Sequential keyed steps: 2 PS, then 3, then 1; the same steps on one PS throughout."""
    steady = Cluster(1)
    resized = Cluster(3)
    try:
        for ps in resized.ps:
            ps.num_ps = 2
        reference = PSClient(steady.addresses, TOKEN, timeout_s=10)
        reference.init_dense(DENSE_INIT)
        want = [
            *steps(reference, 0, 4, seed=5),
            *steps(reference, 4, 4, seed=6),
            *steps(reference, 8, 4, seed=7),
        ]
        every = PSClient(resized.addresses, TOKEN, timeout_s=10)
        two = every.connected_to(resized.addresses[:2])
        two.init_dense(DENSE_INIT)
        got = steps(two, 0, 4, seed=5)
        every.reshard(resized.addresses)
        got += steps(every, 4, 4, seed=6)
        every.reshard(resized.addresses[:1])
        got += steps(every.connected_to(resized.addresses[:1]), 8, 4, seed=7)
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
    finally:
        steady.stop()
        resized.stop()


def test_a_checkpoint_of_2_ps_restores_into_3_ps(grown: Cluster) -> None:
    parts = [ps.snapshot() for ps in grown.ps[:2]]
    parts[1]["ledger/applied"] = np.arange(5, dtype=np.int64)  # batch 5 in flight on PS 1
    before = all_rows(grown.ps[:2])
    restored = [ParameterServer(i, 3, LAYOUT, ADAGRAD, SEED) for i in range(3)]
    for ps in restored:
        ps.restore_repartitioned(parts)
    assert all_rows(restored) == before
    assert_placed(restored, 3)
    assert {k for ps in restored for k in ps.dense.values} == set(DENSE_INIT)
    assert all(ps.ledger.applied == set(range(5)) for ps in restored)  # what every part had


def test_a_hand_over_goes_in_pieces_within_the_budget() -> None:
    """Every row once, in runs of at most the budget (a row over it alone), aligned across a
    table's fields; the dense variables and the ledger whole in the first piece."""
    rng = np.random.default_rng(0)
    arrays = {
        "table/a/ids": np.arange(1000, dtype=np.int64),
        "table/a/rows": rng.normal(size=(1000, 4)).astype(np.float32),
        "table/a/state/acc": rng.normal(size=(1000, 4)).astype(np.float32),
        "table/b/ids": np.arange(10, dtype=np.int64),
        "table/b/rows": rng.normal(size=(10, 2)).astype(np.float32),
        "dense/w": np.ones(50, np.float32),
        "ledger/applied": np.arange(7, dtype=np.int64),
    }
    pieces = list(in_pieces(arrays, 4096))
    assert len(pieces) == 10  # 40 bytes a row of a: 102 rows a piece
    rows = [{k: v for k, v in p.items() if k.startswith("table/")} for p in pieces]
    assert all(sum(v.nbytes for v in r.values()) <= 4096 for r in rows)
    assert {k for k in pieces[0] if not k.startswith("table/")} == {"dense/w", "ledger/applied"}
    assert all(k.startswith("table/") for p in pieces[1:] for k in p)
    for key, value in arrays.items():
        got = [p[key] for p in pieces if key in p]
        np.testing.assert_array_equal(np.concatenate(got) if len(got) > 1 else got[0], value)
    for p in pieces:
        for table in ("a", "b"):
            if f"table/{table}/ids" in p:
                sizes = {len(v) for k, v in p.items() if k.startswith(f"table/{table}/")}
                assert len(sizes) == 1
    only_ledger = {"ledger/applied": np.arange(3, dtype=np.int64)}
    assert list(in_pieces(only_ledger, 10)) == [only_ledger]  # a new PS needs it, rows or not
    assert [len(p["table/a/ids"]) for p in in_pieces(arrays, 16) if "table/a/ids" in p] == [
        1
    ] * 1000
