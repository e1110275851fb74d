"""ECRM erasure coding of embedding rows: placement, parity codecs, difference propagation,
decoding and the chunked rebuild, as pure numpy a PS (and the master) can drive.

ECRM paper section 3; formulas and pictures in ``docs/checkpoint-policies.md``.

**Placement** (``ParityPlacement``). Rows already live on PS ``owner = partition_of(table, id, n)``.
Number each PS's ids of a table in ascending order: ``j`` = local index. Row ``(table, id)``
with local index ``j`` on PS ``p`` has position ``i = j % k`` and level ``l = j // k`` in the
group ``(table, a, l)`` with ``a = (p - i) % n``: the members are the rows of local index
``l*k + i`` on PS ``(a + i) % n`` for ``i < k`` (k distinct PS), and the parity lives on PS
``(a + k) % n`` in its parity slot ``l`` for that table. So PS ``h`` holds the parity of the
groups of the ``k`` PS before it, one per level, and the parity of a PS's rows rotates over the
``k`` PS after it in equal shares (RAID-5 when ``n = k + 1``); each PS holds about
``rows/(n*k)`` parity rows per table. ``k + 1 <= n`` is required. The layout depends on ``n``:
after a PS resize the parity is encoded again (``plan_encode``).

**Parity** of a group is the sum of its members' fields (the row and every optimizer-state
array), in one of two codecs. ``SumCodec`` (ECRM's summation code) keeps float64 parity: after
``u`` differences the decode error is below ``2**-52 * (u + k) * max|member|``, so the float32
result is the exact value whenever ``|row| > 2**-28 * (u + k) * max|member|``; a read racing
an update is off by that update only; inf/nan would poison the parity. ``XorCodec`` XORs the
bit patterns (RAID-5's code, a sum over GF(2)): bit-exact whatever the history or the values,
parity as wide as the row, but a read racing an update decodes to garbage, so degraded reads
must be drained first. A member row not created yet counts with its seeded initial value, so
a parity row is materialised lazily from the members' initial values.

**Normal operation.** Each PS keeps a ``ParityStore`` (the parity it holds), a
``DifferencePropagator`` (after applying an update it turns the ``old``/``new`` fields into one
``ParityDelta`` per parity holder, sent in order on one channel per holder; the holder
``apply``-s it exactly once) and an ``UpdateBuffer`` (updates held back while rows are locked).

**A PS is lost** (new incarnation ``e``). The master: (1) fences the dead incarnation at the
PS holding its parity (``ParityStore.fence(lost, e)`` at each of ``layout.holders_of(lost)``:
its differences still in flight are dropped, so its rows decode to the last update a holder
acknowledged, a state asynchronous training could have reached, ECRM appendix A); (2) starts
the replacement with ``epoch=e`` and a ``RebuildPlan``, locks every ``plan.data_ids`` in the
replacement's buffer and marks its ``plan.parity_slots`` stale (deltas to them are dropped
until re-encoded: they would be overwritten anyway); (3) has each of
``layout.sources_of(lost)`` call ``reset_holder(lost, e)``; (4) drives the plan::

    while (chunk := plan.next_chunk()) is not None:
        for ps in chunk.lock_ps: buffers[ps].lock(chunk.table, chunk.locks[ps])
        plan.locks_installed({ps: propagator[ps].sent() for ps in chunk.lock_ps})
        while not plan.drained({h: stores[h].applied() for h in chunk.holders}): wait()
        members = {ps: read(ps, chunk.table, ids) for ps, ids in chunk.member_ids.items()}
        if chunk.kind == "decode":  # the lost PS's rows -> write them on the replacement
            parity = {h: stores[h].read(chunk.table, s) for h, (_, s) in chunk.parity.items()}
            rows = chunk.decode(codec, parity, members, dtypes)
        else:  # the parity the lost PS held
            stores[lost].write(chunk.table, chunk.slots, chunk.encode(codec, members, dtypes))
        plan.chunk_written()
        for ps in chunk.lock_ps: apply buffers[ps].release(chunk.table, chunk.locks[ps])

(``read`` of a row a PS has not created returns its initial value, like
``EmbeddingTable.lookup(create=False)``; ``sent()`` must be read after that PS's lock is in.)
Training goes on meanwhile: rows outside the locked chunk are updated as usual; updates to a
lost row wait in the replacement's buffer until its chunk is written (``plan.status``); a read
of a lost row not rebuilt yet is a degraded read (``plan_decode``).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar, Literal

import numpy as np

from airflow_rover.core.hashing import partition_of

Fields = dict[str, np.ndarray]  # per-row arrays (first axis: rows): "row", "state/accum", ...
RowUpdate = tuple[np.ndarray, Mapping[str, np.ndarray], Mapping[str, np.ndarray]]  # ids, old, new
InitialFn = Callable[[str, np.ndarray], Mapping[str, np.ndarray]]  # (table, ids) -> fields
PartitionFn = Callable[[str, np.ndarray, int], np.ndarray]


# ----------------------------------------------------------------------------- codecs


class ParityCodec(ABC):
    """A sum in some group: ``lift`` maps values into it, ``add``/``sub`` combine in place,
    ``lower`` maps a decoded sum back to the values' dtype."""

    name: ClassVar[str]

    @abstractmethod
    def parity_dtype(self, dtype: np.dtype) -> np.dtype: ...

    @abstractmethod
    def lift(self, values: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def add(self, acc: np.ndarray, index: np.ndarray | slice, lifted: np.ndarray) -> None: ...

    @abstractmethod
    def sub(self, acc: np.ndarray, index: np.ndarray | slice, lifted: np.ndarray) -> None: ...

    @abstractmethod
    def lower(self, parity: np.ndarray, dtype: np.dtype) -> np.ndarray: ...

    def difference(self, new: np.ndarray, old: np.ndarray) -> np.ndarray:
        """What a holder adds to move a parity from ``old`` to ``new`` (difference propagation,
        ECRM section 3.3.2): exact with XOR; in float64, exact for any two float32 values less
        than 2**29 apart in magnitude."""
        delta = np.array(self.lift(new), copy=True)
        self.sub(delta, slice(None), self.lift(old))
        return delta


class SumCodec(ParityCodec):
    """ECRM's summation code, accumulated in float64."""

    name: ClassVar[str] = "sum"

    def parity_dtype(self, dtype: np.dtype) -> np.dtype:
        if np.dtype(dtype).kind != "f":
            raise TypeError(f"the sum codec encodes floating-point fields, got {dtype}")
        return np.dtype(np.float64)

    def lift(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)

    def add(self, acc: np.ndarray, index: np.ndarray | slice, lifted: np.ndarray) -> None:
        acc[index] += lifted

    def sub(self, acc: np.ndarray, index: np.ndarray | slice, lifted: np.ndarray) -> None:
        acc[index] -= lifted

    def lower(self, parity: np.ndarray, dtype: np.dtype) -> np.ndarray:
        return parity.astype(dtype)


class XorCodec(ParityCodec):
    """XOR of the bit patterns (RAID-5's code): exact, order-free, as wide as the values."""

    name: ClassVar[str] = "xor"
    _UINT: ClassVar[dict[int, type[np.unsignedinteger]]] = {
        1: np.uint8,
        2: np.uint16,
        4: np.uint32,
        8: np.uint64,
    }

    def parity_dtype(self, dtype: np.dtype) -> np.dtype:
        size = np.dtype(dtype).itemsize
        if size not in self._UINT:
            raise TypeError(f"the xor codec needs 1, 2, 4 or 8-byte fields, got {dtype}")
        return np.dtype(self._UINT[size])

    def lift(self, values: np.ndarray) -> np.ndarray:
        values = np.ascontiguousarray(values)
        return values.view(self.parity_dtype(values.dtype))

    def add(self, acc: np.ndarray, index: np.ndarray | slice, lifted: np.ndarray) -> None:
        acc[index] ^= lifted

    sub = add  # XOR is its own inverse

    def lower(self, parity: np.ndarray, dtype: np.dtype) -> np.ndarray:
        return np.ascontiguousarray(parity).view(dtype).copy()


CODECS: dict[str, type[ParityCodec]] = {"sum": SumCodec, "xor": XorCodec}


def make_codec(name: str) -> ParityCodec:
    if name not in CODECS:
        raise ValueError(f"ecrm.codec={name!r}; accepted: {', '.join(CODECS)}")
    return CODECS[name]()


def field_dtypes(fields: Mapping[str, np.ndarray]) -> dict[str, np.dtype]:
    return {name: np.asarray(value).dtype for name, value in fields.items()}


# ----------------------------------------------------------------------------- placement


@dataclass(frozen=True)
class _Placement:
    owner: np.ndarray  # (vocab,) PS of each id
    local: np.ndarray  # (vocab,) rank of the id among its PS's ids
    by_ps: tuple[np.ndarray, ...]  # ids each PS owns, ascending


_SHARED: dict[tuple[str, int, int], _Placement] = {}  # (table, vocab, num_ps): by partition_of
_SHARED_LOCK = threading.Lock()  # one computation per key, the others wait for it


class ParityPlacement:
    """Which group each ``(table, id)`` is in and where the group's parity lives.

    Built from the same ``partition_of`` the PS use, over each table's whole id range
    (``vocab_sizes``; rows need not exist yet), lazily per table: about 10 bytes per id
    (1.2 s for 4 M ids on one core, mostly ``partition_of``). Placements by ``partition_of``
    are shared by every layout of the process: a replacement PS computes them while it starts
    (``warm``), not when its rebuild is asked for.
    """

    def __init__(
        self,
        num_ps: int,
        k: int,
        vocab_sizes: Mapping[str, int],
        partition: PartitionFn = partition_of,
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
        self.num_ps = num_ps
        self.k = k
        self.vocab_sizes = dict(vocab_sizes)
        self._partition = partition
        self._cache: dict[str, _Placement] = {}

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(self.vocab_sizes)

    def warm(self) -> None:
        """Compute every table's placement now."""
        for table in self.vocab_sizes:
            self._placement(table)

    def _placement(self, table: str) -> _Placement:
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

    def _compute(self, table: str) -> _Placement:
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
        return _Placement(owner, local, tuple(np.split(order, bounds)))

    def _ids(self, table: str, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(f"table {table!r}: ids must be a 1-D integer array")
        vocab = self.vocab_sizes.get(table)
        if vocab is None:
            raise KeyError(f"unknown table {table!r}")
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise ValueError(f"table {table!r}: ids must lie in [0, {vocab})")
        return ids.astype(np.int64, copy=False)

    def owner(self, table: str, ids: np.ndarray) -> np.ndarray:
        """The PS holding each row (what ``partition_of`` says)."""
        return self._placement(table).owner[self._ids(table, ids)].astype(np.int64)

    def ids_on(self, table: str, ps: int) -> np.ndarray:
        """Every id of ``table`` that PS ``ps`` owns, ascending."""
        return self._placement(table).by_ps[ps].astype(np.int64)

    def parity_location(self, table: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(holder PS, parity slot on it) of each row's group."""
        place = self._placement(table)
        ids = self._ids(table, ids)
        local = place.local[ids].astype(np.int64)
        start = (place.owner[ids].astype(np.int64) - local % self.k) % self.num_ps
        return (start + self.k) % self.num_ps, local // self.k

    def members(self, table: str, holder: int, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(PS, id) of the k members of each parity slot on ``holder``: two (m, k) arrays,
        id -1 where a PS has no row at that level (the last group of a table may be short)."""
        place = self._placement(table)
        slots = np.asarray(slots, dtype=np.int64)
        start = (holder - self.k) % self.num_ps
        ps = (start + np.arange(self.k)) % self.num_ps
        ids = np.full((slots.size, self.k), -1, dtype=np.int64)
        for i in range(self.k):
            local = slots * self.k + i
            mine = place.by_ps[ps[i]]
            ok = local < mine.size
            ids[ok, i] = mine[local[ok]]
        return np.broadcast_to(ps, ids.shape).copy(), ids

    def num_slots(self, table: str, holder: int) -> int:
        """Parity slots ``holder`` has for ``table`` (levels of its groups)."""
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


def encode_members(
    codec: ParityCodec,
    member_ids: np.ndarray,
    values: Callable[[int, np.ndarray], Mapping[str, np.ndarray]],
    dtypes: Mapping[str, np.dtype],
    trailing: Mapping[str, tuple[int, ...]],
) -> Fields:
    """Parity of each row of ``member_ids`` ((m, k), -1 = no member): ``values(i, ids)`` gives
    the fields of the present members in column ``i``."""
    m = member_ids.shape[0]
    acc = {
        name: np.zeros((m, *trailing[name]), dtype=codec.parity_dtype(dt))
        for name, dt in dtypes.items()
    }
    for i in range(member_ids.shape[1]):
        present = np.flatnonzero(member_ids[:, i] >= 0)
        if present.size == 0:
            continue
        got = values(i, member_ids[present, i])
        for name in acc:
            codec.add(acc[name], present, codec.lift(got[name]))
    return acc


# ----------------------------------------------------------------------------- propagation


def _unique(ids: np.ndarray) -> bool:
    """Whether ``ids`` has no repeats; sorted input (a PS's pushes are) needs no sort."""
    if ids.size < 2 or bool(np.all(ids[1:] > ids[:-1])):
        return True
    return bool(np.unique(ids).size == ids.size)


def _present(ps: np.ndarray) -> np.ndarray:
    """The distinct PS indices in ``ps``, ascending: a count per PS, not a sort of the rows."""
    return np.flatnonzero(np.bincount(ps)) if ps.size else np.empty(0, dtype=np.int64)


def _sorted_inverse(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` for ids that are (almost always) unique
    already: one argsort, and the unique path only when there are repeats."""
    order = np.argsort(ids, kind="stable")
    uniq = ids[order]
    if uniq.size > 1 and not bool(np.all(uniq[1:] > uniq[:-1])):
        return np.unique(ids, return_inverse=True)
    inverse = np.empty(ids.size, dtype=np.int64)
    inverse[order] = np.arange(ids.size)
    return uniq, inverse


@dataclass(frozen=True)
class TableDelta:
    """Differences of updated rows of one table (parity domain), ids unique."""

    table: str
    ids: np.ndarray
    fields: Fields


@dataclass(frozen=True)
class ParityDelta:
    """One message on the channel ``source -> holder``: applied in ``seq`` order, exactly
    once. ``epoch``/``holder_epoch`` are the incarnations of sender and addressee: a
    message from a fenced (dead) sender or to a dead holder is dropped."""

    source: int
    epoch: int
    holder: int
    holder_epoch: int
    seq: int
    tables: tuple[TableDelta, ...]

    @property
    def rows(self) -> int:
        return sum(t.ids.size for t in self.tables)


class DifferencePropagator:
    """The sending half of difference propagation on one PS (ECRM section 3.3.2).

    After the PS applies an update it calls ``deltas({table: (ids, old, new)})`` with the
    fields before and after (rows and optimizer state) and sends each message to its holder
    on an ordered channel. Call it under the lock that applies pushes, and queue its messages
    before that lock is released: ``sent()`` (numbers handed out so far) is then a correct
    drain watermark when read under that lock right after a rebuild lock goes in.
    """

    def __init__(
        self, layout: ParityPlacement, ps_index: int, codec: ParityCodec, epoch: int = 0
    ) -> None:
        self.layout = layout
        self.ps_index = ps_index
        self.codec = codec
        self.epoch = epoch
        self._seq: dict[int, int] = dict.fromkeys(layout.holders_of(ps_index), 0)
        self._holder_epoch: dict[int, int] = dict.fromkeys(self._seq, 0)

    def sent(self) -> dict[int, int]:
        """Last sequence number sent to each holder."""
        return dict(self._seq)

    def reset_holder(self, holder: int, holder_epoch: int) -> None:
        """``holder`` was replaced (incarnation ``holder_epoch``): its channel starts over."""
        if holder not in self._seq:
            raise ValueError(f"PS {holder} holds no parity of PS {self.ps_index}")
        self._seq[holder] = 0
        self._holder_epoch[holder] = holder_epoch

    def deltas(self, updates: Mapping[str, RowUpdate]) -> list[ParityDelta]:
        """One message per holder for the rows just updated (``ids`` unique per table)."""
        by_holder: dict[int, list[TableDelta]] = {}
        for table, (ids, old, new) in updates.items():
            ids = np.asarray(ids, dtype=np.int64)
            if ids.size == 0:
                continue
            if not _unique(ids):
                raise ValueError(f"table {table!r}: updated ids must be unique")
            owner = self.layout.owner(table, ids)
            if (owner != self.ps_index).any():
                raise ValueError(f"table {table!r}: ids not owned by PS {self.ps_index}")
            holder, _ = self.layout.parity_location(table, ids)
            diff = {name: self.codec.difference(new[name], old[name]) for name in new}
            for h in _present(holder):
                pick = np.flatnonzero(holder == h)
                part = TableDelta(table, ids[pick], {n: d[pick] for n, d in diff.items()})
                by_holder.setdefault(int(h), []).append(part)
        out = []
        for h, parts in sorted(by_holder.items()):
            self._seq[h] += 1
            out.append(
                ParityDelta(
                    self.ps_index, self.epoch, h, self._holder_epoch[h], self._seq[h], tuple(parts)
                )
            )
        return out


# ----------------------------------------------------------------------------- parity store


@dataclass
class _ParityTable:
    slot_pos: np.ndarray  # (num_slots,) position in the arrays, -1 = not materialised
    stale: np.ndarray  # (num_slots,) bool: to be rebuilt, deltas dropped meanwhile
    arrays: dict[str, np.ndarray]
    size: int = 0


ApplyResult = Literal["applied", "duplicate", "fenced"]


class ParityStore:
    """The parity rows (and parity optimizer state) one PS holds, materialised on first use
    from its members' seeded initial values (``initial(table, ids)``), and the receiving half
    of difference propagation: per-source sequence numbers make delivery exactly-once and
    ``applied()`` is what a drain compares with the senders' ``sent()``. Not thread-safe: the
    PS calls it under one lock.

    After a PS restores rows from a checkpoint (or the PS count changes), lazily materialised
    parity would be wrong: mark every slot stale and re-encode it, e.g. with an encode-only
    ``RebuildPlan(layout, holder, rows_per_lock, data_ids={})`` per holder."""

    def __init__(
        self,
        layout: ParityPlacement,
        ps_index: int,
        codec: ParityCodec,
        initial: InitialFn,
        epoch: int = 0,
    ) -> None:
        self.layout = layout
        self.ps_index = ps_index
        self.codec = codec
        self.initial = initial
        self.epoch = epoch  # this holder's incarnation
        self._tables: dict[str, _ParityTable] = {}
        self._src_epoch: dict[int, int] = dict.fromkeys(layout.sources_of(ps_index), 0)
        self._applied: dict[int, int] = dict.fromkeys(self._src_epoch, 0)
        self.dropped = 0  # rows of deltas dropped (stale slots)
        self._specs: dict[str, tuple[dict[str, np.dtype], dict[str, tuple[int, ...]]]] = {}

    # -- bookkeeping

    def applied(self) -> dict[int, int]:
        """Last sequence number processed from each source (its current incarnation)."""
        return dict(self._applied)

    def source_epochs(self) -> dict[int, int]:
        """The incarnation of each source ``applied`` counts the messages of."""
        return dict(self._src_epoch)

    def fence(self, source: int, epoch: int) -> None:
        """``source`` is now incarnation ``epoch``: anything older is dropped from here on."""
        if source not in self._src_epoch:
            raise ValueError(f"PS {self.ps_index} holds no parity of PS {source}")
        if epoch > self._src_epoch[source]:
            self._src_epoch[source] = epoch
            self._applied[source] = 0

    def spec(self, table: str) -> tuple[dict[str, np.dtype], dict[str, tuple[int, ...]]]:
        """(dtype, trailing shape) of each field of ``table``, from ``initial``."""
        got = self._specs.get(table)
        if got is None:
            probe = self.initial(table, np.empty(0, dtype=np.int64))
            got = (
                {n: np.asarray(v).dtype for n, v in probe.items()},
                {n: tuple(np.asarray(v).shape[1:]) for n, v in probe.items()},
            )
            self._specs[table] = got
        return got

    def _table(self, table: str) -> _ParityTable:
        got = self._tables.get(table)
        if got is None:
            n = self.layout.num_slots(table, self.ps_index)
            dtypes, trailing = self.spec(table)
            arrays = {
                name: np.zeros((0, *trailing[name]), dtype=self.codec.parity_dtype(dt))
                for name, dt in dtypes.items()
            }
            got = _ParityTable(np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=bool), arrays)
            self._tables[table] = got
        return got

    def _check_slots(self, table: str, slots: np.ndarray) -> np.ndarray:
        slots = np.asarray(slots, dtype=np.int64)
        n = self._table(table).slot_pos.size
        if slots.size and (slots.min() < 0 or slots.max() >= n):
            raise ValueError(f"table {table!r}: parity slots must lie in [0, {n})")
        return slots

    def _initial_parity(self, table: str, slots: np.ndarray) -> Fields:
        _, ids = self.layout.members(table, self.ps_index, slots)
        dtypes, trailing = self.spec(table)
        return encode_members(
            self.codec, ids, lambda _i, got: self.initial(table, got), dtypes, trailing
        )

    def _allocate(self, table: str, slots: np.ndarray) -> np.ndarray:
        """Positions of ``slots`` (unique), giving new ones storage (zeros)."""
        t = self._table(table)
        missing = slots[t.slot_pos[slots] < 0]
        if missing.size:
            need = t.size + missing.size
            cap = next(iter(t.arrays.values())).shape[0] if t.arrays else 0
            if need > cap:
                new_cap = max(need, 2 * cap, 256)
                for name, arr in t.arrays.items():
                    grown = np.zeros((new_cap, *arr.shape[1:]), dtype=arr.dtype)
                    grown[: t.size] = arr[: t.size]
                    t.arrays[name] = grown
            t.slot_pos[missing] = np.arange(t.size, need)
            t.size = need
        return t.slot_pos[slots]

    def _materialise(self, table: str, slots: np.ndarray) -> np.ndarray:
        t = self._table(table)
        fresh = slots[t.slot_pos[slots] < 0]
        pos = self._allocate(table, slots)
        if fresh.size:
            init = self._initial_parity(table, fresh)
            where = t.slot_pos[fresh]
            for name, arr in t.arrays.items():
                arr[where] = init[name]
        return pos

    def materialised(self, table: str) -> np.ndarray:
        """Slots holding a parity row (a difference arrived, or it was written)."""
        return np.flatnonzero(self._table(table).slot_pos >= 0)

    # -- reads and writes

    def read(self, table: str, slots: np.ndarray) -> Fields:
        """Parity of ``slots`` (copies); slots never materialised are computed, not stored.
        A stale slot (being rebuilt) has no meaningful parity yet: reading one raises."""
        out, initial = self.read_stored(table, slots)
        self.fill_initial(table, slots, out, initial)
        return out

    def read_stored(self, table: str, slots: np.ndarray) -> tuple[Fields, np.ndarray]:
        """``read`` in two steps, so that a caller guarding the store with a lock can compute
        the parity of initial values (seeded rows of every member: the slow part) after it:
        the stored parity of ``slots``, and the mask of slots never materialised, whose rows
        ``fill_initial`` sets (they are the code of initial values as of this read)."""
        slots = self._check_slots(table, slots)
        t = self._table(table)
        if t.stale[slots].any():
            raise ValueError(f"table {table!r}: parity slots being rebuilt cannot be read")
        pos = t.slot_pos[slots]
        have = pos >= 0
        out = {
            name: np.empty((slots.size, *arr.shape[1:]), dtype=arr.dtype)
            for name, arr in t.arrays.items()
        }
        for name, arr in t.arrays.items():
            out[name][have] = arr[pos[have]]
        return out, ~have

    def fill_initial(self, table: str, slots: np.ndarray, out: Fields, initial: np.ndarray) -> None:
        """Set the rows of ``out`` that ``read_stored`` left to the code of initial values."""
        if initial.any():
            init = self._initial_parity(table, np.asarray(slots, dtype=np.int64)[initial])
            for name in out:
                out[name][initial] = init[name]

    def write(self, table: str, slots: np.ndarray, fields: Mapping[str, np.ndarray]) -> None:
        """Set the parity of ``slots`` (a rebuild re-encoded it); they are no longer stale."""
        slots = self._check_slots(table, slots)
        if not _unique(slots):
            raise ValueError(f"table {table!r}: parity slots must be unique")
        t = self._table(table)
        pos = self._allocate(table, slots)
        for name, arr in t.arrays.items():
            arr[pos] = fields[name]
        t.stale[slots] = False

    def mark_stale(self, table: str, slots: np.ndarray | None = None) -> None:
        """These slots (default: all) will be re-encoded: drop deltas for them meanwhile."""
        t = self._table(table)
        if slots is None:
            t.stale[:] = True
        else:
            t.stale[self._check_slots(table, slots)] = True

    def stale(self, table: str, slots: np.ndarray) -> np.ndarray:
        return self._table(table).stale[self._check_slots(table, slots)]

    # -- difference propagation

    def apply(self, delta: ParityDelta) -> ApplyResult:
        """Add one message's differences. Raises on a gap in the sequence (a message lost:
        this parity could no longer be trusted) or on rows this PS holds no parity of."""
        if delta.holder != self.ps_index:
            raise ValueError(f"delta for PS {delta.holder} delivered to PS {self.ps_index}")
        if delta.source not in self._src_epoch:
            raise ValueError(f"PS {self.ps_index} holds no parity of PS {delta.source}")
        if delta.holder_epoch != self.epoch or delta.epoch < self._src_epoch[delta.source]:
            return "fenced"
        if delta.epoch > self._src_epoch[delta.source]:  # a new incarnation speaks first
            self.fence(delta.source, delta.epoch)
        last = self._applied[delta.source]
        if delta.seq <= last:
            return "duplicate"
        if delta.seq != last + 1:
            raise ValueError(
                f"parity channel PS {delta.source} -> PS {self.ps_index}: got message "
                f"{delta.seq} after {last}; a difference was lost"
            )
        for part in delta.tables:
            self._apply_table(part)
        self._applied[delta.source] = delta.seq
        return "applied"

    def revert(self, delta: ParityDelta) -> None:
        """Take an applied message's differences out again: its source died before every
        holder had its batch, and the batch is to be trained again (``EcrmPeer.start_rebuild``
        keeps only the batches all holders saw)."""
        for part in delta.tables:
            self._apply_table(part, self.codec.sub)

    def _apply_table(self, part: TableDelta, op: Callable[..., None] | None = None) -> None:
        holder, slots = self.layout.parity_location(part.table, part.ids)
        if (holder != self.ps_index).any():
            raise ValueError(f"table {part.table!r}: rows whose parity is not on this PS")
        t = self._table(part.table)
        live = ~t.stale[slots]
        self.dropped += int(slots.size - live.sum())
        slots = slots[live]
        if slots.size == 0:
            return
        if not _unique(part.ids):  # unique ids of one source: one row per group at most
            raise ValueError(f"table {part.table!r}: two rows of one group in one delta")
        pos = self._materialise(part.table, slots)
        for name, arr in t.arrays.items():
            (op or self.codec.add)(arr, pos, part.fields[name][live])


# ----------------------------------------------------------------------------- decoding


def _gather_plan(
    member_ps: np.ndarray, member_ids: np.ndarray, skip: int | None
) -> tuple[dict[int, np.ndarray], dict[int, tuple[np.ndarray, np.ndarray]]]:
    """Per PS: the unique member ids to read, and (row in the plan, index into that read)."""
    reads: dict[int, np.ndarray] = {}
    gather: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    present = member_ids >= 0
    if skip is not None:
        present &= member_ps != skip
    rows, cols = np.nonzero(present)
    ps_of = member_ps[rows, cols]
    for ps in _present(ps_of):
        sel = ps_of == ps
        ids = member_ids[rows[sel], cols[sel]]
        uniq, inverse = _sorted_inverse(ids)  # a group has one member per PS: no repeats
        reads[int(ps)] = uniq
        gather[int(ps)] = (rows[sel], inverse)
    return reads, gather


def _blank(
    codec: ParityCodec, n: int, dtypes: Mapping[str, np.dtype], like: Mapping[str, np.ndarray]
) -> Fields:
    return {
        name: np.zeros((n, *np.asarray(like[name]).shape[1:]), dtype=codec.parity_dtype(dt))
        for name, dt in dtypes.items()
    }


@dataclass(frozen=True)
class DecodePlan:
    """How to rebuild rows of a lost PS: per holder, the parity slots to read; per surviving
    PS, the member rows to read; ``decode`` subtracts the members from the parity."""

    table: str
    lost_ps: int
    ids: np.ndarray
    parity: dict[int, tuple[np.ndarray, np.ndarray]]  # holder -> (rows of ids, slots)
    member_ids: dict[int, np.ndarray]  # surviving PS -> ids to read (unique, ascending)
    gather: dict[int, tuple[np.ndarray, np.ndarray]] = field(repr=False)

    def decode(
        self,
        codec: ParityCodec,
        parity: Mapping[int, Mapping[str, np.ndarray]],
        members: Mapping[int, Mapping[str, np.ndarray]],
        dtypes: Mapping[str, np.dtype],
    ) -> Fields:
        """``row = parity - sum(other members)`` for every field, in ``ids`` order.

        ``parity[h]`` are the fields ``ParityStore.read`` gave for ``self.parity[h]``'s slots;
        ``members[ps]`` the rows' fields read from ``ps`` for ``self.member_ids[ps]``.
        """
        if not self.parity:
            return {n: np.zeros((0,), dtype=dt) for n, dt in dtypes.items()}
        acc = _blank(codec, self.ids.size, dtypes, next(iter(parity.values())))
        for holder, (rows, _) in self.parity.items():
            for name in acc:
                acc[name][rows] = parity[holder][name]
        for ps, (rows, index) in self.gather.items():
            got = members[ps]
            for name in acc:
                codec.sub(acc[name], rows, codec.lift(np.asarray(got[name])[index]))
        return {name: codec.lower(acc[name], dtypes[name]) for name in acc}


def plan_decode(layout: ParityPlacement, table: str, lost_ps: int, ids: np.ndarray) -> DecodePlan:
    """What to read to decode rows ``ids`` (unique, all owned by ``lost_ps``): a degraded
    read, or one chunk of a rebuild."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (layout.owner(table, ids) != lost_ps).any():
        raise ValueError(f"table {table!r}: ids not owned by PS {lost_ps}")
    if not _unique(ids):
        raise ValueError(f"table {table!r}: ids must be unique")
    holder, slots = layout.parity_location(table, ids)
    parity: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    member_ps = np.empty((ids.size, layout.k), dtype=np.int64)
    member_ids = np.empty((ids.size, layout.k), dtype=np.int64)
    for h in _present(holder):
        rows = np.flatnonzero(holder == h)
        parity[int(h)] = (rows, slots[rows])
        mp, mi = layout.members(table, int(h), slots[rows])
        member_ps[rows], member_ids[rows] = mp, mi
    reads, gather = _gather_plan(member_ps, member_ids, skip=lost_ps)
    return DecodePlan(table, lost_ps, ids, parity, reads, gather)


def restrict(delta: ParityDelta, ids_by_table: Mapping[str, np.ndarray]) -> list[TableDelta]:
    """The parts of ``delta`` for rows in ``ids_by_table`` (per table, sorted unique): what of
    a message still in flight a degraded read needs (``catch_up``)."""
    out = []
    for part in delta.tables:
        wanted = ids_by_table.get(part.table)
        if wanted is None:
            continue
        keep = _member(wanted, part.ids)
        if keep.any():
            out.append(
                TableDelta(part.table, part.ids[keep], {n: f[keep] for n, f in part.fields.items()})
            )
    return out


def catch_up(
    layout: ParityPlacement,
    codec: ParityCodec,
    table: str,
    holder: int,
    slots: np.ndarray,
    parity: Mapping[str, np.ndarray],
    in_flight: Iterable[TableDelta],
) -> None:
    """Add to ``parity`` (fields of ``table``'s ``slots`` as ``ParityStore.read`` gave them at
    ``holder``) the differences it had not applied yet: its members' messages still in flight,
    one ``TableDelta`` per message (ids unique in each). The parity is then as of the members'
    reads, which is what a degraded read decodes against. Rows of other tables or of groups
    outside ``slots`` are ignored."""
    slots = np.asarray(slots, dtype=np.int64)
    if slots.size == 0:
        return
    order = np.argsort(slots, kind="stable")
    ordered = slots[order]
    for part in in_flight:
        if part.table != table:
            continue
        where, at = layout.parity_location(table, part.ids)
        pos = np.minimum(np.searchsorted(ordered, at), ordered.size - 1)
        hit = (where == holder) & (ordered[pos] == at)
        if not hit.any():
            continue
        index = order[pos[hit]]
        for name, arr in parity.items():
            codec.add(arr, index, np.asarray(part.fields[name])[hit])


@dataclass(frozen=True)
class EncodePlan:
    """How to re-encode parity slots of one holder from their (surviving) members."""

    table: str
    holder: int
    slots: np.ndarray
    member_ids: dict[int, np.ndarray]
    gather: dict[int, tuple[np.ndarray, np.ndarray]] = field(repr=False)

    def encode(
        self,
        codec: ParityCodec,
        members: Mapping[int, Mapping[str, np.ndarray]],
        dtypes: Mapping[str, np.dtype],
    ) -> Fields:
        if not members:
            raise ValueError("encode needs the members' fields (ids with no row read as initial)")
        like = next(iter(members.values()))
        acc = _blank(codec, self.slots.size, dtypes, like)
        for ps, (rows, index) in self.gather.items():
            got = members[ps]
            for name in acc:
                codec.add(acc[name], rows, codec.lift(np.asarray(got[name])[index]))
        return acc


def plan_encode(layout: ParityPlacement, table: str, holder: int, slots: np.ndarray) -> EncodePlan:
    """What to read to re-encode ``holder``'s parity ``slots`` (a lost holder's rebuild, or
    building parity after a restore)."""
    slots = np.asarray(slots, dtype=np.int64)
    member_ps, member_ids = layout.members(table, holder, slots)
    reads, gather = _gather_plan(member_ps, member_ids, skip=None)
    return EncodePlan(table, holder, slots, reads, gather)


# ----------------------------------------------------------------------------- rebuild


def rows_to_rebuild(
    layout: ParityPlacement, lost_ps: int, materialised: Mapping[int, Mapping[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """The lost PS's rows worth decoding: those in a group whose parity a holder materialised
    (``{holder: {table: store.materialised(table)}}`` from ``layout.holders_of(lost_ps)``).
    Every other row of the lost PS is still at its seeded initial value (no holder ever
    acknowledged an update of it), which the replacement re-creates by itself on first use."""
    out: dict[str, list[np.ndarray]] = {t: [] for t in layout.tables}
    owned = {t: layout.ids_on(t, lost_ps) for t in layout.tables}
    for holder, by_table in materialised.items():
        member = (lost_ps - (holder - layout.k)) % layout.num_ps  # its place in the groups
        if member >= layout.k:  # not one of lost_ps's holders
            continue
        for table, slots in by_table.items():
            mine = owned[table]
            local = np.asarray(slots, dtype=np.int64) * layout.k + member
            out[table].append(mine[local[local < mine.size]])
    return {
        # a row's group has one holder and one member per PS: no repeats, a sort suffices
        t: _sorted_unique(np.sort(np.concatenate(parts))) if parts else np.empty(0, np.int64)
        for t, parts in out.items()
    }


class RowStatus(IntEnum):
    PENDING = 0  # not rebuilt yet: reads decode, updates wait
    LOCKED = 1  # in the chunk being rebuilt
    DONE = 2  # rebuilt: served and updated as usual


@dataclass(frozen=True)
class RebuildChunk:
    """One lock's worth of a rebuild: decode lost rows, or re-encode lost parity slots.

    ``locks[ps]``: rows of ``table`` PS ``ps`` must hold updates of (``UpdateBuffer.lock``)
    while the chunk is locked; ``holders``: whose ``applied()`` the drain compares with the
    locked PS's ``sent()``.
    """

    index: int
    kind: Literal["decode", "encode"]
    table: str
    plan: DecodePlan | EncodePlan
    locks: dict[int, np.ndarray]
    holders: tuple[int, ...]

    @property
    def lock_ps(self) -> tuple[int, ...]:
        return tuple(sorted(self.locks))

    @property
    def member_ids(self) -> dict[int, np.ndarray]:
        return self.plan.member_ids

    @property
    def ids(self) -> np.ndarray:
        """The lost rows a decode chunk rebuilds (empty for an encode chunk)."""
        return self.plan.ids if isinstance(self.plan, DecodePlan) else np.empty(0, np.int64)

    @property
    def slots(self) -> np.ndarray:
        """The parity slots an encode chunk rebuilds (empty for a decode chunk)."""
        return self.plan.slots if isinstance(self.plan, EncodePlan) else np.empty(0, np.int64)

    @property
    def parity(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        return self.plan.parity if isinstance(self.plan, DecodePlan) else {}

    def decode(
        self,
        codec: ParityCodec,
        parity: Mapping[int, Mapping[str, np.ndarray]],
        members: Mapping[int, Mapping[str, np.ndarray]],
        dtypes: Mapping[str, np.dtype],
    ) -> Fields:
        if not isinstance(self.plan, DecodePlan):
            raise TypeError("an encode chunk has nothing to decode")
        return self.plan.decode(codec, parity, members, dtypes)

    def encode(
        self,
        codec: ParityCodec,
        members: Mapping[int, Mapping[str, np.ndarray]],
        dtypes: Mapping[str, np.dtype],
    ) -> Fields:
        if not isinstance(self.plan, EncodePlan):
            raise TypeError("a decode chunk has nothing to encode")
        return self.plan.encode(codec, members, dtypes)


Phase = Literal["idle", "locked", "draining", "writing", "done"]


class RebuildPlan:
    """The rebuild of a lost PS as a state machine, one chunk of ``rows_per_lock`` at a time
    (ECRM section 3.4): lost rows are decoded first (training needs them), then the parity
    the lost PS held is re-encoded (fault tolerance for the others).

    ``next_chunk`` (idle -> locked: install the chunk's locks), ``locks_installed(sent)``
    (locked -> draining, with each locked PS's ``sent()`` read after its lock went in),
    ``drained(applied)`` (draining -> writing once every holder has processed those
    messages: the parity now reflects exactly the rows the chunk will read), ``chunk_written``
    (writing -> idle: the rows are DONE, release the locks) ... ``done``.

    ``data_ids`` default to every id the lost PS owned, ``parity_slots`` to every slot it held;
    ``rows_to_rebuild`` narrows the ids to those a holder has parity for (the rest are still
    at their initial value, which the replacement re-creates by itself).
    """

    def __init__(
        self,
        layout: ParityPlacement,
        lost_ps: int,
        rows_per_lock: int,
        data_ids: Mapping[str, np.ndarray] | None = None,
        parity_slots: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        if not 0 <= lost_ps < layout.num_ps:
            raise ValueError(f"lost_ps={lost_ps!r}: must be in [0, {layout.num_ps})")
        if rows_per_lock < 1:
            raise ValueError(f"ecrm.rows_per_lock={rows_per_lock!r}: must be >= 1")
        self.layout = layout
        self.lost_ps = lost_ps
        self.rows_per_lock = rows_per_lock
        tables = layout.tables
        if data_ids is None:
            data_ids = {t: layout.ids_on(t, lost_ps) for t in tables}
        if parity_slots is None:
            parity_slots = {t: np.arange(layout.num_slots(t, lost_ps)) for t in tables}
        self._data = {t: _sorted_unique(v) for t, v in data_ids.items()}  # mostly sorted already
        self._slots = {t: _sorted_unique(v) for t, v in parity_slots.items()}
        for t, ids in self._data.items():
            if ids.size and (layout.owner(t, ids) != lost_ps).any():
                raise ValueError(f"table {t!r}: data_ids not owned by PS {lost_ps}")
        self._data_status = {t: np.zeros(v.size, dtype=np.int8) for t, v in self._data.items()}
        self._slot_status = {t: np.zeros(v.size, dtype=np.int8) for t, v in self._slots.items()}
        self._todo = self._chunk_bounds()
        self._next = 0
        self.phase: Phase = "idle" if self._todo else "done"
        self.current: RebuildChunk | None = None
        self._watermarks: dict[tuple[int, int], int] = {}

    def _chunk_bounds(self) -> list[tuple[Literal["decode", "encode"], str, int, int]]:
        out: list[tuple[Literal["decode", "encode"], str, int, int]] = []
        step = self.rows_per_lock
        for t, ids in self._data.items():
            out += [("decode", t, a, min(a + step, ids.size)) for a in range(0, ids.size, step)]
        for t, slots in self._slots.items():
            out += [("encode", t, a, min(a + step, slots.size)) for a in range(0, slots.size, step)]
        return out

    @property
    def chunks(self) -> int:
        return len(self._todo)

    @property
    def rows_total(self) -> int:
        return sum(v.size for v in self._data.values()) + sum(v.size for v in self._slots.values())

    @property
    def rows_done(self) -> int:
        done = int(RowStatus.DONE)
        return sum(int((s == done).sum()) for s in self._data_status.values()) + sum(
            int((s == done).sum()) for s in self._slot_status.values()
        )

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def data_ids(self, table: str) -> np.ndarray:
        """The lost rows of ``table`` this plan rebuilds (lock them all on the replacement)."""
        return self._data.get(table, np.empty(0, np.int64)).copy()

    def parity_slots(self, table: str) -> np.ndarray:
        """The parity slots of ``table`` this plan re-encodes (mark them stale on the
        replacement's ``ParityStore``)."""
        return self._slots.get(table, np.empty(0, np.int64)).copy()

    def status(self, table: str, ids: np.ndarray) -> np.ndarray:
        """RowStatus of lost rows ``ids``; rows the plan does not rebuild count as DONE."""
        return self._lookup(self._data, self._data_status, table, ids)

    def parity_status(self, table: str, slots: np.ndarray) -> np.ndarray:
        return self._lookup(self._slots, self._slot_status, table, slots)

    @staticmethod
    def _lookup(
        keys: Mapping[str, np.ndarray],
        status: Mapping[str, np.ndarray],
        table: str,
        ids: np.ndarray,
    ) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        out = np.full(ids.size, int(RowStatus.DONE), dtype=np.int8)
        have = keys.get(table)
        if have is None or have.size == 0:
            return out
        pos = np.minimum(np.searchsorted(have, ids), have.size - 1)
        hit = have[pos] == ids
        out[hit] = status[table][pos[hit]]
        return out

    def _expect(self, phase: Phase) -> None:
        if self.phase != phase:
            raise RuntimeError(f"rebuild is {self.phase}, not {phase}")

    def next_chunk(self) -> RebuildChunk | None:
        """Lock the next chunk (None when all are rebuilt)."""
        if self.phase == "done":
            return None
        self._expect("idle")
        kind, table, a, b = self._todo[self._next]
        plan: DecodePlan | EncodePlan
        if kind == "decode":
            dec = plan_decode(self.layout, table, self.lost_ps, self._data[table][a:b])
            self._data_status[table][a:b] = RowStatus.LOCKED
            holders = tuple(sorted(dec.parity))
            locks = {**dec.member_ids, self.lost_ps: dec.ids}
            plan = dec
        else:
            plan = plan_encode(self.layout, table, self.lost_ps, self._slots[table][a:b])
            self._slot_status[table][a:b] = RowStatus.LOCKED
            holders = (self.lost_ps,)
            locks = dict(plan.member_ids)
        self.current = RebuildChunk(self._next, kind, table, plan, locks, holders)
        self.phase = "locked"
        return self.current

    def locks_installed(self, sent: Mapping[int, Mapping[int, int]]) -> None:
        """Each locked PS's ``DifferencePropagator.sent()``, read after its lock went in: no
        difference for a locked row is sent after that, so these are the drain watermarks."""
        self._expect("locked")
        chunk = self.current
        assert chunk is not None
        marks: dict[tuple[int, int], int] = {}
        for ps in chunk.locks:
            if ps == self.lost_ps:
                continue  # the replacement has sent nothing about rows it does not have yet
            if ps not in sent:
                raise ValueError(f"no sent() counters from locked PS {ps}")
            for holder in chunk.holders:
                if holder in self.layout.holders_of(ps):
                    marks[(ps, holder)] = int(sent[ps].get(holder, 0))
        self._watermarks = marks
        self.phase = "draining"

    def drained(self, applied: Mapping[int, Mapping[int, int]]) -> bool:
        """True (and on to writing) once every holder of the chunk has processed every
        difference the locked PS had sent (``ParityStore.applied()`` per holder)."""
        if self.phase == "writing":
            return True
        self._expect("draining")
        for (ps, holder), mark in self._watermarks.items():
            if applied.get(holder, {}).get(ps, 0) < mark:
                return False
        self.phase = "writing"
        return True

    def chunk_written(self) -> RebuildChunk:
        """The chunk's rows (or parity) are written: they are DONE; release its locks."""
        self._expect("writing")
        kind, table, a, b = self._todo[self._next]
        status = self._data_status if kind == "decode" else self._slot_status
        status[table][a:b] = RowStatus.DONE
        chunk = self.current
        assert chunk is not None
        self.current = None
        self._next += 1
        self.phase = "idle" if self._next < len(self._todo) else "done"
        return chunk


# ----------------------------------------------------------------------------- buffering


def _sorted_unique(ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64).ravel()
    if ids.size < 2 or bool((ids[1:] > ids[:-1]).all()):
        return ids
    return np.unique(ids)


def _member(have: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Mask of ``ids`` found in the sorted array ``have``."""
    if have.size == 0:
        return np.zeros(ids.size, dtype=bool)
    pos = np.minimum(np.searchsorted(have, ids), have.size - 1)
    return have[pos] == ids


@dataclass
class _Held:
    """Rows of held updates in arrival order; ``update`` numbers the update each came with."""

    ids: np.ndarray
    update: np.ndarray
    payload: dict[str, np.ndarray]

    def take(self, mask: np.ndarray) -> _Held:
        payload = {k: v[mask] for k, v in self.payload.items()}
        return _Held(self.ids[mask], self.update[mask], payload)

    def per_update(self) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """Split back into the updates they came with, oldest first."""
        if self.ids.size == 0:
            return []
        cuts = np.flatnonzero(np.diff(self.update)) + 1
        bounds = zip(np.r_[0, cuts], np.r_[cuts, self.ids.size], strict=True)
        return [(self.ids[a:b], {k: v[a:b] for k, v in self.payload.items()}) for a, b in bounds]


class UpdateBuffer:
    """Updates a PS holds back while their rows are locked (ECRM section 3.4), returned in
    arrival order when the lock moves on. The payload is whatever the PS applies later
    (gradients, per row); a read of a held row can ``peek`` at them. Not thread-safe.

    A replacement locks every row it has to rebuild and releases them a chunk at a time
    while pushes keep arriving, so locking and releasing are merges of sorted arrays and the
    held rows of a table are one array (appended in batches): a release is one pass over
    what is held, not one per update held."""

    def __init__(self) -> None:
        self._locked: dict[str, np.ndarray] = {}  # sorted unique ids
        self._held: dict[str, _Held] = {}
        self._arrived: dict[str, list[_Held]] = {}  # not merged into _held yet
        self._updates = 0

    def lock(self, table: str, ids: np.ndarray) -> None:
        ids = _sorted_unique(ids)
        have = self._locked.get(table, np.empty(0, np.int64))
        new = ids[~_member(have, ids)]
        self._locked[table] = np.insert(have, np.searchsorted(have, new), new)

    def locked(self, table: str, ids: np.ndarray) -> np.ndarray:
        """Mask of ``ids`` whose updates must be held now."""
        have = self._locked.get(table, np.empty(0, np.int64))
        return _member(have, np.asarray(ids, dtype=np.int64))

    @property
    def held_rows(self) -> int:
        return sum(self._merged(t).ids.size for t in {*self._held, *self._arrived})

    def admit(
        self, table: str, ids: np.ndarray, payload: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Hold the locked part of an update; return the part to apply now."""
        ids = np.asarray(ids, dtype=np.int64)
        payload = {k: np.asarray(v) for k, v in payload.items()}
        mask = self.locked(table, ids)
        if not mask.any():
            return ids, payload
        self._updates += 1
        update = np.full(int(mask.sum()), self._updates, dtype=np.int64)
        held = _Held(ids[mask], update, {k: v[mask] for k, v in payload.items()})
        self._arrived.setdefault(table, []).append(held)
        keep = ~mask
        return ids[keep], {k: v[keep] for k, v in payload.items()}

    def _merged(self, table: str) -> _Held:
        parts = [self._held[table]] if table in self._held else []
        parts += self._arrived.pop(table, [])
        if not parts:
            return _Held(np.empty(0, np.int64), np.empty(0, np.int64), {})
        if len(parts) > 1:
            parts = [
                _Held(
                    np.concatenate([p.ids for p in parts]),
                    np.concatenate([p.update for p in parts]),
                    {k: np.concatenate([p.payload[k] for p in parts]) for k in parts[0].payload},
                )
            ]
        self._held[table] = parts[0]
        return parts[0]

    def release(
        self, table: str, ids: np.ndarray | None = None
    ) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """Unlock ``ids`` (default: all of ``table``); their held updates, oldest first."""
        held = self._merged(table)
        if ids is None:
            self._locked.pop(table, None)
            self._held.pop(table, None)
            return held.per_update()
        ids = _sorted_unique(ids)
        have = self._locked.get(table)
        if have is not None and have.size:
            self._locked[table] = have[~_member(ids, have)]
        mine = _member(ids, held.ids)
        if not mine.any():
            return []
        self._held[table] = held.take(~mine)
        return held.take(mine).per_update()

    def peek(self, table: str) -> Iterable[tuple[np.ndarray, dict[str, np.ndarray]]]:
        return self._merged(table).per_update()
