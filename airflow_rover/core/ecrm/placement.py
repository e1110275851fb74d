"""Where ECRM puts parity: which group each ``(table, id)`` is in and which PS holds the
group's parity (rotating, like RAID-5)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import numpy as np

from airflow_rover.core.hashing import partition_of

PartitionFn = Callable[[str, np.ndarray, int], np.ndarray]


@dataclass(frozen=True)
class _TablePlacement:
    owner: np.ndarray  # (vocab,) PS of each id
    local: np.ndarray  # (vocab,) rank of the id among its PS's ids
    by_ps: tuple[np.ndarray, ...]  # ids each PS owns, ascending


# By partition_of, per (table, vocab, num_ps): shared by every ParityPlacement of the process
_SHARED: dict[tuple[str, int, int], _TablePlacement] = {}
_SHARED_LOCK = threading.Lock()  # one computation per key, the others wait for it


class ParityPlacement:
    """Which group each ``(table, id)`` is in and where the group's parity lives.

    Built from the same ``partition_of`` the PS use, over each table's whole id range
    (``vocab_sizes``; rows need not exist yet), lazily per table: about 10 bytes per id
    (1.2 s for 4 M ids on one core, mostly ``partition_of``). Placements by ``partition_of``
    are shared by every ``ParityPlacement`` of the process: a replacement PS computes them
    while it starts (``warm``), not when its rebuild is asked for.

    A ``positional`` table (raw 64-bit ids, ``EmbeddingTable(index="ids")``) has no id range to
    lay out: its rows are numbered by their position on their PS instead, as *keys*
    ``position * num_ps + owner`` (``position_keys``), and every formula above reads ``local``
    as the position. Its groups exist before their rows do and have no last level
    (``num_slots`` is 0: a store's slots grow as rows appear); only the owner knows which id
    a position holds (``core.ecrm.row_keys``).
    """

    def __init__(
        self,
        num_ps: int,
        k: int,
        vocab_sizes: Mapping[str, int],
        partition: PartitionFn = partition_of,
        positional: Collection[str] = (),
    ) -> None:
        if k < 1:
            raise ValueError(f"ecrm.k={k!r}: must be >= 1")
        if num_ps < k + 1:
            raise ValueError(
                f"ecrm.k={k}: needs at least k+1={k + 1} parameter servers, the job has {num_ps}"
            )
        for table, vocab in vocab_sizes.items():
            if vocab < 1:
                raise ValueError(f"table {table!r}: vocab size must be >= 1, got {vocab}")
        unknown = sorted(set(positional) - set(vocab_sizes))
        if unknown:
            raise ValueError(f"positional tables {unknown} are not among the tables")
        self.num_ps = num_ps
        self.k = k
        self.vocab_sizes = dict(vocab_sizes)
        self.positional = frozenset(positional)
        self._partition = partition
        self._cache: dict[str, _TablePlacement] = {}

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(self.vocab_sizes)

    def warm(self) -> None:
        """Compute every table's placement now."""
        for table in self.vocab_sizes:
            if table not in self.positional:
                self._placement(table)

    def position_keys(self, ps: int, positions: np.ndarray) -> np.ndarray:
        """The keys of rows ``positions`` on PS ``ps`` of a positional table."""
        return np.asarray(positions, dtype=np.int64) * self.num_ps + ps

    def key_positions(self, keys: np.ndarray) -> np.ndarray:
        """The positions on their owner of a positional table's ``keys``."""
        return np.asarray(keys, dtype=np.int64) // self.num_ps

    def _placement(self, table: str) -> _TablePlacement:
        got = self._cache.get(table)
        if got is not None:
            return got
        if table not in self.vocab_sizes:
            raise KeyError(f"unknown table {table!r}")
        if self._partition is not partition_of:
            got = self._compute(table)
        else:
            key = (table, self.vocab_sizes[table], self.num_ps)
            with _SHARED_LOCK:
                got = _SHARED.get(key)
                if got is None:
                    got = _SHARED[key] = self._compute(table)
        self._cache[table] = got
        return got

    def _compute(self, table: str) -> _TablePlacement:
        vocab = self.vocab_sizes[table]
        idx = np.int32 if vocab < 2**31 else np.int64
        owner = self._partition(table, np.arange(vocab, dtype=np.int64), self.num_ps)
        owner = owner.astype(np.int16 if self.num_ps < 2**15 else np.int32)
        order = np.argsort(owner, kind="stable").astype(idx)  # by PS, ids ascending within
        counts = np.bincount(owner, minlength=self.num_ps)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        local = np.empty(vocab, dtype=idx)
        local[order] = np.arange(vocab, dtype=idx) - np.repeat(starts, counts).astype(idx)
        bounds = np.cumsum(counts)[:-1]
        return _TablePlacement(owner, local, tuple(np.split(order, bounds)))

    def _ids(self, table: str, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(f"table {table!r}: ids must be a 1-D integer array")
        vocab = self.vocab_sizes.get(table)
        if vocab is None:
            raise KeyError(f"unknown table {table!r}")
        if table in self.positional:
            if ids.size and ids.min() < 0:
                raise ValueError(f"table {table!r}: row keys must be >= 0")
        elif ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise ValueError(f"table {table!r}: ids must lie in [0, {vocab})")
        return ids.astype(np.int64, copy=False)

    def owner(self, table: str, ids: np.ndarray) -> np.ndarray:
        """The PS holding each row (what ``partition_of`` says; a positional key says it)."""
        ids = self._ids(table, ids)
        if table in self.positional:
            return ids % self.num_ps
        return self._placement(table).owner[ids].astype(np.int64)

    def ids_on(self, table: str, ps: int) -> np.ndarray:
        """Every id of ``table`` that PS ``ps`` owns, ascending."""
        if table in self.positional:
            raise ValueError(
                f"table {table!r} is numbered by position: which keys a PS has depends on its rows"
            )
        return self._placement(table).by_ps[ps].astype(np.int64)

    def parity_location(self, table: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(holder PS, parity slot on it) of each row's group."""
        ids = self._ids(table, ids)
        if table in self.positional:
            local, owner = np.divmod(ids, self.num_ps)
        else:
            place = self._placement(table)
            local = place.local[ids].astype(np.int64)
            owner = place.owner[ids].astype(np.int64)
        start = (owner - local % self.k) % self.num_ps
        return (start + self.k) % self.num_ps, local // self.k

    def members(self, table: str, holder: int, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(PS, id) of the k members of each parity slot on ``holder``: two (m, k) arrays,
        id -1 where a PS has no row at that level (the last group of a table may be short).
        A positional table's members are keys, all present (a row not created yet reads as
        zeros)."""
        slots = np.asarray(slots, dtype=np.int64)
        start = (holder - self.k) % self.num_ps
        ps = (start + np.arange(self.k)) % self.num_ps
        if table in self.positional:
            if table not in self.vocab_sizes:
                raise KeyError(f"unknown table {table!r}")
            local = slots[:, None] * self.k + np.arange(self.k)
            return np.broadcast_to(ps, local.shape).copy(), local * self.num_ps + ps
        place = self._placement(table)
        ids = np.full((slots.size, self.k), -1, dtype=np.int64)
        for i in range(self.k):
            local = slots * self.k + i
            mine = place.by_ps[ps[i]]
            ok = local < mine.size
            ids[ok, i] = mine[local[ok]]
        return np.broadcast_to(ps, ids.shape).copy(), ids

    def num_slots(self, table: str, holder: int) -> int:
        """Parity slots ``holder`` has for ``table`` (levels of its groups); 0 for a
        positional table, whose slots appear as its rows do."""
        if table in self.positional:
            return 0
        place = self._placement(table)
        start = (holder - self.k) % self.num_ps
        levels = [
            -(-(place.by_ps[(start + i) % self.num_ps].size - i) // self.k) for i in range(self.k)
        ]
        return max(0, *levels)

    def holders_of(self, ps: int) -> tuple[int, ...]:
        """The PS holding parity of ``ps``'s rows: the k after it."""
        return tuple((ps + d) % self.num_ps for d in range(1, self.k + 1))

    def sources_of(self, holder: int) -> tuple[int, ...]:
        """The PS whose rows ``holder`` holds parity of: the k before it."""
        return tuple((holder - d) % self.num_ps for d in range(self.k, 0, -1))
