"""A PS's chain of CPR partial saves stays short: folded into one base file once it holds more
than the PS's full table, so a restore reads about one table's bytes however many saves came;
and the rows it restores are each row's newest saved copy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_ps import ADAGRAD, LAYOUT, SEED

from airflow_rover.core.checkpoint_files import write_npz
from airflow_rover.core.cpr import SsuTracker
from airflow_rover.core.cpr_chain import PartialChain, merge_saves
from airflow_rover.ps.server import ParameterServer

GROUP = "dim4"


def saved_rows(path: Path) -> dict[int, np.ndarray]:
    with np.load(path) as saved:
        ids, rows = saved[f"table/{GROUP}/ids"], saved[f"table/{GROUP}/rows"]
        return {int(i): row for i, row in zip(ids, rows, strict=True)}


@pytest.mark.parametrize("background", [False, True])
def test_a_restore_after_many_partial_saves_reads_about_one_table(
    tmp_path: Path, background: bool
) -> None:
    ps = ParameterServer(0, 1, LAYOUT, ADAGRAD, SEED)
    rng = np.random.default_rng(0)
    ids = np.arange(1200)
    ps.pull({f"ids/{GROUP}": ids})
    full = write_npz(tmp_path / "full.npz", ps.snapshot().items()).bytes
    chain = PartialChain(tmp_path / "chain", background=background, slack=0.25)
    newest: dict[int, np.ndarray] = {}
    worst = 0.0
    for k in range(16):  # 16 saves of r = 1/4: four tables' worth of rows
        hot = np.unique(rng.integers(0, 1200, 400) ** 2 // 1200)  # a skewed share
        ps.push({f"ids/{GROUP}": hot, f"grad/{GROUP}": rng.random((hot.size, 4), np.float32)})
        path = tmp_path / f"partial-{k:03d}" / "ps-0.npz"
        ps.partial_save(path, "mfu", 0.25)
        newest.update(saved_rows(path))
        chain.add(path, full)
        chain.wait()
        restored = chain.read()
        worst = max(worst, chain.read_bytes / full)
        got = dict(
            zip(
                restored[f"table/{GROUP}/ids"].tolist(),
                restored[f"table/{GROUP}/rows"],
                strict=True,
            )
        )
        assert got.keys() == newest.keys()
        for i, row in newest.items():
            np.testing.assert_array_equal(got[i], row)
    print(f"16 saves, {chain.folds} folds; a restore read at most {worst:.2f} of a full table")
    assert chain.folds >= 2
    assert worst <= 1.0 + 0.25 + 0.25 + 0.05  # base (every row at most), slack, one save


def test_a_fold_keeps_saves_added_while_it_ran(tmp_path: Path) -> None:
    """A save written during a background fold stays in the chain, after the new base."""
    ps = ParameterServer(0, 1, LAYOUT, ADAGRAD, SEED)
    ps.pull({f"ids/{GROUP}": np.arange(800)})
    chain = PartialChain(tmp_path / "chain")
    paths = []
    for k in range(3):
        paths.append(tmp_path / f"p{k}" / "ps-0.npz")
        ps.partial_save(paths[-1], "mfu", 0.5)
        chain.add(paths[-1], 0 if k == 1 else 10**9)  # the second add starts a fold
    chain.wait()
    assert chain.folds == 1 and chain.base is not None
    assert chain.chain == [paths[2]] and not paths[0].exists() and paths[2].exists()


def test_merge_saves_takes_each_rows_newest_copy() -> None:
    old = {f"table/{GROUP}/ids": np.array([1, 2]), f"table/{GROUP}/rows": np.array([[1.0], [2.0]])}
    new = {f"table/{GROUP}/ids": np.array([2, 3]), f"table/{GROUP}/rows": np.array([[9.0], [3.0]])}
    merged = merge_saves([old, new])
    np.testing.assert_array_equal(merged[f"table/{GROUP}/ids"], [1, 2, 3])
    np.testing.assert_array_equal(merged[f"table/{GROUP}/rows"][:, 0], [1.0, 9.0, 3.0])


def test_partial_chain_rejects_a_negative_table_size(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="table_bytes"):
        PartialChain(tmp_path).add(tmp_path / "x.npz", -1)
    with pytest.raises(ValueError, match="max_files=1"):
        PartialChain(tmp_path, max_files=1)


def test_a_chain_of_more_files_than_allowed_folds_below_a_tables_bytes(tmp_path: Path) -> None:
    """Small saves of a few hot rows never reach a table's bytes; ``max_files`` still bounds
    the files a restore opens, and the restore reads every row's newest copy."""
    ps = ParameterServer(0, 1, LAYOUT, ADAGRAD, SEED)
    ps.pull({f"ids/{GROUP}": np.arange(1200)})
    chain = PartialChain(tmp_path / "chain", background=False, max_files=4)
    rng = np.random.default_rng(2)
    newest: dict[int, np.ndarray] = {}
    for k in range(11):
        hot = np.unique(rng.integers(0, 60, 40))
        ps.push({f"ids/{GROUP}": hot, f"grad/{GROUP}": rng.random((hot.size, 4), np.float32)})
        path = tmp_path / f"partial-{k:03d}" / "ps-0.npz"
        ps.partial_save(path, "mfu", 0.02)
        newest.update(saved_rows(path))
        chain.add(path, 10**9)  # far more than these saves: only the file count folds
        assert len(chain.paths()) <= 4
    assert chain.folds == 2  # at the 5th and the 9th save (the base and 3 saves, then a 4th)
    restored = chain.read()
    ids, rows = restored[f"table/{GROUP}/ids"], restored[f"table/{GROUP}/rows"]
    got = dict(zip(ids.tolist(), rows, strict=True))
    assert got.keys() == newest.keys()
    for i, row in newest.items():
        np.testing.assert_array_equal(got[i], row)


def test_ssu_updates_its_list_in_bulk_not_per_pull() -> None:
    """Sampled pulls are kept aside and added to the list a capacity's worth at a time."""
    ssu = SsuTracker(num_rows=100_000, r=0.125, sample_period=1, seed=0)
    rng = np.random.default_rng(1)
    for _ in range(1000):
        ssu.record(rng.integers(0, 100_000, 50))  # 50 000 rows kept aside in all
    assert ssu.flushes <= 50_000 // ssu.capacity  # 4, against 1000 updates per pull
    listed = ssu.rows()
    assert ssu.flushes <= 50_000 // ssu.capacity + 1
    assert 0 < listed.size <= ssu.capacity and np.unique(listed).size == listed.size


def test_ssu_rejects_rows_out_of_range() -> None:
    """Past the flags' end at once; past the rows but inside the flags (they grow by
    doubling) at the flush that meets them; negative ones at once."""
    ssu = SsuTracker(num_rows=10, r=1.0, sample_period=1)
    with pytest.raises(ValueError, match=r"rows must lie in \[0, 10\)"):
        ssu.record(np.array([3, 12]))
    with pytest.raises(ValueError, match=r"rows must lie in \[0, 10\)"):
        ssu.record(np.array([-1]))
    ssu.grow(11)  # flags for 20 rows now
    ssu.record(np.array([2, 15]))
    with pytest.raises(ValueError, match=r"rows must lie in \[0, 11\)"):
        ssu.rows()
    ssu.record(np.array([2, 4]))
    np.testing.assert_array_equal(ssu.rows(), [2, 4])
