"""Encoding parity from a group's members: the parity of initial values, and the re-encoding
of a holder's parity slots (a lost holder's rebuild, the parity after a restore)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from airflow_rover.core.ecrm.codecs import Fields, ParityCodec, blank
from airflow_rover.core.ecrm.ids import gather_plan
from airflow_rover.core.ecrm.placement import ParityPlacement


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
        acc = blank(codec, self.slots.size, dtypes, like)
        for ps, (rows, index) in self.gather.items():
            got = members[ps]
            for name in acc:
                codec.add(acc[name], rows, codec.lift(np.asarray(got[name])[index]))
        return acc


def plan_encode(
    placement: ParityPlacement, table: str, holder: int, slots: np.ndarray
) -> EncodePlan:
    """What to read to re-encode ``holder``'s parity ``slots`` (a lost holder's rebuild, or
    building parity after a restore)."""
    slots = np.asarray(slots, dtype=np.int64)
    member_ps, member_ids = placement.members(table, holder, slots)
    reads, gather = gather_plan(member_ps, member_ids, skip=None)
    return EncodePlan(table, holder, slots, reads, gather)
