"""The synthetic dataset's rows written as Parquet, TFRecord or CSV files, for tests and benches
of the file readers: the same samples as the npy-columns split they come from, so a model trained on
either can be compared (``docs/data-formats.md``).

Dense columns are ``I1``..``In`` (float32), categorical ones ``C1``..``Cm``: integers, or with
``string_ids`` strings ``"<column>:<id>"`` (hashed into buckets when read), the label
``label``. With ``list_column`` a list<string> column ``bag`` is added, derived from the row's
own ids so the labels stay as generated: the first ``C4 mod 4`` of ``"C1:<id>"``,
``"C2:<id>"``, ``"C3:<id>"`` (zero to three values; the teacher reads those columns, so its ids
carry signal), the same strings as ``C1``..``C3``'s with ``string_ids``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from airflow_rover.core.data_schema import CategoricalColumnConfig, DataSchema, DenseColumn
from airflow_rover.data.reader import NpyColumnsReader, open_dataset

ROWS_PER_GROUP = 8192  # a row group per default shard: a shard decodes one


def parquet_schema(
    split_dir: str | os.PathLike[str],
    *,
    string_ids: bool,
    buckets_per_id: int = 8,
    list_column: bool = False,
) -> DataSchema:
    """The DataSchema of ``write_parquet``'s files: string ids hashed into ``buckets_per_id``
    times the column's vocabulary (few collisions), integer ids used as they are; with
    ``list_column``, ``bag`` (mean) sharing C1's table, both hashed into C1's buckets."""
    schema = open_dataset(split_dir).schema
    categorical = tuple(
        CategoricalColumnConfig(
            name=c.name,
            buckets=c.vocab_size * (buckets_per_id if string_ids else 1),
            hashed=string_ids,
        )
        for c in schema.categorical
    )
    if list_column:
        first = categorical[0]
        buckets = (first.buckets or 1) * (1 if string_ids else buckets_per_id)
        shared = (
            first.model_copy(update={"table": "shared", "hashed": True, "buckets": buckets}),
            CategoricalColumnConfig(
                name=LIST_COLUMN, buckets=buckets, table="shared", combiner="mean", multivalued=True
            ),
        )
        categorical = shared + categorical[1:]
    dense = tuple(DenseColumn(name=f"I{i + 1}") for i in range(schema.num_dense))
    return DataSchema(label="label", dense=dense, categorical=categorical)


def write_parquet(
    split_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    num_files: int = 4,
    string_ids: bool = False,
    rows_per_group: int = ROWS_PER_GROUP,
    list_column: bool = False,
) -> Path:
    """Write the npy-columns split ``split_dir`` to ``out_dir/part-NNNNN.parquet`` (the rows
    in order across up to ``num_files`` files, each a whole number of row groups, so shards of
    ``rows_per_group`` rows each decode one); returns ``out_dir``."""
    files = _file_tables(
        split_dir, out_dir, "parquet", num_files, string_ids, list_column, rows_per_group
    )
    for table, path in files:
        pq.write_table(table, path, row_group_size=rows_per_group)
    return Path(out_dir)


def _file_tables(
    split_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    suffix: str,
    num_files: int,
    string_ids: bool,
    list_column: bool,
    rows_per_group: int | None = None,
) -> Iterator[tuple[pa.Table, Path]]:
    """The split's rows in order, cut into ``num_files`` files of about equal size (with
    ``rows_per_group``: up to ``num_files`` files of whole groups), each as an Arrow table and
    the path it is written to, ``out_dir/part-NNNNN.<suffix>`` (``out_dir`` created)."""
    reader = NpyColumnsReader(split_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bounds = _file_bounds(reader.num_samples, num_files, rows_per_group)
    for index, (start, stop) in enumerate(itertools.pairwise(bounds)):
        table = _table(reader, int(start), int(stop), string_ids, list_column)
        yield table, out / f"part-{index:05d}.{suffix}"


def _file_bounds(num_samples: int, num_files: int, rows_per_group: int | None) -> np.ndarray:
    """Where each file's rows start, then the end (see ``_file_tables``)."""
    if rows_per_group is None:
        return np.linspace(0, num_samples, num_files + 1).astype(int)
    groups = -(-num_samples // rows_per_group)
    cuts = np.linspace(0, groups, min(num_files, max(groups, 1)) + 1).astype(int)
    return np.minimum(cuts * rows_per_group, num_samples)


def _table(
    reader: NpyColumnsReader, start: int, stop: int, string_ids: bool, list_column: bool = False
) -> pa.Table:
    batch = reader.read(start, stop)
    columns: dict[str, pa.Array] = {"label": pa.array(batch.label)}
    for j in range(batch.dense.shape[1]):
        columns[f"I{j + 1}"] = pa.array(batch.dense[:, j])
    for j, column in enumerate(reader.schema.categorical):
        ids = batch.categorical[:, j]
        if string_ids:
            columns[column.name] = pa.array([f"{column.name}:{i}" for i in ids.tolist()])
        else:
            columns[column.name] = pa.array(ids)
    if list_column:
        columns[LIST_COLUMN] = _bag(batch.categorical)
    return pa.table(columns)


LIST_COLUMN = "bag"


def _bag(categorical: np.ndarray) -> pa.Array:
    """``bag``: per row the first ``C4 mod 4`` of ``"C1:<id>"``, ``"C2:<id>"``, ``"C3:<id>"``."""
    lengths = categorical[:, 3] % 4
    tokens = [
        [f"C{j + 1}:{row[j]}" for j in range(n)]
        for row, n in zip(categorical.tolist(), lengths.tolist(), strict=True)
    ]
    return pa.array(tokens, pa.list_(pa.string()))


def write_tfrecord(
    split_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    num_files: int = 4,
    string_ids: bool = False,
    list_column: bool = False,
) -> Path:
    """Write the npy-columns split ``split_dir`` to ``out_dir/part-NNNNN.tfrecord``: one
    ``tf.train.Example`` per row, the features named as in ``write_parquet``."""
    import tensorflow as tf

    files = _file_tables(split_dir, out_dir, "tfrecord", num_files, string_ids, list_column)
    for table, path in files:
        with tf.io.TFRecordWriter(str(path)) as writer:
            for row in table.to_pylist():
                writer.write(_example(row).SerializeToString())
    return Path(out_dir)


def _example(row: dict[str, Any]) -> Any:
    import tensorflow as tf

    features = {}
    for name, value in row.items():
        if isinstance(value, list):  # a list<string> column
            values = [v.encode() for v in value]
            features[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        elif isinstance(value, str):
            features[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
        elif isinstance(value, int):
            features[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        else:
            features[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(value)]))
    return tf.train.Example(features=tf.train.Features(feature=features))


def write_csv(
    split_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    num_files: int = 4,
    string_ids: bool = False,
    list_column: bool = False,
) -> Path:
    """Write the npy-columns split ``split_dir`` to ``out_dir/part-NNNNN.csv``, a header line
    each, the columns named as in ``write_parquet`` (``bag``'s values separated by ``|``)."""
    files = _file_tables(split_dir, out_dir, "csv", num_files, string_ids, list_column)
    for table, path in files:
        if list_column:
            cells = pa.array(["|".join(bag) for bag in table.column(LIST_COLUMN).to_pylist()])
            table = table.set_column(table.schema.get_field_index(LIST_COLUMN), LIST_COLUMN, cells)
        pacsv.write_csv(table, path)
    return Path(out_dir)
