"""Decoding a lost PS's rows: ``row = parity - the group's other members``, for a degraded
read or one chunk of a rebuild, with the parity caught up on messages still in flight."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from airflow_rover.core.ecrm.codecs import Fields, ParityCodec, blank
from airflow_rover.core.ecrm.ids import all_unique, distinct_ps, gather_plan, in_sorted
from airflow_rover.core.ecrm.placement import ParityPlacement
from airflow_rover.core.ecrm.propagation import ParityDelta, TableDelta


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
        acc = blank(codec, self.ids.size, dtypes, next(iter(parity.values())))
        for holder, (rows, _) in self.parity.items():
            for name in acc:
                acc[name][rows] = parity[holder][name]
        for ps, (rows, index) in self.gather.items():
            got = members[ps]
            for name in acc:
                codec.sub(acc[name], rows, codec.lift(np.asarray(got[name])[index]))
        return {name: codec.lower(acc[name], dtypes[name]) for name in acc}


def plan_decode(
    placement: ParityPlacement, table: str, lost_ps: int, ids: np.ndarray
) -> DecodePlan:
    """What to read to decode rows ``ids`` (unique, all owned by ``lost_ps``): a degraded
    read, or one chunk of a rebuild."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (placement.owner(table, ids) != lost_ps).any():
        raise ValueError(f"table {table!r}: ids not owned by PS {lost_ps}")
    if not all_unique(ids):
        raise ValueError(f"table {table!r}: ids must be unique")
    holder, slots = placement.parity_location(table, ids)
    parity: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    member_ps = np.empty((ids.size, placement.k), dtype=np.int64)
    member_ids = np.empty((ids.size, placement.k), dtype=np.int64)
    for h in distinct_ps(holder):
        rows = np.flatnonzero(holder == h)
        parity[int(h)] = (rows, slots[rows])
        mp, mi = placement.members(table, int(h), slots[rows])
        member_ps[rows], member_ids[rows] = mp, mi
    reads, gather = gather_plan(member_ps, member_ids, skip=lost_ps)
    return DecodePlan(table, lost_ps, ids, parity, reads, gather)


def restrict(delta: ParityDelta, ids_by_table: Mapping[str, np.ndarray]) -> list[TableDelta]:
    """The parts of ``delta`` for rows in ``ids_by_table`` (per table, sorted unique): what of
    a message still in flight a degraded read needs (``catch_up``)."""
    out = []
    for part in delta.tables:
        wanted = ids_by_table.get(part.table)
        if wanted is None:
            continue
        keep = in_sorted(wanted, part.ids)
        if keep.any():
            out.append(
                TableDelta(part.table, part.ids[keep], {n: f[keep] for n, f in part.fields.items()})
            )
    return out


def catch_up(
    placement: ParityPlacement,
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
        where, at = placement.parity_location(table, part.ids)
        pos = np.minimum(np.searchsorted(ordered, at), ordered.size - 1)
        hit = (where == holder) & (ordered[pos] == at)
        if not hit.any():
            continue
        index = order[pos[hit]]
        for name, arr in parity.items():
            codec.add(arr, index, np.asarray(part.fields[name])[hit])
