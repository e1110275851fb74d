"""What the file readers share: a dataset of files read by global row range.

``RowRangeReader`` is the frame every file format has (the files, the schema they are read
with, where each piece of rows starts in the global index space, pickling as the file list);
Parquet's pieces are row groups. ``FileRowsReader`` adds the read itself for formats whose
files are read row by row through an offset index (CSV lines, TFRecord records): a range is
cut at the files' ends and each file's part read as an Arrow table, so such a format says only
how to read rows ``[first, last)`` of one file.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from airflow_rover.core.data_schema import DataSchema
from airflow_rover.data.arrow_columns import ColumnLayout, serving_columns, to_batch
from airflow_rover.data.batch import Batch, Schema, check_range, concat_batches


def row_starts(counts: Sequence[int]) -> np.ndarray:
    """Where each piece of ``counts`` rows starts in the global index space, then the end."""
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


class RowRangeReader(ABC):
    """Files read by global row range (the files' rows in path order), as ``layout`` maps
    their columns; ``_starts`` holds where each piece (a file, a row group) starts."""

    FORMAT: ClassVar[str]
    TITLE: ClassVar[str]  # the format's name in messages
    layout: ColumnLayout
    _starts: np.ndarray

    def __init__(self, files: Sequence[str], schema: DataSchema | None) -> None:
        if not files:
            raise ValueError(f"a {self.TITLE} dataset needs at least one file")
        self.files = list(files)
        self.data_schema = schema

    @property
    def schema(self) -> Schema:
        return self.layout.schema

    @property
    def num_samples(self) -> int:
        return int(self._starts[-1])

    def __len__(self) -> int:
        return self.num_samples

    def __reduce__(self) -> tuple[Any, tuple[list[str], DataSchema | None]]:
        """Pickle as the file list and schema (indexes or footers found again on load)."""
        return (type(self), (self.files, self.data_schema))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.files)} files, num_samples={self.num_samples})"

    @abstractmethod
    def read(self, start: int, stop: int) -> Batch:
        """Samples ``[start, stop)`` as the layout maps them."""

    @abstractmethod
    def read_table(self, start: int, stop: int) -> pa.Table:
        """Samples ``[start, stop)`` as the files hold them (the columns the schema reads, not
        hashed)."""

    def serving_columns(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """A served model's categorical inputs for samples ``[start, stop)``: the raw values."""
        return serving_columns(self.read_table(start, stop), self.layout)


class FileRowsReader(RowRangeReader):
    """A ``RowRangeReader`` whose pieces are whole files, each read by row range."""

    @abstractmethod
    def _rows(self, f: int, first: int, last: int) -> pa.Table:
        """Rows ``[first, last)`` of file ``f`` as an Arrow table (no rows: an empty one)."""

    @abstractmethod
    def _location(self, f: int, first: int) -> str:
        """Row ``first`` of file ``f``, as an error message names it."""

    def read(self, start: int, stop: int) -> Batch:
        """Samples ``[start, stop)``: the rows of each file the range overlaps."""
        parts = [to_batch(table, self.layout, where) for table, where in self._tables(start, stop)]
        return concat_batches(parts)

    def read_table(self, start: int, stop: int) -> pa.Table:
        """Samples ``[start, stop)`` as the files hold them (not hashed)."""
        return pa.concat_tables([table for table, _ in self._tables(start, stop)])

    def _tables(self, start: int, stop: int) -> list[tuple[pa.Table, str]]:
        """The rows of each file ``[start, stop)`` overlaps, read, and where they are."""
        check_range(start, stop, self.num_samples)
        parts = []
        f = int(np.searchsorted(self._starts, start, side="right")) - 1
        while start < stop:
            base = int(self._starts[f])
            end = min(stop, int(self._starts[f + 1]))
            if end > start:
                table = self._rows(f, start - base, end - base)
                parts.append((table, self._location(f, start - base)))
            start = end
            f += 1
        return parts or [(self._rows(0, 0, 0), self.files[0])]
