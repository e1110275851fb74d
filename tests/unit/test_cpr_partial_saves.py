"""CPR partial saves on a real parameter server: MFU writes the most-accessed rows and clears
their counters, SSU its bounded sample; a PS restored from a checkpoint takes the fresher rows of
the partial saves after it (a damaged one is skipped)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from test_ps import ADAGRAD, LAYOUT, SEED

from airflow_rover.core.checkpoint_files import write_npz
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.policies.cpr import apply_partial_saves
from airflow_rover.ps import server
from airflow_rover.ps.server import ParameterServer

GROUP = "dim4"


def text(value: str) -> np.ndarray:
    return np.frombuffer(value.encode(), dtype=np.uint8)


def trained_ps() -> ParameterServer:
    """One PS whose rows 0..99 were pulled: row i (i < 10) 20 times more than the others."""
    ps = ParameterServer(0, 1, LAYOUT, ADAGRAD, SEED)
    everything = np.arange(100, dtype=np.int64)
    ps.pull({f"ids/{GROUP}": everything})
    for _ in range(20):
        ps.pull({f"ids/{GROUP}": np.arange(10, dtype=np.int64)})
    ps.push({f"ids/{GROUP}": everything, f"grad/{GROUP}": np.ones((100, 4), np.float32)})
    return ps


def partial_save(ps: ParameterServer, path: Path, variant: str, r: float) -> dict:
    req = {"path": text(str(path)), "mode": text("partial"), "variant": text(variant)}
    reply = ps.save({**req, "r": np.array([r])})
    with np.load(path) as saved:
        return {"rows": int(reply["rows"][0]), **dict(saved)}


def test_mfu_saves_the_most_accessed_rows_and_clears_their_counters(tmp_path: Path) -> None:
    ps = trained_ps()
    saved = partial_save(ps, tmp_path / "p1" / "ps-0.npz", "mfu", 0.1)
    ids = np.sort(saved[f"table/{GROUP}/ids"])
    np.testing.assert_array_equal(ids, np.arange(10))  # the 10% most accessed
    assert saved["rows"] == 10 and (saved[f"table/{GROUP}/counts"] == 21).all()
    table = ps.tables[GROUP]
    slots = table.index.lookup(np.arange(10))
    assert (table.counts[slots] == 0).all()  # cleared: the next save ranks fresh accesses
    again = partial_save(ps, tmp_path / "p2" / "ps-0.npz", "mfu", 0.1)
    assert not set(again[f"table/{GROUP}/ids"]) & set(range(10))


def test_ssu_saves_its_bounded_sample(tmp_path: Path) -> None:
    ps = ParameterServer(0, 1, LAYOUT, ADAGRAD, SEED)
    for table in ps.tables.values():
        table.enable_ssu(r=0.1, sample_period=1, seed=3)
    for _ in range(5):
        ps.pull({f"ids/{GROUP}": np.arange(200, dtype=np.int64)})
    saved = partial_save(ps, tmp_path / "p" / "ps-0.npz", "ssu", 0.1)
    assert 0 < saved["rows"] <= 20  # at most r * rows
    table = ps.tables[GROUP]
    assert not table.counts[: table.size].any()  # taken: the next save samples what follows
    with pytest.raises(ValueError, match="without SSU sampling"):
        partial_save(ParameterServer(0, 1, LAYOUT, ADAGRAD, SEED), tmp_path / "x.npz", "ssu", 0.1)
    with pytest.raises(ValueError, match="accepted: mfu, ssu"):
        partial_save(ps, tmp_path / "y.npz", "lru", 0.1)


def test_a_restored_ps_takes_the_partial_saves_after_its_checkpoint(tmp_path: Path) -> None:
    layout = JobDir(tmp_path / "job")
    ps = trained_ps()
    checkpoint = layout.checkpoint_dir(3)
    write_npz(checkpoint / "ps-0.npz", ps.snapshot().items())
    ps.push({f"ids/{GROUP}": np.arange(10), f"grad/{GROUP}": np.ones((10, 4), np.float32)})
    partial_save(ps, layout.partial_dir(3, 1) / "ps-0.npz", "mfu", 0.1)
    damaged = layout.partial_dir(3, 2) / "ps-0.npz"
    partial_save(ps, damaged, "mfu", 0.1)
    damaged.write_bytes(damaged.read_bytes()[:-10])  # truncated: skipped
    fresh = ps.tables[GROUP].lookup(np.arange(100), create=False)

    restored = ParameterServer(0, 1, LAYOUT, ADAGRAD, SEED)
    with np.load(checkpoint / "ps-0.npz") as saved:
        restored.restore(dict(saved))
    stale = restored.tables[GROUP].lookup(np.arange(100), create=False)
    assert not np.array_equal(stale[:10], fresh[:10])
    apply_partial_saves(restored, layout, checkpoint, "ps-0")
    now = restored.tables[GROUP].lookup(np.arange(100), create=False)
    np.testing.assert_array_equal(now[:10], fresh[:10])  # the most used: as they were
    np.testing.assert_array_equal(now[10:], stale[10:])  # the rest: as in the checkpoint


def test_a_partial_save_file_holds_only_the_selected_rows(tmp_path: Path) -> None:
    """Its bytes scale with the rows it holds: r of the rows, about r of a full save's
    bytes (every row's id, values, optimizer state and counters, nothing else)."""
    ps = ParameterServer(0, 1, LAYOUT, ADAGRAD, SEED)
    for start in range(0, 1200, 100):  # 1200 rows, the first 300 pulled 3 times
        for _ in range(3 if start < 300 else 1):
            ps.pull({f"ids/{GROUP}": np.arange(start, start + 100)})
    full = write_npz(tmp_path / "full.npz", ps.snapshot().items()).bytes
    path = tmp_path / "p" / "ps-0.npz"
    rows = ps.partial_save(path, "mfu", 0.125)
    assert rows == math.ceil(0.125 * 1200)
    with np.load(path) as saved:
        ids = saved[f"table/{GROUP}/ids"]
        assert ids.size == rows and set(ids) <= set(range(300))  # the most pulled only
        assert all(v.shape[0] == rows for k, v in saved.items() if k.startswith(f"table/{GROUP}/"))
    size = path.stat().st_size
    print(f"partial save: {rows}/1200 rows, {size:,} of a full save's {full:,} bytes")
    assert size <= 0.125 * full + 4096  # + the zip headers of its 18 arrays


def test_a_partial_save_is_made_durable_off_the_request(tmp_path: Path) -> None:
    """The reply does not wait for the fsyncs: they run on the PS's sync thread, in order."""
    ps = trained_ps()
    path = tmp_path / "p" / "ps-0.npz"
    ps.partial_save(path, "mfu", 0.1)
    assert path.exists()
    server.partial_saves_synced()  # the sync before it is done
    with np.load(path) as saved:
        assert saved[f"table/{GROUP}/ids"].size == 10


def test_ssu_draws_from_the_access_counters_at_save_time() -> None:
    """SSU adds nothing to a pull: its partial save draws, from the rows accessed since the
    last one, at most ceil(r*N), frequent rows more often, and clears the counters."""
    ps = ParameterServer(0, 1, LAYOUT, ADAGRAD, SEED)
    table = ps.tables[GROUP]
    table.enable_ssu(r=0.1, sample_period=2, seed=3)
    for _ in range(8):  # rows 0-99 pulled 8 times, 100-999 once
        ps.pull({f"ids/{GROUP}": np.arange(100, dtype=np.int64)})
    ps.pull({f"ids/{GROUP}": np.arange(100, 1000, dtype=np.int64)})
    part = table.partial_rows("ssu", 0.1)
    ids = part["ids"]
    assert ids.size == 100 and np.unique(ids).size == 100  # the list is full: ceil(0.1 * 1000)
    assert np.count_nonzero(ids < 100) > 30  # a tenth of the rows, a third of the list or more
    assert not table.counts[: table.size].any()  # the next save samples the accesses after it
    assert table.partial_rows("ssu", 0.1)["ids"].size == 0  # nothing accessed since
