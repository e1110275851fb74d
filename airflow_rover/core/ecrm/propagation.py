"""The sending half of difference propagation (ECRM section 3.3.2) and its messages: after
a PS applies an update, one ``ParityDelta`` per parity holder."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from airflow_rover.core.ecrm.codecs import Fields, ParityCodec
from airflow_rover.core.ecrm.ids import all_unique, distinct_ps
from airflow_rover.core.ecrm.placement import ParityPlacement

RowUpdate = tuple[np.ndarray, Mapping[str, np.ndarray], Mapping[str, np.ndarray]]  # ids, old, new


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
        self, placement: ParityPlacement, ps_index: int, codec: ParityCodec, epoch: int = 0
    ) -> None:
        self.placement = placement
        self.ps_index = ps_index
        self.codec = codec
        self.epoch = epoch
        self._seq: dict[int, int] = dict.fromkeys(placement.holders_of(ps_index), 0)
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
            if not all_unique(ids):
                raise ValueError(f"table {table!r}: updated ids must be unique")
            owner = self.placement.owner(table, ids)
            if (owner != self.ps_index).any():
                raise ValueError(f"table {table!r}: ids not owned by PS {self.ps_index}")
            holder, _ = self.placement.parity_location(table, ids)
            diff = {name: self.codec.difference(new[name], old[name]) for name in new}
            for h in distinct_ps(holder):
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
