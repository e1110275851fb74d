"""ECRM's side of a positional table on its PS (raw 64-bit ids, ``EmbeddingTable(index="ids")``).

Its rows are coded by key, ``position * num_ps + ps`` (``ParityPlacement(positional=...)``),
from their first update on: a row only pulled is at its seeded initial value, which a
replacement re-creates by itself on first touch, so a position's code is zero until then and
a pull sends nothing. The first update's difference goes from zero to the row, its optimizer
state and its key field (``core.ecrm.row_keys``: which id the position holds); later ones
carry the key field unchanged. Holders thus hold, per group, the ids of its coded rows too,
and a lost PS's ids decode with its rows.

A replacement places the rows it decodes one after the other (``place``): a position of the
lost PS that held no coded row leaves no hole, and each row that lands at another position
than it had moves its code there (one difference out of its old key, one into its new one).
"""

from __future__ import annotations

import numpy as np

from airflow_rover.core.ecrm import Fields, ParityPlacement
from airflow_rover.core.ecrm.row_keys import KEY_FIELD, key_fields, no_keys
from airflow_rover.ps.tables import EmbeddingTable

RowUpdate = tuple[np.ndarray, Fields, Fields]  # keys, fields before, fields after


class PositionalRows:
    """Which of a positional table's rows are coded, and its rows read and updated by key.
    The PS's apply lock covers ``keys``, ``apply`` and ``place``; ``read`` may run beside them
    (a rebuild reads rows its lock keeps from changing)."""

    def __init__(self, table: EmbeddingTable, placement: ParityPlacement, index: int) -> None:
        self.table = table
        self.placement = placement
        self.index = index
        # rows held when ECRM is set up are restored ones: coded (their parity is encoded again)
        self._coded = np.ones(table.size, dtype=bool)

    def blank(self, n: int) -> Fields:
        """The code of ``n`` positions holding no coded row: zeros, the key field empty."""
        state = self.table.optimizer.init_state((n, self.table.dim), rows=True)
        out = {"row": np.zeros((n, self.table.dim), dtype=np.float32)}
        out.update({f"state/{k}": np.zeros_like(v) for k, v in state.items()})
        out[KEY_FIELD] = no_keys(n)
        return out

    def keys(self, ids: np.ndarray) -> np.ndarray:
        """The keys of unique ``ids``, their rows created if missing (not coded yet)."""
        return self.placement.position_keys(self.index, self.table.slots_of(ids))

    def _positions(self, keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.int64)
        if keys.size and (self.placement.owner(self.table.name, keys) != self.index).any():
            raise ValueError(f"table {self.table.name!r}: keys not owned by PS {self.index}")
        return self.placement.key_positions(keys)

    def _is_coded(self, positions: np.ndarray) -> np.ndarray:
        coded = self._coded
        inside = positions < coded.size
        return inside & coded[np.where(inside, positions, 0)] if coded.size else inside

    def _mark(self, positions: np.ndarray) -> None:
        if positions.size == 0:
            return
        top = int(positions.max()) + 1
        if top > self._coded.size:
            grown = np.zeros(max(top, 2 * self._coded.size, 1024), dtype=bool)
            grown[: self._coded.size] = self._coded
            self._coded = grown
        self._coded[positions] = True

    def apply(self, keys: np.ndarray, grads: np.ndarray) -> RowUpdate:
        """One optimizer step on rows ``keys`` (held); their fields before (zeros for a row
        not coded yet) and after, key fields included: what the holders add."""
        positions = self._positions(keys)
        ids = self.table.ids_at(positions)
        old, new = self.table.apply_at(positions, grads)
        fresh = ~self._is_coded(positions)
        if fresh.any():
            blank = self.blank(int(fresh.sum()))
            for name, value in old.items():
                value[fresh] = blank[name]
        new[KEY_FIELD] = key_fields(ids)
        old[KEY_FIELD] = np.where(fresh[:, None], 0.0, new[KEY_FIELD])
        self._mark(positions)
        return np.asarray(keys, dtype=np.int64), old, new

    def read(self, keys: np.ndarray) -> Fields:
        """The code of each key's row: its fields and key field if coded, else zeros (a key
        past the rows held included)."""
        positions = self._positions(keys)
        out = self.blank(positions.size)
        have = np.flatnonzero(self._is_coded(positions))  # coded rows exist
        if have.size:
            ids, fields = self.table.fields_at(positions[have])
            for name, value in fields.items():
                out[name][have] = value
            out[KEY_FIELD][have] = key_fields(ids)
        return out

    def coded_keys(self) -> np.ndarray:
        """The keys of every coded row."""
        coded = self._coded[: self.table.size]
        return self.placement.position_keys(self.index, np.flatnonzero(coded))

    def place(self, old_keys: np.ndarray, ids: np.ndarray, fields: Fields) -> RowUpdate:
        """A replacement's decoded rows (``old_keys`` ascending, the lost PS's keys of rows
        ``ids``), appended after the rows placed so far, coded; returns the difference that
        moves the code of each row that lands at another position to its new key."""
        self.table.put_fields(ids, fields)
        positions = self.table.slots_of(ids)  # new rows: after every row held
        self._mark(positions)
        new_keys = self.placement.position_keys(self.index, positions)
        moved = new_keys != old_keys
        keys = np.union1d(old_keys[moved], new_keys[moved])
        before, after = self.blank(keys.size), self.blank(keys.size)
        at_old = np.searchsorted(keys, old_keys[moved])
        at_new = np.searchsorted(keys, new_keys[moved])
        for name in before:
            before[name][at_old] = fields[name][moved]
            after[name][at_new] = fields[name][moved]
        return keys, before, after
