"""The collisionless id index (``core.id_index``): every id its own row, found again after
growth, the same rows from the C loops and their numpy twin."""

from __future__ import annotations

import os

import numpy as np
import pytest

from airflow_rover.core.id_index import MAX_LOAD, IdIndex
from airflow_rover.core.id_probe import META, PROBE, CompiledProbe, NumpyProbe, mix, tags
from airflow_rover.core.vocab_index import VocabIndex

PROBES = [pytest.param(NumpyProbe(), id="numpy")]
if isinstance(PROBE, CompiledProbe):
    PROBES.insert(0, pytest.param(PROBE, id="compiled"))


def raw_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    """Ids from the whole int64 range (negatives, extremes) mixed with small dense ones."""
    ids = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n, dtype=np.int64)
    ids[: n // 4] = rng.integers(-50, 2_000, n // 4)
    ids[n // 4 : n // 4 + 2] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max]
    return ids


def test_the_compiled_probe_is_built_where_ci_requires_it() -> None:
    if os.environ.get("ROVER_REQUIRE_COMPILED") == "1":
        assert isinstance(PROBE, CompiledProbe)
    else:
        assert PROBE.compiled == isinstance(PROBE, CompiledProbe)


@pytest.mark.parametrize("probe", PROBES)
def test_no_two_ids_share_a_row_after_many_inserts_and_growth(probe: NumpyProbe) -> None:
    rng = np.random.default_rng(7)
    index = IdIndex(probe)
    truth: dict[int, int] = {}
    for _ in range(30):
        ids = raw_ids(rng, 3_000)
        rows = index.insert(ids)
        for i, r in zip(ids.tolist(), rows.tolist(), strict=True):
            assert truth.setdefault(i, r) == r  # an id keeps its row; repeats get the first
    assert index.size == len(truth)
    assert sorted(truth.values()) == list(range(index.size))  # no two ids share a row
    assert index.size / index.capacity <= MAX_LOAD
    assert index.capacity & (index.capacity - 1) == 0
    everything = np.fromiter(truth, dtype=np.int64)
    np.testing.assert_array_equal(index.lookup(everything), list(truth.values()))
    np.testing.assert_array_equal(index.keys[index.lookup(everything)], everything)
    _assert_slots_tagged(index)


def _assert_slots_tagged(index: IdIndex) -> None:
    """Each row sits in one slot, its low log2(capacity) bits the row and the bits above them
    the top bits of its id's hash."""
    slots, mask = index._slots, index.capacity - 1
    held = slots[slots != -1]
    rows = held & mask
    assert sorted(rows.tolist()) == list(range(index.size))
    np.testing.assert_array_equal(held & ~np.int32(mask), tags(mix(index.keys[rows]), mask))
    assert (held >= 0).all() and (held & ~np.int32(mask)).any()


@pytest.mark.parametrize("probe", PROBES)
def test_absent_ids_read_minus_one_and_are_not_created(probe: NumpyProbe) -> None:
    index = IdIndex(probe)
    index.insert(np.array([5, -5, 2**62], dtype=np.int64))
    got = index.lookup(np.array([-5, 6, 2**62, -(2**62)], dtype=np.int64))
    np.testing.assert_array_equal(got, [1, -1, 2, -1])
    assert index.size == 3


def test_compiled_and_numpy_probes_give_identical_rows() -> None:
    if not isinstance(PROBE, CompiledProbe):
        pytest.skip("the C loops are not built here (ROVER_REQUIRE_COMPILED=1 makes this fail)")
    rng = np.random.default_rng(11)
    compiled, twin = IdIndex(PROBE), IdIndex(NumpyProbe())
    for _ in range(20):
        ids = raw_ids(rng, 5_000)
        np.testing.assert_array_equal(compiled.insert(ids), twin.insert(ids))
        probe_ids = raw_ids(rng, 2_000)
        np.testing.assert_array_equal(compiled.lookup(probe_ids), twin.lookup(probe_ids))
    np.testing.assert_array_equal(compiled.keys, twin.keys)
    src = rng.standard_normal((compiled.size, 16)).astype(np.float32)
    ids = np.unique(np.concatenate([compiled.keys[::-7], raw_ids(rng, 500)]))
    rng.shuffle(ids)
    grads = rng.standard_normal((ids.size, 16)).astype(np.float32)
    bad = grads.copy()
    bad[3, 2] = np.nan
    results = []
    for probe in (PROBE, NumpyProbe()):
        index = compiled if probe is PROBE else twin
        out = np.zeros((ids.size, 16), np.float32)
        meta = np.zeros(src.shape[0], META)
        meta["seen"] = 4
        rows, absent = index.pull(ids, src, out, meta, 9)
        pulled = (rows, absent, out, meta)
        dst = src.copy()
        probe.scatter(dst, rows[rows >= 0], grads[rows >= 0])
        results.append((*pulled, dst, probe.all_finite(grads), probe.all_finite(bad)))
    for i, (a, b) in enumerate(zip(*results, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=str(i))
    rows, absent, out, meta, dst, finite, infinite = results[0]
    assert absent == np.count_nonzero(~np.isin(ids, compiled.keys)) > 0
    assert finite and not infinite
    found = rows >= 0
    np.testing.assert_array_equal(out[found], src[rows[found]])
    assert (out[~found] == 0).all()
    assert meta["count"].sum() == found.sum() and (meta["seen"][rows[found]] == 9).all()
    assert (meta["seen"][meta["count"] == 0] == 4).all()


def test_the_hash_is_splitmix64() -> None:
    # splitmix64's published first output for seed 0 is mix(0x9E3779B97F4A7C15)
    seed = np.array([0x9E3779B97F4A7C15], dtype=np.uint64).view(np.int64)
    assert int(mix(seed)[0]) == 0xE220A8397B1DCDAF


@pytest.mark.parametrize("probe", PROBES)
def test_reset_holds_exactly_the_given_ids(probe: NumpyProbe) -> None:
    rng = np.random.default_rng(3)
    index = IdIndex(probe)
    index.insert(raw_ids(rng, 10_000))
    keep = np.unique(index.keys[::3])
    rng.shuffle(keep)
    index.reset(index.keys[np.isin(index.keys, keep)])
    assert index.size == keep.size
    np.testing.assert_array_equal(index.keys[index.lookup(keep)], keep)
    np.testing.assert_array_equal(index.lookup(index.keys), np.arange(index.size))
    assert (index.lookup(np.setdiff1d(raw_ids(rng, 1_000), keep)) == -1).all()
    _assert_slots_tagged(index)  # rebuilt by the C loop or the numpy twin


def test_vocab_index_maps_in_range_ids_and_names_the_out_of_range() -> None:
    index = VocabIndex(100)
    np.testing.assert_array_equal(index.insert(np.array([7, 3, 7, 99])), [0, 1, 0, 2])
    np.testing.assert_array_equal(index.lookup(np.array([3, 4])), [1, -1])
    assert index.check(0, 100) == "ids must lie in [0, 100), got [0, 100]"
    assert index.check(0, 99) is None
    assert IdIndex().check(-(2**63), 2**63 - 1) is None
    index.reset(np.array([99, 3]))
    np.testing.assert_array_equal(index.lookup(np.array([3, 7, 99])), [1, -1, 0])


def test_direct_pull_reads_and_counts_only_the_rows_an_id_has() -> None:
    """The vocabulary's pull (``pull_direct``): C loops and numpy twin agree, absent ids
    are reported and left alone, present ones copied and counted."""
    rng = np.random.default_rng(3)
    row_of = np.full(50_000, -1, dtype=np.int32)
    held = rng.choice(row_of.size, 20_000, replace=False)
    row_of[held] = rng.permutation(held.size).astype(np.int32)
    src = rng.normal(size=(held.size, 16)).astype(np.float32)
    ids = np.sort(rng.choice(row_of.size, 5_000, replace=False)).astype(np.int64)
    results = []
    for probe in [p.values[0] for p in PROBES]:
        rows = np.empty(ids.size, np.int32)
        out = np.zeros((ids.size, 16), np.float32)
        meta = np.zeros(src.shape[0], META)
        absent = probe.pull_direct(row_of, ids, rows, src, out, meta, 5)
        results.append((rows, absent, out, meta))
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)
    rows, absent, out, meta = results[0]
    np.testing.assert_array_equal(rows, row_of[ids])
    found = rows >= 0
    assert absent == np.count_nonzero(~found) > 0
    np.testing.assert_array_equal(out[found], src[rows[found]])
    assert (out[~found] == 0).all()
    assert meta["count"].sum() == found.sum() and (meta["seen"][rows[found]] == 5).all()
