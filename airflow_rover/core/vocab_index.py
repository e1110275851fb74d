"""The hashed-vocabulary index: ids already hashed into ``[0, vocab_size)``, one int32 per
possible id giving its row (the fastest exact map for a small vocabulary, fully vectorised;
4 bytes per possible id, which ``core.id_index.IdIndex`` avoids for raw ids)."""

from __future__ import annotations

import numpy as np

from airflow_rover.core.growable import Growable
from airflow_rover.core.id_probe import EMPTY, PROBE


class VocabIndex:
    """Ids in ``[0, vocab_size)`` to rows (``core.id_index.RowIndex``)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.size = 0
        self._slot = np.full(vocab_size, EMPTY, dtype=np.int32)
        self._keys = Growable(np.int64)

    @property
    def keys(self) -> np.ndarray:
        return self._keys.array[: self.size]

    def check(self, lo: int, hi: int) -> str | None:
        if lo < 0 or hi >= self.vocab_size:
            return f"ids must lie in [0, {self.vocab_size}), got [{lo}, {hi}]"
        return None

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        return self._slot[ids]

    def insert(self, ids: np.ndarray) -> np.ndarray:
        rows = self._slot[ids]
        missing = rows < 0
        if missing.any():
            _, first = np.unique(ids[missing], return_index=True)
            new = ids[missing][np.sort(first)]
            start, end = self.size, self.size + new.size
            self._keys.ensure(end)
            self._keys.array[start:end] = new
            self._slot[new] = np.arange(start, end, dtype=np.int32)
            self.size = end
            rows = self._slot[ids]
        return rows

    def pull(
        self, ids: np.ndarray, src: np.ndarray, out: np.ndarray, meta: np.ndarray, day: int
    ) -> tuple[np.ndarray, int]:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        rows = np.empty(ids.size, dtype=np.int32)
        return rows, PROBE.pull_direct(self._slot, ids, rows, src, out, meta, day)

    def reset(self, keys: np.ndarray) -> None:
        keys = np.array(keys, dtype=np.int64)  # a copy: it may be a view of ``self.keys``
        self._slot[self.keys] = EMPTY
        self._keys.release(0)
        self._keys.ensure(keys.size)
        self._keys.array[: keys.size] = keys
        self.size = int(keys.size)
        self._slot[self.keys] = np.arange(self.size, dtype=np.int32)

    def nbytes(self) -> int:
        return int(self._slot.nbytes + self.size * 8)
