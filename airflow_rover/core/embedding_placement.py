"""Fused embedding groups: all tables of one width share one id space on the PS.

A batch of Criteo-shaped data touches 26+ tables; one request, one ``np.unique`` and one
optimizer call per *group* instead of per table cuts the per-step overhead on both sides.
A table's rows keep their identity: fused id = table offset + row id, where the offsets stack
the tables of a group by vocabulary size, so (table, id) <-> fused id is a bijection. Entries
of the feature config that share a table (``TableConfig.table``) read the same offset: one set
of rows, several model inputs.

A table of index 'ids' (raw int64 ids) has no vocabulary to stack by: it is a group of its
own (``ids_<table>``), its ids sent as they are, so no two ids of it ever share a row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from airflow_rover.core.spec import FeatureConfig, TableIndex

ID_GROUP_PREFIX = "ids_"


@dataclass(frozen=True)
class TableSlice:
    """Where the rows one entry of the feature config reads live inside its group."""

    name: str
    column: str
    offset: int
    vocab_size: int
    table: str = ""  # the table whose rows it reads (shared by entries naming the same)
    pooling: str = "sum"  # how a list column's rows combine
    index: TableIndex = "vocab"  # "ids": raw int64 ids, offset 0, vocab_size a hint


@dataclass(frozen=True)
class EmbeddingGroup:
    name: str
    dim: int
    tables: tuple[TableSlice, ...]
    index: TableIndex = "vocab"

    @property
    def vocab_size(self) -> int:
        """The fused id space; of an 'ids' group, the expected count of ids (a hint)."""
        return max(t.offset + t.vocab_size for t in self.tables)

    def fused_ids(
        self,
        categorical: np.ndarray,
        column_index: dict[str, int],
        tables: tuple[TableSlice, ...] | None = None,
    ) -> np.ndarray:
        """(batch, tables) fused ids of a batch's categorical columns (``tables``: those of
        the group's entries to read, by default all)."""
        tables = self.tables if tables is None else tables
        cols = [column_index[t.column] for t in tables]
        ids = categorical[:, cols].astype(np.int64, copy=False)
        if self.index == "ids":
            return ids
        vocab = np.array([t.vocab_size for t in tables], dtype=np.int64)
        bad = (ids < 0) | (ids >= vocab)  # would silently alias a row of the next table
        if bad.any():
            j = int(np.nonzero(bad.any(axis=0))[0][0])
            _out_of_range(tables[j], int(ids[bad[:, j], j][0]))
        return ids + np.array([t.offset for t in tables], dtype=np.int64)

    @staticmethod
    def fused_values(table: TableSlice, values: np.ndarray) -> np.ndarray:
        """Fused ids of a list column's ids (any number per sample) read by ``table``."""
        ids = values.astype(np.int64, copy=False)
        if table.index == "ids":
            return ids
        bad = (ids < 0) | (ids >= table.vocab_size)
        if bad.any():
            _out_of_range(table, int(ids[bad][0]))
        return ids + table.offset

    def split(self, fused: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Index in ``tables`` and row id of each fused id (for export and inspection): of a
        shared table, its first entry."""
        first = {t.offset: j for j, t in reversed(list(enumerate(self.tables)))}
        starts = np.array(sorted(first), dtype=np.int64)
        at = np.searchsorted(starts, fused, side="right") - 1
        index = np.array([first[int(o)] for o in starts], dtype=np.int64)
        return index[at], fused - starts[at]


def _out_of_range(table: TableSlice, example: int) -> None:
    raise ValueError(
        f"table {table.name!r}: column {table.column!r} has ids outside "
        f"[0, {table.vocab_size}) (e.g. {example})"
    )


@dataclass(frozen=True)
class EmbeddingPlacement:
    groups: tuple[EmbeddingGroup, ...]

    @classmethod
    def from_features(cls, features: FeatureConfig) -> EmbeddingPlacement:
        """Tables stacked per dim in the order they first appear; an entry sharing a table
        takes that table's offset. Then one group per table of index 'ids'."""
        by_dim: dict[int, list[TableSlice]] = {}
        by_ids: dict[str, list[TableSlice]] = {}
        ends: dict[int, int] = {}
        offsets: dict[str, int] = {}
        for table in features.tables:
            key = table.rows_of
            if table.index == "ids":
                by_ids.setdefault(key, []).append(
                    TableSlice(
                        table.name, table.column, 0, table.vocab_size, key, table.pooling, "ids"
                    )
                )
                continue
            if key not in offsets:
                offsets[key] = ends.get(table.dim, 0)
                ends[table.dim] = offsets[key] + table.vocab_size
            by_dim.setdefault(table.dim, []).append(
                TableSlice(
                    table.name, table.column, offsets[key], table.vocab_size, key, table.pooling
                )
            )
        dims = {t.rows_of: t.dim for t in features.tables}
        return cls(
            tuple(EmbeddingGroup(f"dim{d}", d, tuple(ts)) for d, ts in sorted(by_dim.items()))
            + tuple(
                EmbeddingGroup(f"{ID_GROUP_PREFIX}{key}", dims[key], tuple(ts), "ids")
                for key, ts in by_ids.items()
            )
        )

    def group(self, name: str) -> EmbeddingGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(f"no embedding group {name!r}")
