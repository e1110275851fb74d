"""Reader for Parquet datasets: any number of files, read by global row range.

The footers give each file's row groups and their row counts, so the global index space (the
files' rows in path order) maps to row groups without reading data; a range decodes only the
row groups it overlaps. The last decoded row groups are kept, converted: a row group holds many
shards, and consecutive shards of one worker mostly lie in the same one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_rover.core.data_schema import DataSchema
from airflow_rover.data.arrow_columns import DataSchemaError, layout_for, to_batch
from airflow_rover.data.batch import Batch, RaggedIds, Schema, check_range, concat_batches
from airflow_rover.data.file_rows import RowRangeReader, row_starts
from airflow_rover.data.sources import open_source

CACHED_ROW_GROUPS = 2


class ParquetReader(RowRangeReader):
    """Random access by global row range over Parquet files, as ``schema`` maps their
    columns (inferred from the first file's schema when None)."""

    FORMAT = "parquet"
    TITLE = "Parquet"

    def __init__(self, files: Sequence[str], schema: DataSchema | None = None) -> None:
        super().__init__(files, schema)
        first = _open(self.files[0])
        self.layout = layout_for(first.schema_arrow, schema, self.files[0])
        rows, where = [], []
        for f, path in enumerate(self.files):
            parquet = first if f == 0 else _open(path)
            if f > 0:
                layout_for(parquet.schema_arrow, schema, path)  # the same columns in each file
            metadata = parquet.metadata
            for g in range(metadata.num_row_groups):
                rows.append(metadata.row_group(g).num_rows)
                where.append((f, g))
        self._starts = row_starts(rows)
        self._where = where
        # Opened again to read with the layout's string columns as dictionaries
        self._open: dict[int, pq.ParquetFile] = {}
        self._cache: OrderedDict[int, Batch] = OrderedDict()

    def read(self, start: int, stop: int) -> Batch:
        """Samples ``[start, stop)`` from the row groups they lie in."""
        check_range(start, stop, self.num_samples)
        if start == stop:
            return _empty(self.schema)
        first = int(np.searchsorted(self._starts, start, side="right")) - 1
        last = int(np.searchsorted(self._starts, stop, side="left"))
        parts = []
        for group in range(first, last):
            base = int(self._starts[group])
            lo, hi = max(start, base) - base, min(stop, int(self._starts[group + 1])) - base
            parts.append(self._row_group(group)[lo:hi])
        return concat_batches(parts)

    def read_table(self, start: int, stop: int) -> pa.Table:
        """Samples ``[start, stop)`` as the files hold them (the columns the schema reads, not
        hashed): what a served model takes (``serving_columns``)."""
        check_range(start, stop, self.num_samples)
        first = min(
            int(np.searchsorted(self._starts, start, side="right")) - 1, len(self._where) - 1
        )
        last = max(int(np.searchsorted(self._starts, stop, side="left")), first + 1)
        parts = []
        for group in range(first, last):
            base = int(self._starts[group])
            lo, hi = max(start, base) - base, min(stop, int(self._starts[group + 1])) - base
            parts.append(self._raw_group(group).slice(lo, max(hi - lo, 0)))
        return pa.concat_tables(parts)

    def _raw_group(self, group: int) -> pa.Table:
        f, g = self._where[group]
        parquet = self._open.get(f)
        if parquet is None:
            parquet = self._open[f] = _open(self.files[f], self.layout.string_columns)
        return parquet.read_row_group(g, columns=self.layout.columns)

    def _row_group(self, group: int) -> Batch:
        cached = self._cache.get(group)
        if cached is not None:
            self._cache.move_to_end(group)
            return cached
        f, g = self._where[group]
        table = self._raw_group(group)
        batch = to_batch(table, self.layout, f"{self.files[f]} (row group {g})")
        self._cache[group] = batch
        while len(self._cache) > CACHED_ROW_GROUPS:
            self._cache.popitem(last=False)
        return batch


def _open(path: str, dictionaries: list[str] | None = None) -> pq.ParquetFile:
    """The Parquet file ``path`` (local or ``s3://``), its column chunks fetched together;
    the columns ``dictionaries`` decoded as dictionary arrays (as Parquet stores them)."""
    try:
        return pq.ParquetFile(open_source(path), pre_buffer=True, read_dictionary=dictionaries)
    except (OSError, pa.ArrowInvalid) as exc:
        raise ValueError(f"{path}: cannot read as Parquet: {exc}") from None


def _empty(schema: Schema) -> Batch:
    return Batch(
        dense=np.empty((0, schema.num_dense), np.float32),
        categorical=np.empty((0, schema.num_categorical), np.int64),
        label=np.empty(0, np.float32),
        lists=tuple(RaggedIds(np.empty(0, np.int64), np.zeros(1, np.int64)) for _ in schema.lists),
    )


__all__ = ["DataSchemaError", "ParquetReader"]
