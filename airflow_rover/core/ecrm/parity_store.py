"""The parity one PS holds, and the receiving half of difference propagation."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from airflow_rover.core.ecrm.codecs import Fields, ParityCodec
from airflow_rover.core.ecrm.encoding import encode_members
from airflow_rover.core.ecrm.ids import all_unique
from airflow_rover.core.ecrm.placement import ParityPlacement
from airflow_rover.core.ecrm.propagation import ParityDelta, TableDelta

InitialFn = Callable[[str, np.ndarray], Mapping[str, np.ndarray]]  # (table, ids) -> fields


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
    ``RebuildPlan(placement, holder, rows_per_lock, data_ids={})`` per holder."""

    def __init__(
        self,
        placement: ParityPlacement,
        ps_index: int,
        codec: ParityCodec,
        initial: InitialFn,
        epoch: int = 0,
    ) -> None:
        self.placement = placement
        self.ps_index = ps_index
        self.codec = codec
        self.initial = initial
        self.epoch = epoch  # this holder's incarnation
        self._tables: dict[str, _ParityTable] = {}
        self._src_epoch: dict[int, int] = dict.fromkeys(placement.sources_of(ps_index), 0)
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
            n = self.placement.num_slots(table, self.ps_index)
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
        t = self._table(table)
        n = t.slot_pos.size
        if slots.size and table in self.placement.positional:
            if slots.min() < 0:
                raise ValueError(f"table {table!r}: parity slots must be >= 0")
            top = int(slots.max())
            if top >= n:  # its groups fill as rows appear: room for the new levels
                grow = max(top + 1, 2 * n, 256) - n
                t.slot_pos = np.concatenate([t.slot_pos, np.full(grow, -1, dtype=np.int64)])
                t.stale = np.concatenate([t.stale, np.zeros(grow, dtype=bool)])
        elif slots.size and (slots.min() < 0 or slots.max() >= n):
            raise ValueError(f"table {table!r}: parity slots must lie in [0, {n})")
        return slots

    def _initial_parity(self, table: str, slots: np.ndarray) -> Fields:
        dtypes, trailing = self.spec(table)
        if table in self.placement.positional:  # a position's code starts at zero
            return {
                name: np.zeros((slots.size, *trailing[name]), dtype=self.codec.parity_dtype(dt))
                for name, dt in dtypes.items()
            }
        _, ids = self.placement.members(table, self.ps_index, slots)
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
        if not all_unique(slots):
            raise ValueError(f"table {table!r}: parity slots must be unique")
        t = self._table(table)
        pos = self._allocate(table, slots)
        for name, arr in t.arrays.items():
            arr[pos] = fields[name]
        t.stale[slots] = False

    def mark_stale(self, table: str, slots: np.ndarray | None = None) -> None:
        """These slots (default: all) will be re-encoded: drop deltas for them meanwhile."""
        if slots is None:
            self._table(table).stale[:] = True
        else:
            slots = self._check_slots(table, slots)  # first: it may grow the table's arrays
            self._table(table).stale[slots] = True

    def stale(self, table: str, slots: np.ndarray) -> np.ndarray:
        slots = self._check_slots(table, slots)
        return self._table(table).stale[slots]

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
        holder had its batch, and the batch is to be trained again (``Replacement.start_rebuild``
        keeps only the batches all holders saw)."""
        for part in delta.tables:
            self._apply_table(part, self.codec.sub)

    def _apply_table(self, part: TableDelta, op: Callable[..., None] | None = None) -> None:
        holder, slots = self.placement.parity_location(part.table, part.ids)
        if (holder != self.ps_index).any():
            raise ValueError(f"table {part.table!r}: rows whose parity is not on this PS")
        slots = self._check_slots(part.table, slots)
        t = self._table(part.table)
        live = ~t.stale[slots]
        self.dropped += int(slots.size - live.sum())
        slots = slots[live]
        if slots.size == 0:
            return
        if not all_unique(part.ids):  # unique ids of one source: one row per group at most
            raise ValueError(f"table {part.table!r}: two rows of one group in one delta")
        pos = self._materialise(part.table, slots)
        for name, arr in t.arrays.items():
            (op or self.codec.add)(arr, pos, part.fields[name][live])
