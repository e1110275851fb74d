"""Arrow tables to the ``Batch`` a worker consumes, as a ``DataSchema`` says (or as inferred
from the Arrow schema): the label, dense columns normalised, categorical values hashed into
their buckets (``docs/data-formats.md``).

Every reader of a columnar or record format (Parquet, TFRecord, CSV) decodes into Arrow and
converts here, so the schema's checks and the hashing are the same for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_rover.core.data_schema import (
    CategoricalColumnConfig,
    DataSchema,
    DenseColumn,
    Standardize,
)
from airflow_rover.core.hashing import fnv1a64, hash_ints, splitmix64, to_buckets
from airflow_rover.data.batch import Batch, CategoricalColumn, ListColumn, RaggedIds, Schema


class DataSchemaError(ValueError):
    """The files do not match the schema; the message names the column and what was found."""


@dataclass(frozen=True)
class CategoricalField:
    """A categorical column as read: its hashing and bucket count."""

    name: str
    buckets: int
    strings: bool  # string values (else integers)
    hashed: bool = True  # else ids used as they are
    combiner: str = "sum"  # a list column's (``ColumnLayout.lists``)
    table: str | None = None  # shared with other columns (None: the column's own)
    raw: bool = False  # ints as int64, strings by their 64-bit hash, not into buckets

    @property
    def values(self) -> str:
        """What the files hold: ids used as they are, or ints or strings hashed."""
        if not self.hashed:
            return "ids"
        return "strings" if self.strings else "ints"


@dataclass(frozen=True)
class ColumnLayout:
    """The columns a reader decodes and what each becomes in a Batch."""

    label: str
    dense: tuple[DenseColumn, ...]
    categorical: tuple[CategoricalField, ...]
    lists: tuple[CategoricalField, ...] = ()
    weight: str | None = None  # the per-sample loss weight column

    @property
    def columns(self) -> list[str]:
        """The file columns to decode, in a stable order."""
        names = [self.label, *(c.name for c in self.dense), *(c.name for c in self.categorical)]
        return names + [c.name for c in self.lists] + ([self.weight] if self.weight else [])

    @property
    def string_columns(self) -> list[str]:
        """The scalar categorical columns of strings (a reader may decode them as dictionaries:
        each distinct string is then hashed once, none is materialised per row)."""
        return [c.name for c in self.categorical if c.strings and (c.hashed or c.raw)]

    @property
    def schema(self) -> Schema:
        """What a model needs to be built: the dense count, each column's bucket count."""
        return Schema(
            num_dense=len(self.dense),
            categorical=tuple(
                CategoricalColumn(c.name, c.buckets, c.values, c.table, c.raw)
                for c in self.categorical
            ),
            lists=tuple(
                ListColumn(c.name, c.buckets, c.combiner, c.values, c.table, c.raw)
                for c in self.lists
            ),
        )


def _kind(dtype: pa.DataType) -> str:
    """``int``, ``float``, ``bool``, ``string``, ``list<...>`` or the type's own name."""
    if pa.types.is_dictionary(dtype):
        return _kind(dtype.value_type)
    if pa.types.is_boolean(dtype):
        return "bool"
    if pa.types.is_integer(dtype):
        return "int"
    if pa.types.is_floating(dtype):
        return "float"
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "string"
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return "string"
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return f"list<{_kind(dtype.value_type)}>"
    return str(dtype)


def _field_type(arrow_schema: pa.Schema, name: str, role: str, where: str) -> str:
    index = arrow_schema.get_field_index(name)
    if index < 0:
        raise DataSchemaError(
            f"{where}: {role} column {name!r} is missing; the columns found: "
            f"{', '.join(arrow_schema.names)}"
        )
    return _kind(arrow_schema.field(index).type)


def _expect(kind: str, accepted: tuple[str, ...], name: str, role: str, where: str) -> None:
    if kind in accepted:
        return
    hint = ""
    if kind.startswith("list<"):
        hint = " (a list where a scalar was expected)"
    raise DataSchemaError(
        f"{where}: {role} column {name!r} holds {kind}{hint}; accepted: {', '.join(accepted)}"
    )


def layout_for(arrow_schema: pa.Schema, schema: DataSchema | None, where: str) -> ColumnLayout:
    """The layout ``schema`` gives for files of ``arrow_schema`` (inferred when ``schema`` is
    None); DataSchemaError naming the column, what was found and what is accepted."""
    if schema is None:
        schema = infer_schema(arrow_schema, where)
    _expect(
        _field_type(arrow_schema, schema.label, "label", where),
        ("bool", "int", "float"),
        schema.label,
        "label",
        where,
    )
    if schema.weight:
        kind = _field_type(arrow_schema, schema.weight, "weight", where)
        _expect(kind, ("int", "float"), schema.weight, "weight", where)
    for column in schema.dense:
        kind = _field_type(arrow_schema, column.name, "dense", where)
        _expect(kind, ("bool", "int", "float"), column.name, "dense", where)
    scalars: list[CategoricalField] = []
    lists: list[CategoricalField] = []
    for config in schema.categorical:
        field, is_list = _categorical(arrow_schema, schema, config, where)
        (lists if is_list else scalars).append(field)
    return ColumnLayout(schema.label, schema.dense, tuple(scalars), tuple(lists), schema.weight)


def _categorical(
    arrow_schema: pa.Schema, schema: DataSchema, config: CategoricalColumnConfig, where: str
) -> tuple[CategoricalField, bool]:
    """The column as read, and whether it is a list column."""
    kind = _field_type(arrow_schema, config.name, "categorical", where)
    is_list = kind.startswith("list<")
    if config.multivalued is not None and config.multivalued != is_list:
        expected = ("list<int>", "list<string>") if config.multivalued else ("int", "string")
        said = "true" if config.multivalued else "false"
        raise DataSchemaError(
            f"{where}: categorical column {config.name!r} holds {kind}, with multivalued="
            f"{said}; accepted: {', '.join(expected)}"
        )
    if is_list:
        kind = kind[len("list<") : -1]
        accepted: tuple[str, ...] = ("list<int>", "list<string>")
        _expect(f"list<{kind}>", accepted, config.name, "categorical", where)
    else:
        _expect(kind, ("int", "string"), config.name, "categorical", where)
    if not config.hashed and kind != "int":
        raise DataSchemaError(
            f"{where}: categorical column {config.name!r} holds {kind} with hashed=false; "
            "only int ids can be used as they are"
        )
    field = CategoricalField(
        config.name,
        schema.buckets_of(config),
        kind == "string",
        config.hashed,
        config.combiner,
        config.table,
        config.raw,
    )
    return field, is_list


def infer_schema(arrow_schema: pa.Schema, where: str) -> DataSchema:
    """The schema of files written without one: ``label`` is the label, float and bool
    columns are dense, int, string and list columns categorical; other types are refused by name."""
    if arrow_schema.get_field_index("label") < 0:
        raise DataSchemaError(
            f"{where}: no column 'label' to infer the schema from (columns: "
            f"{', '.join(arrow_schema.names)}); give data_schema with the label column"
        )
    dense: list[DenseColumn] = []
    categorical: list[CategoricalColumnConfig] = []
    for field in arrow_schema:
        if field.name == "label":
            continue
        kind = _kind(field.type)
        if kind in ("float", "bool"):
            dense.append(DenseColumn(name=field.name))
        elif kind in ("int", "string", "list<int>", "list<string>"):
            categorical.append(CategoricalColumnConfig(name=field.name))
        else:
            raise DataSchemaError(
                f"{where}: column {field.name!r} holds {kind}, which has no default role "
                "(float, bool: dense; int, string and their lists: categorical); give data_schema "
                "naming the columns to read"
            )
    return DataSchema(dense=tuple(dense), categorical=tuple(categorical))


def to_batch(table: pa.Table, layout: ColumnLayout, where: str) -> Batch:
    """The Batch of ``table``'s rows; a null label raises naming the column and the row."""
    n = table.num_rows
    label = table.column(layout.label)
    if label.null_count:
        row = int(np.argmax(np.asarray(label.is_null())))
        raise DataSchemaError(f"{where}: label column {layout.label!r} is null at row {row}")
    dense = np.empty((n, len(layout.dense)), dtype=np.float32)
    for j, column in enumerate(layout.dense):
        dense[:, j] = _dense_values(table.column(column.name), column)
    categorical = np.empty((n, len(layout.categorical)), dtype=np.int64)
    strings = [f.name for f in layout.categorical if (f.hashed or f.raw) and f.strings]
    hashed = dict(zip(strings, _string_hashes_of([table.column(c) for c in strings]), strict=True))
    for j, field in enumerate(layout.categorical):
        column = table.column(field.name)
        if field.raw:
            categorical[:, j] = _raw_keys(column, hashed.get(field.name))
        elif field.name in hashed:
            categorical[:, j] = to_buckets(hashed[field.name], field.buckets)
        elif field.hashed:
            categorical[:, j] = to_buckets(_hashes(column, field), field.buckets)
        else:
            categorical[:, j] = pc.fill_null(column, 0).cast(pa.int64()).to_numpy()
    lists = tuple(_ragged(table.column(field.name), field) for field in layout.lists)
    weight = None
    if layout.weight is not None:
        weight = _weights(table.column(layout.weight), layout.weight, where)
    return Batch(dense, categorical, _floats(label), lists, weight)


def _weights(column: pa.ChunkedArray, name: str, where: str) -> np.ndarray:
    """The loss weights; a null, negative or not finite weight raises naming the column and
    the row (a negative weight would train the model away from the label)."""
    values = _floats(pc.fill_null(column.cast(pa.float64()), -1.0))
    bad = np.flatnonzero(~(np.isfinite(values) & (values >= 0)))
    if bad.size:
        row = int(bad[0])
        found = "null" if column[row].as_py() is None else repr(column[row].as_py())
        raise DataSchemaError(
            f"{where}: weight column {name!r} holds {found} at row {row}; a weight is a "
            "finite number >= 0"
        )
    return values


def _ragged(column: pa.ChunkedArray, field: CategoricalField) -> RaggedIds:
    """A list column's ids, hashed into its buckets (``raw``: its keys, as a scalar column's);
    a null list holds no id."""
    lengths = pc.fill_null(pc.list_value_length(column), 0).cast(pa.int64()).to_numpy()
    row_splits = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=row_splits[1:])
    values = pa.chunked_array([pc.list_flatten(column)])
    if field.raw:
        ids = _raw_keys(values, _string_hashes_of([values])[0] if field.strings else None)
    elif field.hashed:
        ids = to_buckets(_hashes(values, field), field.buckets)
    else:
        ids = pc.fill_null(values, 0).cast(pa.int64()).to_numpy()
    return RaggedIds(np.ascontiguousarray(ids, dtype=np.int64), row_splits)


def _floats(column: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(column.cast(pa.float32()).to_numpy(), dtype=np.float32)


def _dense_values(column: pa.ChunkedArray, config: DenseColumn) -> np.ndarray:
    values = _floats(pc.fill_null(column.cast(pa.float64()), 0.0))
    normalize = config.normalize
    if isinstance(normalize, Standardize):
        values = (values - np.float32(normalize.mean)) / np.float32(normalize.std)
    elif normalize == "log1p":
        values = np.log1p(np.maximum(values, 0))
    return values


def _raw_keys(column: pa.ChunkedArray, string_hashes: np.ndarray | None) -> np.ndarray:
    """A raw column's int64 keys: its strings' 64-bit hashes (bits as int64), else its ints
    as they are (a null as 0, as the hashed columns read it)."""
    if string_hashes is not None:
        return string_hashes.view(np.int64)
    return np.asarray(pc.fill_null(column, 0).cast(pa.int64()).to_numpy(), dtype=np.int64)


def _hashes(column: pa.ChunkedArray, field: CategoricalField) -> np.ndarray:
    """uint64 hash of each value: ints by ``hash_ints``, strings by splitmix64(FNV-1a)."""
    if not field.strings:
        return hash_ints(pc.fill_null(column, 0).cast(pa.int64()).to_numpy())
    return _string_hashes_of([column])[0]


_EMPTY_STRING = pa.array([""], pa.large_string())


def _string_hashes_of(columns: list[pa.ChunkedArray]) -> list[np.ndarray]:
    """uint64 hash of each value of the string ``columns`` (a null as ``""``): the distinct
    strings of every chunk of every column (a dictionary chunk's as they are) hashed together,
    in one vectorised pass."""
    pieces: list[tuple[int, pa.Array, np.ndarray]] = []  # column, distinct strings, indices
    for i, column in enumerate(columns):
        for chunk in column.chunks:
            if not pa.types.is_dictionary(chunk.type):
                chunk = chunk.cast(pa.large_string()).dictionary_encode()  # a null: no index
            distinct = pc.fill_null(chunk.dictionary.cast(pa.large_string()), "")
            indices = pc.fill_null(chunk.indices, len(distinct)).to_numpy()  # the "" after them
            pieces.append((i, pa.concat_arrays([distinct, _EMPTY_STRING]), indices))
    if not pieces:
        return [np.empty(0, np.uint64) for _ in columns]
    hashes = _string_hashes(pa.concat_arrays([distinct for _, distinct, _ in pieces]))
    parts: list[list[np.ndarray]] = [[] for _ in columns]
    at = 0
    for i, distinct, indices in pieces:
        parts[i].append(hashes[at : at + len(distinct)][indices])
        at += len(distinct)
    return [np.concatenate(p) if p else np.empty(0, np.uint64) for p in parts]


def _string_hashes(strings: pa.Array) -> np.ndarray:
    strings = strings.cast(pa.large_string())
    _, offsets, data = strings.buffers()
    count = len(strings)
    first = strings.offset
    offset_array = np.frombuffer(offsets, dtype=np.int64)[first : first + count + 1]
    data_array = np.frombuffer(data, dtype=np.uint8) if data is not None else np.empty(0, np.uint8)
    return splitmix64(fnv1a64(offset_array, data_array))


def serving_columns(table: pa.Table, layout: ColumnLayout) -> dict[str, np.ndarray]:
    """The categorical inputs a served model takes for ``table``'s rows (``docs/serving.md``):
    each column's raw values (strings as bytes, ints as int64; a null as the readers read it),
    a list column's values one after the other and ``<column>_lengths``."""
    out: dict[str, np.ndarray] = {}
    for field in layout.categorical:
        out[field.name] = _raw_values(table.column(field.name), field)
    for field in layout.lists:
        column = table.column(field.name)
        values = pa.chunked_array([pc.list_flatten(column)])
        out[field.name] = _raw_values(values, field)
        lengths = pc.fill_null(pc.list_value_length(column), 0).cast(pa.int64())
        out[f"{field.name}_lengths"] = lengths.to_numpy()
    return out


def _raw_values(column: pa.ChunkedArray, field: CategoricalField) -> np.ndarray:
    if field.strings:
        strings = pc.fill_null(column.cast(pa.large_binary()), b"").to_pylist()
        return np.array(strings, dtype=object)
    return np.asarray(pc.fill_null(column, 0).cast(pa.int64()).to_numpy(), dtype=np.int64)
