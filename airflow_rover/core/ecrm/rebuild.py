"""The rebuild of a lost PS as a state machine, one chunk of rows (or parity slots) per
lock (ECRM section 3.4), and which of its rows are worth decoding."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

import numpy as np

from airflow_rover.core.ecrm.codecs import Fields, ParityCodec
from airflow_rover.core.ecrm.decoding import DecodePlan, plan_decode
from airflow_rover.core.ecrm.encoding import EncodePlan, plan_encode
from airflow_rover.core.ecrm.ids import sorted_unique
from airflow_rover.core.ecrm.placement import ParityPlacement


def rows_to_rebuild(
    placement: ParityPlacement, lost_ps: int, materialised: Mapping[int, Mapping[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """The lost PS's rows worth decoding: those in a group whose parity a holder materialised
    (``{holder: {table: store.materialised(table)}}`` from ``placement.holders_of(lost_ps)``).
    Every other row of the lost PS is still at its seeded initial value (no holder ever
    acknowledged an update of it), which the replacement re-creates by itself on first use.
    A positional table's rows are keys: each of them may turn out to hold no row (its parity
    says so, ``core.ecrm.row_keys``)."""
    out: dict[str, list[np.ndarray]] = {t: [] for t in placement.tables}
    owned = {
        t: placement.ids_on(t, lost_ps) for t in placement.tables if t not in placement.positional
    }
    for holder, by_table in materialised.items():
        member = (lost_ps - (holder - placement.k)) % placement.num_ps  # its place in the groups
        if member >= placement.k:  # not one of lost_ps's holders
            continue
        for table, slots in by_table.items():
            local = np.asarray(slots, dtype=np.int64) * placement.k + member
            if table in placement.positional:
                out[table].append(placement.position_keys(lost_ps, local))
                continue
            mine = owned[table]
            out[table].append(mine[local[local < mine.size]])
    return {
        # a row's group has one holder and one member per PS: no repeats, a sort suffices
        t: sorted_unique(np.sort(np.concatenate(parts))) if parts else np.empty(0, np.int64)
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
        placement: ParityPlacement,
        lost_ps: int,
        rows_per_lock: int,
        data_ids: Mapping[str, np.ndarray] | None = None,
        parity_slots: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        if not 0 <= lost_ps < placement.num_ps:
            raise ValueError(f"lost_ps={lost_ps!r}: must be in [0, {placement.num_ps})")
        if rows_per_lock < 1:
            raise ValueError(f"ecrm.rows_per_lock={rows_per_lock!r}: must be >= 1")
        self.placement = placement
        self.lost_ps = lost_ps
        self.rows_per_lock = rows_per_lock
        tables = placement.tables
        if data_ids is None:
            if placement.positional:
                raise ValueError(
                    f"positional tables {sorted(placement.positional)}: pass data_ids "
                    "(rows_to_rebuild), a placement does not know which keys hold rows"
                )
            data_ids = {t: placement.ids_on(t, lost_ps) for t in tables}
        if parity_slots is None:
            parity_slots = {t: np.arange(placement.num_slots(t, lost_ps)) for t in tables}
        self._data = {t: sorted_unique(v) for t, v in data_ids.items()}  # mostly sorted already
        self._slots = {t: sorted_unique(v) for t, v in parity_slots.items()}
        for t, ids in self._data.items():
            if ids.size and (placement.owner(t, ids) != lost_ps).any():
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
            dec = plan_decode(self.placement, table, self.lost_ps, self._data[table][a:b])
            self._data_status[table][a:b] = RowStatus.LOCKED
            holders = tuple(sorted(dec.parity))
            locks = {**dec.member_ids, self.lost_ps: dec.ids}
            plan = dec
        else:
            plan = plan_encode(self.placement, table, self.lost_ps, self._slots[table][a:b])
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
                if holder in self.placement.holders_of(ps):
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
