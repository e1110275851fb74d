"""Updates a PS holds back while a rebuild has their rows locked."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from airflow_rover.core.ecrm.ids import in_sorted, sorted_unique


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
        ids = sorted_unique(ids)
        have = self._locked.get(table, np.empty(0, np.int64))
        new = ids[~in_sorted(have, ids)]
        self._locked[table] = np.insert(have, np.searchsorted(have, new), new)

    def locked(self, table: str, ids: np.ndarray) -> np.ndarray:
        """Mask of ``ids`` whose updates must be held now."""
        have = self._locked.get(table, np.empty(0, np.int64))
        return in_sorted(have, np.asarray(ids, dtype=np.int64))

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
        ids = sorted_unique(ids)
        have = self._locked.get(table)
        if have is not None and have.size:
            self._locked[table] = have[~in_sorted(ids, have)]
        mine = in_sorted(ids, held.ids)
        if not mine.any():
            return []
        self._held[table] = held.take(~mine)
        return held.take(mine).per_update()

    def peek(self, table: str) -> Iterable[tuple[np.ndarray, dict[str, np.ndarray]]]:
        return self._merged(table).per_update()
