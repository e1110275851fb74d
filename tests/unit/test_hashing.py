"""Stable hashing: row placement and seeded initial rows depend only on (table, id, seed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from airflow_rover.core.hashing import initial_rows, owner_of, partition_of

IDS = np.array([0, 1, 2, 3, 17, 4096, 99_999, 2**31 - 1, 2**40 + 5, 2**62], dtype=np.int64)


def test_partition_of_is_deterministic_and_in_range() -> None:
    """Same inputs, same owners; owners lie in [0, num_ps); one id's owner ignores its batch."""
    for num_ps in (1, 2, 3, 7):
        first = partition_of("C1", IDS, num_ps)
        assert first.dtype == np.int64
        assert first.shape == IDS.shape
        assert ((first >= 0) & (first < num_ps)).all()
        np.testing.assert_array_equal(first, partition_of("C1", IDS.copy(), num_ps))
        # Batch composition and order do not matter.
        perm = np.random.default_rng(0).permutation(IDS.size)
        np.testing.assert_array_equal(partition_of("C1", IDS[perm], num_ps), first[perm])
        for i, one in enumerate(IDS):
            assert partition_of("C1", np.array([one]), num_ps)[0] == first[i]
    assert (partition_of("C1", IDS, 1) == 0).all()


def test_partition_of_accepts_any_integer_dtype() -> None:
    """int32/int64/uint64 ids of the same values land on the same PS."""
    small = np.arange(1000)
    expected = partition_of("t", small.astype(np.int64), 5)
    for dtype in (np.int32, np.uint32, np.uint64):
        np.testing.assert_array_equal(partition_of("t", small.astype(dtype), 5), expected)


_CHILD = """
import json, sys
import numpy as np
from airflow_rover.core.hashing import initial_rows, owner_of, partition_of
ids = np.array(json.loads(sys.argv[1]), dtype=np.int64)
print(json.dumps({
    "parts": {n: partition_of("C7", ids, int(n)).tolist() for n in ("2", "3", "8")},
    "owners": [owner_of(name, 4) for name in ("dense/kernel", "dense/bias", "out")],
    "rows": initial_rows("C7", ids, 3, 42, 0.05).tolist(),
}))
"""


def test_stable_across_processes() -> None:
    """A fresh interpreter (different hash seed) places rows and initialises them identically."""
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(IDS.tolist())],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=60,
    )
    child = json.loads(out.stdout)
    for n in ("2", "3", "8"):
        assert child["parts"][n] == partition_of("C7", IDS, int(n)).tolist()
    assert child["owners"] == [owner_of(name, 4) for name in ("dense/kernel", "dense/bias", "out")]
    np.testing.assert_array_equal(
        np.array(child["rows"], dtype=np.float32), initial_rows("C7", IDS, 3, 42, 0.05)
    )


def _zipf_unique_ids() -> np.ndarray:
    draws = np.random.default_rng(7).zipf(1.1, 600_000)
    ids = np.unique(draws).astype(np.int64)
    assert ids.size >= 200_000
    return ids


@pytest.mark.parametrize("num_ps", [2, 3, 4, 8])
def test_partition_is_balanced_on_zipf_ids(num_ps: int) -> None:
    """~200k unique Zipf-drawn ids (and a dense id range) spread within 10% of an even split."""
    for table, ids in (("C3", _zipf_unique_ids()), ("C12", np.arange(200_000))):
        rows = np.bincount(partition_of(table, ids, num_ps), minlength=num_ps)
        assert rows.size == num_ps
        assert rows.max() / rows.mean() <= 1.1, (table, rows)


def test_partition_differs_between_tables() -> None:
    """The table name salts the hash: the same ids are placed differently in another table."""
    ids = np.arange(10_000)
    a, b = partition_of("C1", ids, 4), partition_of("C2", ids, 4)
    agreement = float((a == b).mean())
    assert 0.15 < agreement < 0.35  # ~1/4 when independent


def test_owner_of_is_in_range_and_spreads() -> None:
    """Dense variables are placed on every PS, not all on one."""
    names = [f"dense_{i}/kernel" for i in range(200)]
    owners = [owner_of(n, 4) for n in names]
    assert set(owners) == {0, 1, 2, 3}
    assert owners == [owner_of(n, 4) for n in names]
    assert all(owner_of(n, 1) == 0 for n in names)


def test_initial_rows_deterministic_and_shaped() -> None:
    """Rows are float32 (n, dim), identical on every call, and independent of the batch."""
    rows = initial_rows("C1", IDS, 8, 0, 0.05)
    assert rows.dtype == np.float32
    assert rows.shape == (IDS.size, 8)
    np.testing.assert_array_equal(rows, initial_rows("C1", IDS.copy(), 8, 0, 0.05))
    for i in range(IDS.size):
        np.testing.assert_array_equal(initial_rows("C1", IDS[i : i + 1], 8, 0, 0.05)[0], rows[i])
    assert initial_rows("C1", np.empty(0, dtype=np.int64), 8, 0, 0.05).shape == (0, 8)


@pytest.mark.parametrize("scale", [0.05, 1.0, 3.0])
def test_initial_rows_within_scale(scale: float) -> None:
    """Values lie in [-scale, scale) and fill the range roughly uniformly."""
    rows = initial_rows("C2", np.arange(50_000), 16, 3, scale)
    s = np.float32(scale)
    assert rows.min() >= -s
    assert rows.max() < s
    assert rows.min() < -0.99 * s and rows.max() > 0.99 * s
    assert abs(float(rows.mean())) < 0.01 * scale
    hist, _ = np.histogram(rows, bins=10, range=(-scale, scale))
    assert hist.min() / hist.max() > 0.95


def test_initial_rows_differ_by_table_seed_id_and_column() -> None:
    """Table, seed, id and dimension index each change the value."""
    ids = np.arange(1000)
    base = initial_rows("C1", ids, 4, 0, 0.05)
    for other in (
        initial_rows("C2", ids, 4, 0, 0.05),
        initial_rows("C1", ids, 4, 1, 0.05),
        initial_rows("C1", ids + 1000, 4, 0, 0.05),
    ):
        assert float((other == base).mean()) < 0.01
    assert float((base[:, 0] == base[:, 1]).mean()) < 0.01
    assert len(np.unique(base, axis=0)) == 1000
    # A wider row extends the narrower one: column j depends only on (table, id, seed, j).
    np.testing.assert_array_equal(initial_rows("C1", ids, 8, 0, 0.05)[:, :4], base)


def test_initial_rows_accept_large_and_negative_seeds() -> None:
    """Seeds beyond 64 bits and negative seeds are reduced, not rejected, and still differ."""
    ids = np.arange(100)
    a = initial_rows("C1", ids, 2, -1, 0.05)
    b = initial_rows("C1", ids, 2, 2**64 - 1, 0.05)
    np.testing.assert_array_equal(a, b)  # -1 and 2**64-1 are the same 64-bit seed
    assert not np.array_equal(a, initial_rows("C1", ids, 2, 0, 0.05))


def _jump_reference(key: int, n: int) -> int:
    """Lamping and Veach's loop, in Python integers."""
    bucket, nxt = -1, 0
    while nxt < n:
        bucket = nxt
        key = (key * 2862933555777941757 + 1) % 2**64
        nxt = int((bucket + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return bucket


def test_jump_hash_matches_the_reference_algorithm() -> None:
    from airflow_rover.core.hashing import jump_hash, splitmix64

    keys = splitmix64(np.arange(500, dtype=np.uint64))
    for n in (1, 2, 3, 7, 16, 100):
        expected = [_jump_reference(int(k), n) for k in keys]
        assert jump_hash(keys, n).tolist() == expected


@pytest.mark.parametrize("num_ps", [1, 2, 3, 5, 8])
def test_adding_a_ps_moves_only_the_rows_the_new_ps_takes(num_ps: int) -> None:
    """Consistent placement: p -> p+1 moves about 1/(p+1) of the rows, all to the new PS."""
    ids = np.arange(200_000, dtype=np.int64)
    before, after = partition_of("C1", ids, num_ps), partition_of("C1", ids, num_ps + 1)
    moved = before != after
    assert set(after[moved].tolist()) == {num_ps}
    assert abs(moved.mean() - 1 / (num_ps + 1)) < 0.01
