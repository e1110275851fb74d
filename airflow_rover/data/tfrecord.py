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
from airflow_rover.data.arrow_columns import DataSchemaError, layout_for
from airflow_rover.data.file_rows import FileRowsReader, row_starts
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


class TFRecordReader(FileRowsReader):
    """Random access by global row range over TFRecord files of Examples."""

    FORMAT = "tfrecord"
    TITLE = "TFRecord"

    def __init__(self, files: Sequence[str], schema: DataSchema | None = None) -> None:
        super().__init__(files, schema)
        if schema is None:
            raise DataSchemaError(
                f"{files[0]}: TFRecord Examples carry no schema; give data_schema (the label, "
                "dense and categorical features)"
            )
        self._offsets = [_indexed_records(path) for path in self.files]
        counts = [len(o) - 1 for o in self._offsets]
        self._starts = row_starts(counts)
        first = next((f for f, n in enumerate(counts) if n), None)
        if first is None:
            raise DataSchemaError(f"{self.files[0]}: the TFRecord files hold no record")
        record = _records(self.files[first], self._offsets[first], 0, 1)[0]
        lists = frozenset(c.name for c in schema.categorical if c.multivalued)
        self._arrow_schema = example_schema(record, self.files[first], lists)
        self.layout = layout_for(self._arrow_schema, schema, self.files[first])

    def _rows(self, f: int, first: int, last: int) -> pa.Table:
        if first == last:
            return self._table([], self.files[f])
        records = _records(self.files[f], self._offsets[f], first, last)
        return self._table(records, self._location(f, first))

    def _location(self, f: int, first: int) -> str:
        return f"{self.files[f]} (record {first})"

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
