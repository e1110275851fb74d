"""Reader for CSV files with a header line, by global row range (local or S3, uncompressed).

Each file's line offsets are found once per file (a scan for newlines, no parsing) and kept
(``data.offset_index``), so a range reads exactly its lines' bytes, parsed by pyarrow into Arrow
columns and converted by ``data.arrow_columns`` as Parquet's are. The columns' types are
inferred once, from the first lines of the first file, and every range is parsed with them. A
field may not hold a newline, even quoted. ``data_schema`` is required. A column the schema says
is ``multivalued`` holds strings separated by ``|`` (an empty cell: an empty list).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from airflow_rover.core.data_schema import DataSchema
from airflow_rover.data.arrow_columns import DataSchemaError, layout_for
from airflow_rover.data.file_rows import FileRowsReader, row_starts
from airflow_rover.data.offset_index import cached_index
from airflow_rover.data.sources import open_binary

CHUNK = 16 << 20
INFER_LINES = 1000
LIST_SEPARATOR = "|"


def line_offsets(path: str) -> tuple[bytes, np.ndarray]:
    """The header line of ``path`` and the byte offset of each following line, then the end
    of the last one."""
    ends = []
    position = 0
    header = b""
    with open_binary(path) as f:
        while chunk := f.read(CHUNK):
            newlines = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == ord("\n"))
            ends.append(newlines.astype(np.int64) + position + 1)
            if position == 0:
                header = chunk[: int(newlines[0]) + 1] if newlines.size else chunk
            position += len(chunk)
    starts = np.concatenate([np.zeros(1, np.int64), *ends])
    if position and (not ends or not ends[-1].size or ends[-1][-1] != position):
        starts = np.append(starts, position)  # a last line without a newline
    if len(starts) < 2:
        raise DataSchemaError(f"{path}: empty CSV file (no header line)")
    return header, starts[1:]


def _indexed_lines(path: str) -> tuple[bytes, np.ndarray]:
    """``line_offsets(path)``, found once per file and kept (``data.offset_index``)."""

    def build() -> dict[str, np.ndarray]:
        header, offsets = line_offsets(path)
        return {"offsets": offsets, "header": np.frombuffer(header, dtype=np.uint8)}

    index = cached_index(path, "csv", build)
    return index["header"].tobytes(), index["offsets"]


class CsvReader(FileRowsReader):
    """Random access by global row range over CSV files with one header line each."""

    FORMAT = "csv"
    TITLE = "CSV"

    def __init__(self, files: Sequence[str], schema: DataSchema | None = None) -> None:
        super().__init__(files, schema)
        if any(f.endswith(".gz") for f in files):
            raise ValueError(f"{files[0]}: compressed CSV cannot be read by row range; unzip it")
        if schema is None:
            raise DataSchemaError(
                f"{files[0]}: give data_schema for CSV files (the label, dense and "
                "categorical columns)"
            )
        headers, self._offsets = zip(*(_indexed_lines(f) for f in self.files), strict=True)
        self._names = _names(headers[0])
        for path, header in zip(self.files, headers, strict=True):
            if _names(header) != self._names:
                raise DataSchemaError(
                    f"{path}: its header differs from {self.files[0]}'s "
                    f"({header.decode().strip()!r} against {','.join(self._names)!r})"
                )
        counts = [len(o) - 1 for o in self._offsets]
        self._starts = row_starts(counts)
        # a list column's cells are strings of values separated by LIST_SEPARATOR
        self._lists = [c.name for c in schema.categorical if c.multivalued]
        first = self._parse(0, 0, min(INFER_LINES, counts[0]), types=None)
        self._types = {name: first.schema.field(name).type for name in self._names}
        self.layout = layout_for(first.schema, schema, self.files[0])

    def _rows(self, f: int, first: int, last: int) -> pa.Table:
        return self._parse(f, first, last, self._types)

    def _location(self, f: int, first: int) -> str:
        return f"{self.files[f]} (line {first + 2})"

    def _parse(
        self, f: int, first: int, last: int, types: dict[str, pa.DataType] | None
    ) -> pa.Table:
        """Lines ``[first, last)`` (after the header) of file ``f`` as a table."""
        offsets = self._offsets[f]
        begin, end = int(offsets[first]), int(offsets[last])
        if begin == end:
            if types is None:
                raise DataSchemaError(f"{self.files[f]}: no line after the header")
            cells = {name: types[name] for name in self._names} | dict.fromkeys(
                self._lists, pa.string()
            )
            empty = pa.table({name: pa.array([], type=t) for name, t in cells.items()})
            return _split_lists(empty, self._lists)
        with open_binary(self.files[f]) as fh:
            fh.seek(begin)
            data = fh.read(end - begin)
        read = pacsv.ReadOptions(column_names=self._names)
        column_types = dict(types or {}) | {name: pa.string() for name in self._lists}
        convert = pacsv.ConvertOptions(column_types=column_types)
        try:
            table = pacsv.read_csv(io.BytesIO(data), read_options=read, convert_options=convert)
            return _split_lists(table, self._lists)
        except pa.ArrowInvalid as exc:
            raise DataSchemaError(
                f"{self.files[f]} (lines {first + 2}-{last + 1}): {exc}; the column types "
                f"inferred from its first lines: {_types(types)}"
            ) from None


def _split_lists(table: pa.Table, names: list[str]) -> pa.Table:
    """The list columns' cells split at ``LIST_SEPARATOR`` into list<string> (an empty cell:
    no value)."""
    for name in names:
        cells = table.column(name).cast(pa.string())
        cells = pc.if_else(pc.equal(cells, ""), pa.scalar(None, pa.string()), cells)
        index = table.schema.get_field_index(name)
        table = table.set_column(index, name, pc.split_pattern(cells, LIST_SEPARATOR))
    return table


def _names(header: bytes) -> list[str]:
    """The column names of a header line (quoted or not)."""
    return next(csv.reader([header.decode().rstrip("\r\n")]))


def _types(types: dict[str, pa.DataType] | None) -> str:
    return ", ".join(f"{name} {dtype}" for name, dtype in (types or {}).items())
