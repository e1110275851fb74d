"""CPR: PLS accounting against a simulated failure process, MFU/SSU row selection, saves."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from airflow_rover.core.cpr import (
    CprSaveSchedule,
    MfuTracker,
    PlsTracker,
    SsuSampler,
    SsuTracker,
    latest_rows,
    simulate_overhead,
    simulate_pls,
    top_rows,
)
from airflow_rover.core.policies import expected_pls, full_overhead, partial_overhead


def test_pls_tracker_follows_eq3_by_hand():
    """Each failure adds (S_i - S_last)/(S_total*N_emb); a share f of the rows adds f*(...)."""
    pls = PlsTracker(total_samples=1000, num_emb_ps=4)
    assert pls.failure(100) == pytest.approx(100 / 4000)
    pls.checkpoint(200)
    assert pls.failure(300) == pytest.approx(100 / 4000)
    assert pls.failure(350, num_failed=2) == pytest.approx(2 * 150 / 4000)
    assert pls.failure(400, lost_fraction=0.125) == pytest.approx(0.125 * 200 / 1000)
    assert pls.pls == pytest.approx(0.025 + 0.025 + 0.075 + 0.025)
    assert pls.failures == 4 and pls.events[-1].pls == pytest.approx(pls.pls)
    assert pls.to_dict()["failures"] == 4
    with pytest.raises(ValueError, match="before the last checkpoint"):
        pls.failure(100)
    with pytest.raises(ValueError, match="before the last one"):
        pls.checkpoint(150)
    with pytest.raises(ValueError, match=r"num_failed=5: must be in \[1, 4\]"):
        pls.failure(500, num_failed=5)
    with pytest.raises(ValueError, match="lost_fraction"):
        pls.failure(500, lost_fraction=0.0)


@pytest.mark.parametrize(
    ("mtbf", "interval", "num_emb_ps"),
    [(10.0, 5.0, 1), (10.0, 2.0, 4), (3.0, 6.0, 8), (50.0, 25.0, 16)],
)
def test_expected_pls_formula_matches_simulated_failures_within_10_percent(
    mtbf, interval, num_emb_ps
):
    """CPR eq. 4 against exponential failures and periodic saves (>= 5,000 failures each)."""
    total = interval * round(600 * mtbf / interval)  # a whole number of save intervals
    runs = max(10, int(6000 / (total / mtbf)))
    sim = simulate_pls(
        mtbf_s=mtbf, interval_s=interval, total_s=total, num_emb_ps=num_emb_ps, runs=runs, seed=7
    )
    assert sim.failures >= 5000
    assert sim.expected == pytest.approx(expected_pls(interval, mtbf, num_emb_ps))
    assert sim.measured == pytest.approx(sim.expected, rel=0.10)


def test_pls_of_the_tracker_and_the_simulator_agree():
    """The tracker fed with one simulated run's events gives that run's PLS."""
    rng = np.random.default_rng(1)
    total, interval, n = 10_000, 250, 4
    fails = np.sort(rng.uniform(0, total, size=40))
    tracker = PlsTracker(total, n)
    saves = iter(range(interval, total, interval))
    next_save = next(saves)
    for t in fails:
        while next_save <= t:
            tracker.checkpoint(next_save)
            next_save = next(saves, total + 1)
        tracker.failure(int(t))
    want = sum(int(t) - (int(t) // interval) * interval for t in fails) / (total * n)
    assert tracker.pls == pytest.approx(want)


@pytest.mark.parametrize("recovery", ["full", "partial"])
def test_overhead_formulas_match_an_event_simulation(recovery):
    """Eq. 1 (full) and eq. 2 (partial) against a job simulated event by event."""
    mtbf, interval, save, load, res = 3600.0, 600.0, 6.0, 30.0, 10.0
    sim = simulate_overhead(
        recovery=recovery,
        mtbf_s=mtbf,
        interval_s=interval,
        total_s=3000 * mtbf,
        save_s=save,
        load_s=load,
        reschedule_s=res,
        num_emb_ps=4,
        seed=3,
    )
    model = (full_overhead if recovery == "full" else partial_overhead)(
        save, load, mtbf, interval, res
    )
    assert sim.total == pytest.approx(model.total, rel=0.10)
    assert sim.save == pytest.approx(model.save, rel=0.01)
    if recovery == "full":
        assert sim.lost == pytest.approx(model.lost, rel=0.10) and sim.pls == 0
    else:
        assert sim.lost == 0
        assert sim.pls == pytest.approx(expected_pls(interval, mtbf, 4), rel=0.10)


def _reference_top(counts, n):
    order = np.lexsort((np.arange(counts.size), -counts.astype(np.int64)))
    top = order[:n]
    return np.sort(top[counts[top] > 0])


def test_top_rows_picks_exactly_the_most_accessed_rows():
    """Exactly the n largest counters, ties to the lower index, zero counters never."""
    rng = np.random.default_rng(0)
    for trial in range(200):
        size = int(rng.integers(1, 400))
        counts = rng.integers(0, 1 + int(rng.integers(1, 8)), size=size).astype(np.uint32)
        n = int(rng.integers(0, size + 3))
        got = top_rows(counts, n)
        np.testing.assert_array_equal(got, _reference_top(counts, n), err_msg=f"trial {trial}")
    assert top_rows(np.zeros(5, np.uint32), 3).size == 0


def test_top_rows_ranks_counters_past_the_histogram():
    """Counters at or above the histogram's last bin (and up to 2**32-1) rank exactly too."""
    rng = np.random.default_rng(1)
    for trial in range(100):
        size = int(rng.integers(1, 300))
        small = rng.integers(0, 5000, size=size)
        large = rng.integers(4090, 2**32, size=size, dtype=np.uint64)
        counts = np.where(rng.random(size) < 0.5, small, large).astype(np.uint32)
        counts[rng.random(size) < 0.2] = 4095  # ties at the histogram's edge
        n = int(rng.integers(0, size + 3))
        got = top_rows(counts, n)
        np.testing.assert_array_equal(got, _reference_top(counts, n), err_msg=f"trial {trial}")


def test_mfu_counts_saves_the_top_share_and_clears_it():
    mfu = MfuTracker(num_rows=10, r=0.3)
    assert mfu.save_size == 3
    mfu.record(np.array([1, 1, 1, 2, 2, 7, 7, 7, 7, 9]))
    mfu.record(np.array([2]))
    np.testing.assert_array_equal(mfu.counts[[1, 2, 7, 9]], [3, 3, 4, 1])
    np.testing.assert_array_equal(mfu.take(), [1, 2, 7])
    np.testing.assert_array_equal(mfu.counts[[1, 2, 7, 9]], [0, 0, 0, 1])
    np.testing.assert_array_equal(mfu.select(), [9])
    mfu.grow(20)  # rows created since start at 0 accesses
    assert mfu.num_rows == 20 and mfu.counts[10:].sum() == 0 and mfu.save_size == 6
    mfu.record(np.array([19, 19]))
    np.testing.assert_array_equal(mfu.select(), [9, 19])
    with pytest.raises(ValueError, match=r"rows must lie in \[0, 20\)"):
        mfu.record(np.array([20]))
    with pytest.raises(ValueError, match=r"r=0: must be in \(0, 1\]"):
        MfuTracker(10, r=0)


def test_trackers_accept_any_integer_dtype():
    for dtype in (np.int32, np.uint32, np.int64, np.uint64):
        mfu, ssu = MfuTracker(4), SsuTracker(4, r=1.0, sample_period=1)
        for rows in (np.array([3, 1, 3], dtype=dtype), np.arange(4, dtype=dtype)[:1]):
            mfu.record(rows)
            ssu.record(rows)
        np.testing.assert_array_equal(mfu.counts, [1, 1, 0, 2])
        np.testing.assert_array_equal(ssu.rows(), [0, 1, 3])


def test_mfu_counter_saturates_instead_of_wrapping():
    mfu = MfuTracker(3)
    mfu.counts[0] = np.iinfo(np.uint32).max - 1
    mfu.record(np.array([0, 0, 0, 1]))
    assert mfu.counts[0] == np.iinfo(np.uint32).max and mfu.counts[1] == 1


def test_mfu_and_ssu_handle_millions_of_accesses_fast():
    """10 M skewed accesses over 2 M rows, in one batch and in 4096-row batches."""
    rng = np.random.default_rng(5)
    rows = 2_000_000
    accesses = (rows * rng.random(10_000_000) ** 4).astype(np.int64)  # a hot head
    mfu, ssu = MfuTracker(rows), SsuTracker(rows, seed=1)
    start = time.perf_counter()
    mfu.record(accesses)
    picked = mfu.take()
    ssu.record(accesses)
    for i in range(200):
        chunk = accesses[i * 4096 : (i + 1) * 4096]
        mfu.record(chunk)
        ssu.record(chunk)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, elapsed
    expect = np.bincount(accesses, minlength=rows)
    np.testing.assert_array_equal(picked, _reference_top(expect, mfu.save_size))
    assert len(ssu) <= ssu.capacity == 250_000


def test_ssu_list_never_exceeds_its_bound_and_holds_distinct_rows():
    rng = np.random.default_rng(2)
    ssu = SsuTracker(num_rows=1000, r=0.05, sample_period=2, seed=9)
    assert ssu.capacity == 50
    for step in range(500):
        if step % 100 == 99:
            ssu.grow(ssu.num_rows + 500)
        size = int(rng.integers(0, 400))
        ssu.record(rng.integers(0, ssu.num_rows, size=size))
        listed = ssu.rows()
        assert len(ssu) <= ssu.capacity
        assert np.unique(listed).size == listed.size and (np.diff(listed) > 0).all()
    assert ssu.evicted > 0
    taken = ssu.take()
    assert taken.size <= ssu.capacity and len(ssu) == 0


def test_ssu_rows_taken_or_evicted_can_be_listed_again():
    """The membership flags follow the list: a row leaves with ``take`` or an eviction and
    comes back on its next sampled access."""
    ssu = SsuTracker(num_rows=100, r=0.1, sample_period=1, seed=0)
    ssu.record(np.arange(100), assume_unique=True)  # 90 of 100 evicted
    kept = ssu.rows()
    assert kept.size == 10 and ssu.evicted == 90
    gone = np.setdiff1d(np.arange(100), kept)[:5]
    ssu.take()
    ssu.record(gone, assume_unique=True)
    np.testing.assert_array_equal(ssu.rows(), gone)
    ssu.record(np.concatenate([gone, kept[:5]]))  # listed ones are not listed twice
    np.testing.assert_array_equal(ssu.rows(), np.sort(np.concatenate([gone, kept[:5]])))


def test_ssu_keeps_frequent_rows_more_often():
    """Sub-sampling plus random eviction acts as a high-pass filter (CPR section 4.2)."""
    rng = np.random.default_rng(4)
    hot, cold = np.arange(20), np.arange(20, 10_000)
    kept_hot = kept_cold = 0
    for trial in range(20):
        ssu = SsuTracker(num_rows=10_000, r=0.01, sample_period=2, seed=trial)
        for _ in range(50):
            batch = np.concatenate([np.repeat(hot, 5), rng.choice(cold, 200)])
            ssu.record(rng.permutation(batch))
        listed = ssu.rows()
        kept_hot += np.isin(hot, listed).sum()
        kept_cold += np.isin(cold, listed).sum()
    assert kept_hot / (20 * hot.size) > 5 * kept_cold / (20 * cold.size)


def test_the_ssu_sampler_keeps_what_the_tracker_keeps_from_the_counters():
    """Drawn at save time from the access counters, SSU keeps the hot rows as the tracker fed
    on every pull does (the high-pass filter), within its capacity, seeded."""
    rng = np.random.default_rng(4)
    hot, cold = np.arange(20), np.arange(20, 10_000)
    kept: dict[str, list[int]] = {"tracker": [0, 0], "sampler": [0, 0]}
    for trial in range(20):
        tracker = SsuTracker(num_rows=10_000, r=0.01, sample_period=2, seed=trial)
        counts = np.zeros(10_000, dtype=np.uint32)
        for _ in range(50):
            batch = np.unique(np.concatenate([np.repeat(hot, 5), rng.choice(cold, 200)]))
            tracker.record(batch, assume_unique=True)
            counts[batch] += 1  # what a table's pulls count (unique rows per pull)
        sampled = SsuSampler(r=0.01, sample_period=2, seed=trial).take(counts)
        assert sampled.size <= 100 and np.unique(sampled).size == sampled.size
        for name, listed in (("tracker", tracker.rows()), ("sampler", sampled)):
            kept[name][0] += int(np.isin(hot, listed).sum())
            kept[name][1] += int(np.isin(cold, listed).sum())
    for hot_kept, cold_kept in kept.values():
        assert hot_kept / (20 * hot.size) > 5 * cold_kept / (20 * cold.size)
    assert kept["sampler"][0] >= 0.9 * kept["tracker"][0]
    counts = rng.integers(0, 3, size=500).astype(np.uint32)
    np.testing.assert_array_equal(
        SsuSampler(0.1, 2, 7).take(counts), SsuSampler(0.1, 2, 7).take(counts)
    )
    everything = SsuSampler(r=1.0, sample_period=1).take(counts)
    np.testing.assert_array_equal(everything, np.flatnonzero(counts))
    with pytest.raises(ValueError, match="sample_period"):
        SsuSampler(0.1, 0)


def test_ssu_is_seeded_and_keeps_everything_under_capacity():
    a, b = SsuTracker(100, r=0.5, seed=3), SsuTracker(100, r=0.5, seed=3)
    data = np.random.default_rng(0).integers(0, 100, size=500)
    a.record(data)
    b.record(data)
    np.testing.assert_array_equal(a.rows(), b.rows())
    full = SsuTracker(100, r=1.0, sample_period=1)
    full.record(np.array([5, 3, 5, 99]))
    np.testing.assert_array_equal(full.rows(), [3, 5, 99])
    with pytest.raises(ValueError, match="sample_period"):
        SsuTracker(10, sample_period=0)


def test_save_schedule_vanilla_and_partial_cycles():
    vanilla = CprSaveSchedule(100.0, "vanilla")
    assert vanilla.due(99.0) is None
    due = vanilla.due(100.0)
    assert due is not None and due.kind == "full" and due.cycle_start and due.skipped == 0
    assert vanilla.due(150.0) is None and vanilla.next_due_s == 200.0
    late = vanilla.due(420.0)  # 200, 300 and 400 passed: one save, two counted as skipped
    assert late is not None and late.skipped == 2 and vanilla.next_due_s == 500.0

    mfu = CprSaveSchedule(80.0, "mfu", r=0.25)  # a partial save every 20 s, 4 per cycle
    kinds = [mfu.due(t) for t in range(0, 161, 20)]
    got = [(d.kind, d.cycle_start) for d in kinds if d is not None]
    assert got == [("partial", False)] * 3 + [("partial", True)] + [("partial", False)] * 3 + [
        ("partial", True)
    ]
    skip = CprSaveSchedule(80.0, "ssu", r=0.25)
    jump = skip.due(90.0)  # passed 20, 40, 60 and 80 (a cycle end)
    assert jump is not None and jump.cycle_start and jump.skipped == 3
    with pytest.raises(ValueError, match="interval_s"):
        CprSaveSchedule(0.0)


def test_save_schedule_saves_once_per_grid_point_despite_float_rounding():
    # 293 * 0.00555 reaches the 5th point of a 0.32523 s grid, but divides to 4.999...: the
    # schedule saved at step 293 and again at 294 (44 saves where 40 were due).
    step_s = 0.00555
    schedule = CprSaveSchedule(468.8 * step_s, "mfu", r=0.125)
    due = [step for step in range(2344) if schedule.due(step * step_s) is not None]
    assert len(due) == 39  # grid points 58.6, 117.2, ... below step 2344
    assert min(b - a for a, b in itertools.pairwise(due)) >= 58
    cycle = CprSaveSchedule(8 * 0.1, "ssu", r=0.125)
    saves = [d for t in range(1, 33) if (d := cycle.due(t * 0.1)) is not None]
    assert len(saves) == 32 and [d.cycle_start for d in saves].count(True) == 4
    assert all(d.skipped == 0 for d in saves)


def test_latest_rows_merges_partial_saves_newest_first():
    saves = [
        (np.array([3, 1]), {"row": np.array([[30.0], [10.0]])}),
        (np.array([2, 3]), {"row": np.array([[20.0], [31.0]])}),
        (np.array([3]), {"row": np.array([[32.0]])}),
    ]
    ids, fields = latest_rows(saves)
    np.testing.assert_array_equal(ids, [1, 2, 3])
    np.testing.assert_array_equal(fields["row"].ravel(), [10.0, 20.0, 32.0])
    assert latest_rows([])[0].size == 0
    with pytest.raises(ValueError, match="same fields"):
        latest_rows([saves[0], (np.array([1]), {"other": np.zeros((1, 1))})])


@pytest.mark.parametrize("id_range", ["vocabulary", "raw 64-bit"])
def test_latest_rows_matches_a_dict_merge_of_random_chains(id_range: str):
    rng = np.random.default_rng(11)
    pool = (
        np.arange(500)
        if id_range == "vocabulary"  # flagged per id
        else rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 500)  # by np.unique
    )
    for _ in range(20):
        saves, newest = [], {}
        for _ in range(int(rng.integers(1, 8))):
            ids = rng.choice(pool, size=int(rng.integers(0, 60)), replace=False)
            rows = rng.random((ids.size, 3))
            saves.append((ids, {"row": rows, "count": ids * 2}))
            newest.update({int(i): r for i, r in zip(ids, rows, strict=True)})
        ids, fields = latest_rows(saves)
        np.testing.assert_array_equal(ids, sorted(newest))
        np.testing.assert_array_equal(fields["row"], [newest[i] for i in sorted(newest)])
        np.testing.assert_array_equal(fields["count"], ids * 2)
        any_order, unsorted = latest_rows(saves, ascending=False)  # what a restore takes
        assert sorted(any_order.tolist()) == sorted(newest)
        np.testing.assert_array_equal(unsorted["row"], [newest[int(i)] for i in any_order])
        np.testing.assert_array_equal(unsorted["count"], any_order * 2)


def test_simulators_reject_bad_input():
    with pytest.raises(ValueError):
        simulate_pls(mtbf_s=0.0, interval_s=1.0, total_s=1.0, num_emb_ps=1)
    with pytest.raises(ValueError, match="accepted: full, partial"):
        simulate_overhead(
            recovery="none",  # type: ignore[arg-type]
            mtbf_s=1.0,
            interval_s=1.0,
            total_s=1.0,
            save_s=0.0,
            load_s=0.0,
        )
