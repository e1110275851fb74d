"""BatchLedger: which batch keys a PS applied, so a retried batch changes each PS at most once."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from airflow_rover.core.ledger import NO_KEY, BatchLedger


def test_first_offer_is_admitted_and_retries_are_turned_away() -> None:
    """A key is applied once; every later offer of it is counted as a rejected retry."""
    ledger = BatchLedger()
    assert ledger.admit(3)
    assert ledger.admit(4)
    assert not ledger.admit(3)
    assert not ledger.admit(3)
    assert not ledger.admit(4)
    assert ledger.applied == {3, 4}
    assert dict(ledger.rejected) == {3: 2, 4: 1}


def test_key_zero_is_a_real_key() -> None:
    """Key 0 (the first batch of shard 0) is recorded like any other, not treated as 'no key'."""
    ledger = BatchLedger()
    assert ledger.admit(0)
    assert not ledger.admit(0)
    assert ledger.applied == {0}


def test_no_key_is_always_applied_and_never_recorded() -> None:
    """Pushes without a batch (tools, tests) bypass the ledger: applied every time."""
    ledger = BatchLedger()
    assert all(ledger.admit(NO_KEY) for _ in range(3))
    assert ledger.applied == set()
    assert not ledger.rejected


def test_missing_lists_keys_not_applied_in_the_given_order() -> None:
    """missing() is what a master asks to find where a shard resumes."""
    ledger = BatchLedger()
    for key in (10, 11, 13):
        ledger.admit(key)
    assert ledger.missing(range(10, 16)) == [12, 14, 15]
    assert ledger.missing([13, 11, 10]) == []


def test_arrays_round_trip() -> None:
    """to_arrays / from_arrays restore applied keys and retry counts exactly, as int64."""
    ledger = BatchLedger()
    for key in (7, 2, 2**40, 2, 7, 7):
        ledger.admit(key)
    arrays = ledger.to_arrays()
    assert set(arrays) == {"ledger/applied", "ledger/rejected_keys", "ledger/rejected_counts"}
    assert all(a.dtype == np.int64 for a in arrays.values())
    assert arrays["ledger/applied"].tolist() == [2, 7, 2**40]  # sorted

    copy = BatchLedger.from_arrays(arrays)
    assert copy.applied == ledger.applied
    assert copy.rejected == ledger.rejected
    assert not copy.admit(7)  # the copy turns the same retries away
    assert copy.admit(8)


def test_round_trip_through_an_npz_file(tmp_path: Path) -> None:
    """The arrays survive np.savez / np.load (how a PS checkpoint stores them)."""
    ledger = BatchLedger()
    for key in (1, 5, 5):
        ledger.admit(key)
    np.savez(tmp_path / "ps-0.npz", **ledger.to_arrays())
    with np.load(tmp_path / "ps-0.npz") as npz:
        copy = BatchLedger.from_arrays(dict(npz))
    assert copy.applied == {1, 5}
    assert dict(copy.rejected) == {5: 1}


def test_empty_ledger_round_trips_and_missing_arrays_mean_empty() -> None:
    """An empty ledger, or a checkpoint written before ledgers existed, loads as empty."""
    empty = BatchLedger.from_arrays(BatchLedger().to_arrays())
    assert empty.applied == set() and not empty.rejected
    legacy = BatchLedger.from_arrays({"table/dim4/ids": np.arange(3)})
    assert legacy.applied == set() and not legacy.rejected
    assert legacy.admit(0)


def test_applied_keys_lists_every_applied_key_however_it_was_added() -> None:
    """The log a snapshot copies holds the set's keys once each: admitted ones (retries
    not repeated), keys added to the set directly (a hand-over), and restored ones."""
    ledger = BatchLedger()
    for key in (9, 3, 9, 2**40, NO_KEY, 3):
        ledger.admit(key)
    assert ledger.applied_keys().tolist() == [9, 3, 2**40]  # in admit order, unsorted
    ledger.applied.update({100, 101})
    ledger.admit(5)
    assert sorted(ledger.applied_keys().tolist()) == sorted(ledger.applied)
    ledger.applied = ledger.applied & {3, 5}
    assert sorted(ledger.applied_keys().tolist()) == [3, 5]
    restored = BatchLedger.from_arrays({"ledger/applied": np.array([4, 1, 4], np.int64)})
    assert sorted(restored.applied_keys().tolist()) == [1, 4]
    assert restored.admit(2) and sorted(restored.applied_keys().tolist()) == [1, 2, 4]
    assert restored.applied_keys().dtype == np.int64


def test_a_view_of_the_applied_keys_never_changes_afterwards() -> None:
    """A snapshot takes the view under the apply lock and copies it after the lock is
    released: later admits (also ones that grow the log) and rebuilds leave it as it was."""
    ledger = BatchLedger()
    for key in range(10):
        ledger.admit(key)
    view = ledger.applied_keys()
    kept = view.copy()
    for key in range(10, 5000):  # grows the log past its first size, more than once
        ledger.admit(key)
    ledger.applied.add(-7)  # a direct add: the next applied_keys rebuilds the log
    assert ledger.applied_keys().size == 5001
    np.testing.assert_array_equal(view, kept)
