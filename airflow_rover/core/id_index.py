"""Where each id's row is: the two ways a table maps ids to row positions.

``IdIndex`` keys rows by raw 64-bit ids, collisionless: an open-addressing hash index (linear
probing, a power-of-two count of 4-byte slots, at most ``MAX_LOAD`` full) sized to the rows
held, growing by rehash. ``VocabIndex`` (``core.vocab_index``) is the hashed-vocabulary map.
Both keep the ids in row order (``keys``), give new ids the next rows, and answer -1 for an id
without a row; the hot loops are ``core.id_probe``'s.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from airflow_rover.core.growable import Growable
from airflow_rover.core.id_probe import EMPTY, PROBE, Probe

MAX_LOAD = 0.7
MIN_SLOTS = 1024
MAX_ROWS = 2**31 - 2  # rows are int32 in the slots


class RowIndex(Protocol):
    """What ``ps.tables.EmbeddingTable`` needs of an index."""

    size: int

    @property
    def keys(self) -> np.ndarray:
        """The ids of rows ``0 .. size-1`` in row order (a view, valid until the next change)."""
        ...

    def check(self, lo: int, hi: int) -> str | None:
        """Why ids from ``lo`` to ``hi`` (their least and greatest) cannot be held, or None."""
        ...

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """int32 rows of ``ids``, -1 where an id has none."""
        ...

    def insert(self, ids: np.ndarray) -> np.ndarray:
        """int32 rows of ``ids``; those without one take the next rows, in order."""
        ...

    def pull(
        self, ids: np.ndarray, src: np.ndarray, out: np.ndarray, meta: np.ndarray, day: int
    ) -> tuple[np.ndarray, int]:
        """``lookup``, and for each id with a row: ``out[i] = src[row]`` and an access
        counted in ``meta`` (``id_probe.META``); returns the rows and how many ids had none."""
        ...

    def reset(self, keys: np.ndarray) -> None:
        """Hold exactly the distinct ``keys``, as rows 0, 1, ..."""
        ...

    def nbytes(self) -> int:
        """Memory the index holds, its copy of the ids included."""
        ...


def slots_for(rows: int) -> int:
    """The power-of-two slot count that holds ``rows`` at most ``MAX_LOAD`` full."""
    need = max(MIN_SLOTS, int(np.ceil(rows / MAX_LOAD)))
    return 1 << (need - 1).bit_length()


class IdIndex:
    """Raw int64 ids to rows, collisionless; ``probe`` picks the loops (tests compare both)."""

    def __init__(self, probe: Probe = PROBE) -> None:
        self.probe = probe
        self.size = 0
        self._keys = Growable(np.int64)
        self._slots = np.full(MIN_SLOTS, EMPTY, dtype=np.int32)

    @property
    def keys(self) -> np.ndarray:
        return self._keys.array[: self.size]

    @property
    def capacity(self) -> int:
        """Slots in the hash index."""
        return int(self._slots.size)

    def check(self, lo: int, hi: int) -> str | None:
        return None  # every int64 has a row of its own

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        ids = _int64(ids)
        out = np.empty(ids.size, dtype=np.int32)
        self.probe.find(self._slots, self._slots.size - 1, self._keys.array, ids, out)
        return out

    def insert(self, ids: np.ndarray) -> np.ndarray:
        ids = _int64(ids)
        out = np.empty(ids.size, dtype=np.int32)
        mask = self._slots.size - 1
        absent = self.probe.find(self._slots, mask, self._keys.array, ids, out)
        if absent:
            self._room(self.size + absent)
            missing = out == EMPTY
            new = np.empty(absent, dtype=np.int32)
            self.size = self.probe.insert(
                self._slots, self._slots.size - 1, self._keys.array, ids[missing], new, self.size
            )
            out[missing] = new
        return out

    def pull(
        self, ids: np.ndarray, src: np.ndarray, out: np.ndarray, meta: np.ndarray, day: int
    ) -> tuple[np.ndarray, int]:
        ids = _int64(ids)
        rows = np.empty(ids.size, dtype=np.int32)
        mask = self._slots.size - 1
        keys = self._keys.array
        absent = self.probe.pull(self._slots, mask, keys, ids, rows, src, out, meta, day)
        return rows, absent

    def reset(self, keys: np.ndarray) -> None:
        keys = np.array(_int64(keys))  # a copy: ``keys`` may be a view of this index's own
        self.size = 0
        self._slots = np.full(slots_for(keys.size), EMPTY, dtype=np.int32)
        self._keys.release(0)
        self._keys.ensure(keys.size)
        self._keys.array[: keys.size] = keys
        self.size = keys.size
        self.probe.rebuild(self._slots, self._slots.size - 1, self.keys)

    def nbytes(self) -> int:
        return int(self._slots.nbytes + self.size * 8)

    def _room(self, rows: int) -> None:
        """Slots and key rows for ``rows`` rows: a larger index is rebuilt from the keys."""
        if rows > MAX_ROWS:
            raise ValueError(f"an id index holds at most {MAX_ROWS} rows, asked for {rows}")
        self._keys.ensure(rows)
        slots = slots_for(rows)
        if slots > self._slots.size:
            self._slots = np.empty(slots, dtype=np.int32)
            self.probe.rebuild(self._slots, slots - 1, self.keys)


def _int64(ids: np.ndarray) -> np.ndarray:
    """``ids`` as contiguous int64 (uint64 ids keep their 64 bits, read as signed)."""
    if ids.dtype == np.uint64:
        ids = ids.view(np.int64)
    return np.ascontiguousarray(ids, dtype=np.int64)
