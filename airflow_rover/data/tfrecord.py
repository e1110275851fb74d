"""Reader for TFRecord files of ``tf.train.Example``, by global row range (local or S3).

Each file's record offsets come from its record headers (a length each: no parsing), read once
per file and kept (``data.offset_index``), so a range reads exactly the bytes of its records.
The records of a range are parsed together (``tf.io.parse_example``) into Arrow columns and
converted by ``data.arrow_columns`` as Parquet's are. Examples carry no schema: the columns'
types are those of the first record's features (int64_list: int, float_list: float, bytes_list:
string), and ``data_schema`` is required.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from airflow_rover.core.data_schema import DataSchema
from airflow_rover.data.arrow_columns import (
    ColumnLayout,
    DataSchemaError,
    layout_for,
    serving_columns,
    to_batch,
)
from airflow_rover.data.batch import Batch, Schema, check_range, concat_batches
from airflow_rover.data.offset_index import cached_index
from airflow_rover.data.sources import open_binary

_LENGTH = struct.Struct("<Q")
_HEADER = 12  # length (8 bytes) and its masked CRC (4)
_FOOTER = 4  # the data's masked CRC
CHUNK = 8 << 20
_KINDS = {"int64_list": pa.int64(), "float_list": pa.float32(), "bytes_list": pa.binary()}


def record_offsets(path: str) -> np.ndarray:
    """Byte offset of each record of the TFRecord file ``path``, then the file's end: its
    headers read from large sequential chunks (on S3 a GET per chunk, not per record)."""
    offsets = []
    position = 0  # of the next record
    data, base = b"", 0  # bytes read, from file offset base
    with open_binary(path) as f:
        while True:
            at = position - base
            if at + _HEADER <= len(data):
                (length,) = _LENGTH.unpack_from(data, at)
                offsets.append(position)
                position += _HEADER + length + _FOOTER
                continue
            if at > len(data):  # skip the rest of a long record
                f.seek(position)
                data, base, at = b"", position, 0
            chunk = f.read(CHUNK)
            if not chunk:
                if at < len(data):
                    raise ValueError(f"{path}: truncated record header at byte {position}")
                break
            data, base = data[at:] + chunk, position
    offsets.append(position)
    return np.array(offsets, dtype=np.int64)


def _indexed_records(path: str) -> np.ndarray:
    """``record_offsets(path)``, found once per file and kept (``data.offset_index``)."""
    return cached_index(path, "tfrecord", lambda: {"offsets": record_offsets(path)})["offsets"]


def _records(path: str, offsets: np.ndarray, first: int, last: int) -> list[bytes]:
    """The payloads of records ``[first, last)`` of ``path``, read in one go."""
    start, stop = int(offsets[first]), int(offsets[last])
    with open_binary(path) as f:
        f.seek(start)
        data = memoryview(f.read(stop - start))
    records = []
    for index in range(first, last):
        at = int(offsets[index]) - start
        (length,) = _LENGTH.unpack_from(data, at)
        records.append(bytes(data[at + _HEADER : at + _HEADER + length]))
    return records


def example_schema(record: bytes, where: str, lists: frozenset[str] = frozenset()) -> pa.Schema:
    """The Arrow schema of one serialized Example: each feature's kind, a list when it holds
    other than one value or is named in ``lists`` (the schema says it is multivalued)."""
    from tensorflow.core.example import example_pb2

    example = example_pb2.Example.FromString(record)
    fields = []
    for name, feature in sorted(example.features.feature.items()):
        kind = feature.WhichOneof("kind")
        if kind is None:
            raise DataSchemaError(f"{where}: feature {name!r} holds no value list")
        dtype = _KINDS[kind]
        count = len(getattr(feature, kind).value)
        is_list = count != 1 or name in lists
        fields.append(pa.field(name, pa.list_(dtype) if is_list else dtype))
    return pa.schema(fields)


class TFRecordReader:
    """Random access by global row range over TFRecord files of Examples."""

    FORMAT = "tfrecord"

    def __init__(self, files: Sequence[str], schema: DataSchema | None = None) -> None:
        if not files:
            raise ValueError("a TFRecord dataset needs at least one file")
        if schema is None:
            raise DataSchemaError(
                f"{files[0]}: TFRecord Examples carry no schema; give data_schema (the label, "
                "dense and categorical features)"
            )
        self.files = list(files)
        self.data_schema = schema
        self._offsets = [_indexed_records(path) for path in self.files]
        counts = [len(o) - 1 for o in self._offsets]
        self._starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        first = next((f for f, n in enumerate(counts) if n), None)
        if first is None:
            raise DataSchemaError(f"{self.files[0]}: the TFRecord files hold no record")
        record = _records(self.files[first], self._offsets[first], 0, 1)[0]
        lists = frozenset(c.name for c in schema.categorical if c.multivalued)
        self._arrow_schema = example_schema(record, self.files[first], lists)
        self.layout: ColumnLayout = layout_for(self._arrow_schema, schema, self.files[first])

    @property
    def schema(self) -> Schema:
        return self.layout.schema

    @property
    def num_samples(self) -> int:
        return int(self._starts[-1])

    def __len__(self) -> int:
        return self.num_samples

    def __reduce__(self) -> tuple[type[TFRecordReader], tuple[list[str], DataSchema | None]]:
        return (TFRecordReader, (self.files, self.data_schema))

    def __repr__(self) -> str:
        return f"TFRecordReader({len(self.files)} files, num_samples={self.num_samples})"

    def read(self, start: int, stop: int) -> Batch:
        """Samples ``[start, stop)``: the records of each file the range overlaps."""
        parts = [to_batch(table, self.layout, where) for table, where in self._tables(start, stop)]
        return concat_batches(parts)

    def read_table(self, start: int, stop: int) -> pa.Table:
        """Samples ``[start, stop)`` as the records hold them (not hashed)."""
        return pa.concat_tables([table for table, _ in self._tables(start, stop)])

    def serving_columns(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """A served model's categorical inputs for samples ``[start, stop)``: the raw values."""
        return serving_columns(self.read_table(start, stop), self.layout)

    def _tables(self, start: int, stop: int) -> list[tuple[pa.Table, str]]:
        """The records of each file ``[start, stop)`` overlaps, parsed, and where they are."""
        check_range(start, stop, self.num_samples)
        parts = []
        f = int(np.searchsorted(self._starts, start, side="right")) - 1
        while start < stop:
            base = int(self._starts[f])
            end = min(stop, int(self._starts[f + 1]))
            if end > start:
                records = _records(self.files[f], self._offsets[f], start - base, end - base)
                where = f"{self.files[f]} (record {start - base})"
                parts.append((self._table(records, where), where))
            start = end
            f += 1
        return parts or [(self._table([], self.files[0]), self.files[0])]

    def _table(self, records: list[bytes], where: str) -> pa.Table:
        import tensorflow as tf

        spec: dict[str, Any] = {}
        for name in self.layout.columns:
            dtype = self._arrow_schema.field(name).type
            is_list = pa.types.is_list(dtype)
            value_type = dtype.value_type if is_list else dtype
            binary = value_type == pa.binary()
            tf_type = tf.string if binary else tf.as_dtype(value_type.to_pandas_dtype())
            if is_list:
                spec[name] = tf.io.RaggedFeature(tf_type, row_splits_dtype=tf.int64)
            else:
                default = b"" if tf_type == tf.string else 0
                spec[name] = tf.io.FixedLenFeature([], tf_type, default_value=default)
        try:
            parsed = tf.io.parse_example(tf.constant(records, dtype=tf.string), spec)
        except tf.errors.InvalidArgumentError as exc:
            raise DataSchemaError(f"{where}: {exc.message}") from None
        columns = {}
        for name in self.layout.columns:
            dtype = self._arrow_schema.field(name).type
            columns[name] = _arrow_column(parsed[name], dtype)
        return pa.table(columns)


def _arrow_column(parsed: Any, dtype: pa.DataType) -> pa.Array:
    """A parsed feature (a dense tensor, or ragged for a list) as an Arrow array."""
    if not pa.types.is_list(dtype):
        values = parsed.numpy()
        return pa.array(list(values) if dtype == pa.binary() else values, dtype)
    flat = parsed.flat_values.numpy()
    values = pa.array(list(flat) if dtype.value_type == pa.binary() else flat, dtype.value_type)
    offsets = pa.array(parsed.row_splits.numpy().astype(np.int32), pa.int32())
    return pa.ListArray.from_arrays(offsets, values)
