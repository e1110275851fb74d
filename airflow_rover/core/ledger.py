"""Which batches' gradients a parameter server has applied: exactly-once at batch granularity.

Every push carries the key of the batch it came from (``core.shards.BatchKeys``). A PS applies a
push only if its ledger does not hold the key yet, so a batch retrained after a failure (its
worker died after some PS got its push) changes each PS at most once. The ledger is saved and
restored with the PS's rows, so a restored PS and its ledger describe the same point in training,
and the master rebuilds its shard queue from the ledgers of all PS.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

import numpy as np

NO_KEY = -1  # a push that carries no batch (tests, tools): always applied, never recorded


_LOG_START = 1024


class BatchLedger:
    """Applied batch keys of one PS, with how often each was offered (offers > 1: a retry).

    Beside the set (membership), the keys ``admit`` records go to an append-only int64 log, so
    a snapshot takes them as one array copy (``applied_keys``) instead of walking a set of a
    million keys while pushes wait. Keys are never removed from ``applied``; a key added to it
    directly (a restore, a hand-over) is noticed by the count and the log rebuilt once."""

    def __init__(self) -> None:
        self.applied: set[int] = set()
        self.rejected: collections.Counter[int] = collections.Counter()
        self._log = np.empty(_LOG_START, dtype=np.int64)
        self._logged = 0
        self._log_of = self.applied  # the set the log lists

    def admit(self, key: int) -> bool:
        """True if a push for ``key`` must be applied now (and records it as applied)."""
        if key == NO_KEY:
            return True
        if key in self.applied:
            self.rejected[key] += 1
            return False
        self.applied.add(key)
        if self._log_of is self.applied and self._logged == len(self.applied) - 1:
            if self._logged == self._log.size:
                self._log = np.concatenate([self._log, np.empty_like(self._log)])
            self._log[self._logged] = key
            self._logged += 1
        return True

    def applied_keys(self) -> np.ndarray:
        """The applied keys as int64, in no particular order: a view of the log whose entries
        never change afterwards (admits append past it, growth and rebuilds copy), so it may
        be read after the lock that orders admits is released."""
        if self._log_of is not self.applied or self._logged != len(self.applied):
            self._relog(np.fromiter(self.applied, np.int64, len(self.applied)))
        return self._log[: self._logged]

    def _relog(self, keys: np.ndarray) -> None:
        self._log = np.empty(max(2 * keys.size, _LOG_START), dtype=np.int64)
        self._log[: keys.size] = keys
        self._logged = keys.size
        self._log_of = self.applied

    def missing(self, keys: Iterable[int]) -> list[int]:
        return [k for k in keys if k not in self.applied]

    def to_arrays(self) -> dict[str, np.ndarray]:
        rejected = sorted(self.rejected.items())
        return {
            "ledger/applied": np.sort(self.applied_keys()),
            "ledger/rejected_keys": np.array([k for k, _ in rejected], dtype=np.int64),
            "ledger/rejected_counts": np.array([n for _, n in rejected], dtype=np.int64),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> BatchLedger:
        ledger = cls()
        applied = np.asarray(arrays.get("ledger/applied", np.empty(0, np.int64)), np.int64)
        ledger.applied = set(applied.reshape(-1).tolist())
        ledger._relog(applied.reshape(-1))  # duplicates: the count differs, rebuilt when used
        keys = arrays.get("ledger/rejected_keys", np.empty(0, np.int64))
        counts = arrays.get("ledger/rejected_counts", np.empty(0, np.int64))
        ledger.rejected = collections.Counter(
            {int(k): int(n) for k, n in zip(keys, counts, strict=True)}
        )
        return ledger


def batch_accounting(expected: set[int], ledgers: list[tuple[set[int], int]]) -> dict[str, int]:
    """``expected`` batch keys against what each PS applied (``(applied keys, retried pushes it
    turned away)`` per PS): a batch is trained once when every PS applied it."""
    everywhere = set.intersection(*(applied for applied, _ in ledgers))
    anywhere = set.union(*(applied for applied, _ in ledgers))
    return {
        "expected": len(expected),
        "trained_once": len(expected & everywhere),
        "never_trained": len(expected - anywhere),
        "partially_trained": len((expected & anywhere) - everywhere),
        "retried_pushes_turned_away": sum(rejected for _, rejected in ledgers),
    }
