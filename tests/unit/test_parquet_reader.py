"""Parquet datasets: the global row index across files and row groups, the schema's mapping
to a Batch (labels, normalised dense columns, ids hashed into buckets), and errors that name
the column and what was found."""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_rover.core.data_schema import CategoricalColumnConfig, DataSchema, DenseColumn
from airflow_rover.core.hashing import (
    FNV_OFFSET,
    FNV_PRIME,
    fnv1a64,
    hash_strings,
    splitmix64,
    to_buckets,
)
from airflow_rover.data import arrow_columns, parquet
from airflow_rover.data.arrow_columns import DataSchemaError
from airflow_rover.data.parquet import ParquetReader
from airflow_rover.data.reader import open_dataset

ROWS = 1000


def _fnv1a64_reference(data: bytes) -> int:
    h = int(FNV_OFFSET)
    for byte in data:
        h = ((h ^ byte) * int(FNV_PRIME)) % (1 << 64)
    return h


def _table(rows: int = ROWS, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "clicked": rng.integers(0, 2, rows).astype(np.int8),
            "price": rng.random(rows) * 100,
            "views": rng.integers(0, 1000, rows).astype(np.int32),
            "user": [f"user-{i % 97}" for i in range(rows)],
            "ad": rng.integers(-5, 1 << 40, rows),
        }
    )


SCHEMA = DataSchema(
    label="clicked",
    dense=(
        DenseColumn(name="price", normalize={"mean": 50.0, "std": 25.0}),
        DenseColumn(name="views", normalize="log1p"),
    ),
    categorical=(
        CategoricalColumnConfig(name="user", buckets=1000),
        CategoricalColumnConfig(name="ad"),
    ),
    default_buckets=5000,
)


def _write(directory: Path, table: pa.Table, cuts: tuple[int, ...], group_rows: int) -> None:
    """``table`` as files split at ``cuts``, named so their sorted order is the row order."""
    directory.mkdir(parents=True, exist_ok=True)
    bounds = (0, *cuts, table.num_rows)
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        pq.write_table(
            table.slice(lo, hi - lo), directory / f"part-{i:03d}.parquet", row_group_size=group_rows
        )


def test_fnv1a64_matches_its_definition() -> None:
    """The vectorised FNV-1a equals the byte-by-byte definition (empty, UTF-8, long strings),
    and the published test vector for "a"."""
    strings = ["", "a", "foobar", "user-42", "é✓ünïcode", "x" * 300]
    encoded = [s.encode() for s in strings]
    offsets = np.cumsum([0, *(len(b) for b in encoded)])
    data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    got = fnv1a64(offsets, data)
    assert [int(h) for h in got] == [_fnv1a64_reference(b) for b in encoded]
    assert int(got[1]) == 0xAF63DC4C8601EC8C
    np.testing.assert_array_equal(hash_strings(strings), splitmix64(got))


def test_rows_across_files_and_row_groups_match_the_table(tmp_path: Path) -> None:
    """Any range, inside a row group, across row groups or across files, reads the table's
    rows with the schema applied: labels as floats, dense normalised, ids hashed."""
    table = _table()
    _write(tmp_path, table, cuts=(333, 700), group_rows=64)
    reader = open_dataset(tmp_path, schema=SCHEMA)
    assert isinstance(reader, ParquetReader)
    assert reader.num_samples == ROWS
    assert reader.schema.num_dense == 2
    assert reader.schema.vocab_sizes == (1000, 5000)

    whole = reader.read(0, ROWS)
    np.testing.assert_array_equal(whole.label, table["clicked"].to_numpy().astype(np.float32))
    price = (table["price"].to_numpy().astype(np.float32) - 50) / 25
    np.testing.assert_allclose(whole.dense[:, 0], price, rtol=1e-6)
    views = np.log1p(table["views"].to_numpy().astype(np.float32))
    np.testing.assert_allclose(whole.dense[:, 1], views, rtol=1e-6)
    users = hash_strings(table["user"].to_pylist()) % np.uint64(1000)
    np.testing.assert_array_equal(whole.categorical[:, 0], users.astype(np.int64))
    ads = splitmix64(table["ad"].to_numpy().view(np.uint64)) % np.uint64(5000)
    np.testing.assert_array_equal(whole.categorical[:, 1], ads.astype(np.int64))

    for start, stop in ((0, 0), (5, 60), (60, 70), (300, 400), (330, 710), (999, 1000)):
        part = ParquetReader(reader.files, SCHEMA).read(start, stop)  # a cold cache too
        for got in (part, reader.read(start, stop)):
            assert len(got) == stop - start
            np.testing.assert_array_equal(got.categorical, whole.categorical[start:stop])
            np.testing.assert_array_equal(got.dense, whole.dense[start:stop])
            np.testing.assert_array_equal(got.label, whole.label[start:stop])
    with pytest.raises(ValueError, match=r"stop must be in \[start=10, 1000\], got 1001"):
        reader.read(10, 1001)


def test_the_reader_pickles_as_its_files(tmp_path: Path) -> None:
    _write(tmp_path, _table(), cuts=(500,), group_rows=200)
    reader = open_dataset(tmp_path, schema=SCHEMA)
    copy = pickle.loads(pickle.dumps(reader))
    assert len(pickle.dumps(reader)) < 2000
    expected = reader.read(400, 600).categorical
    np.testing.assert_array_equal(copy.read(400, 600).categorical, expected)


def test_schema_inferred_from_parquet_metadata(tmp_path: Path) -> None:
    """Without data_schema: ``label``, floats dense, ints and strings categorical."""
    table = _table().rename_columns(["label", "price", "views", "user", "ad"])
    _write(tmp_path, table, cuts=(), group_rows=500)
    reader = open_dataset(tmp_path / "part-000.parquet")
    assert reader.schema.num_dense == 1
    assert [c.name for c in reader.schema.categorical] == ["views", "user", "ad"]
    assert reader.read(0, 10).categorical.shape == (10, 3)


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (
            DataSchema(label="clicked", categorical=(CategoricalColumnConfig(name="usr"),)),
            r"categorical column 'usr' is missing; the columns found: clicked, price, views, "
            r"user, ad, tags",
        ),
        (
            DataSchema(label="user", categorical=(CategoricalColumnConfig(name="ad"),)),
            r"label column 'user' holds string; accepted: bool, int, float",
        ),
        (
            DataSchema(
                label="clicked",
                dense=(DenseColumn(name="tags"),),
                categorical=(CategoricalColumnConfig(name="ad"),),
            ),
            r"dense column 'tags' holds list<string> \(a list where a scalar was expected\)",
        ),
        (
            DataSchema(
                label="clicked",
                dense=(DenseColumn(name="user"),),
                categorical=(CategoricalColumnConfig(name="ad"),),
            ),
            r"dense column 'user' holds string; accepted: bool, int, float",
        ),
    ],
)
def test_schema_errors_name_the_column(tmp_path: Path, schema: DataSchema, expected: str) -> None:
    table = _table(50).append_column("tags", pa.array([["a", "b"]] * 50))
    _write(tmp_path, table, cuts=(), group_rows=50)
    with pytest.raises(DataSchemaError, match=expected) as info:
        open_dataset(tmp_path, schema=schema)
    assert "part-000.parquet" in str(info.value)


def test_a_later_file_without_a_column_is_named(tmp_path: Path) -> None:
    _write(tmp_path, _table(), cuts=(), group_rows=500)
    pq.write_table(_table(10).drop_columns(["user"]), tmp_path / "part-001.parquet")
    with pytest.raises(DataSchemaError, match=r"part-001\.parquet: categorical column 'user'"):
        open_dataset(tmp_path, schema=SCHEMA)


def test_a_null_label_names_the_row_and_null_ids_hash_as_empty(tmp_path: Path) -> None:
    table = pa.table(
        {
            "label": pa.array([1.0, 0.0, 1.0]),
            "user": pa.array(["a", None, ""]),
            "n": pa.array([3, None, 0]),
        }
    )
    pq.write_table(table, tmp_path / "x.parquet")
    batch = open_dataset(tmp_path).read(0, 3)
    assert batch.categorical[1, 0] == batch.categorical[2, 0]  # null as ""
    assert batch.categorical[1, 1] == batch.categorical[2, 1]  # null as 0
    pq.write_table(table.set_column(0, "label", pa.array([1.0, None, 0.0])), tmp_path / "x.parquet")
    with pytest.raises(DataSchemaError, match=r"label column 'label' is null at row 1"):
        open_dataset(tmp_path).read(0, 3)


def test_mixed_formats_and_unknown_files_are_refused(tmp_path: Path) -> None:
    _write(tmp_path, _table(20), cuts=(), group_rows=20)
    (tmp_path / "_SUCCESS").write_text("")  # skipped
    assert open_dataset(tmp_path, schema=SCHEMA).num_samples == 20
    (tmp_path / "extra.csv").write_text("a\n")
    with pytest.raises(ValueError, match=r"files of several formats: csv \(.*extra\.csv\)"):
        open_dataset(tmp_path, schema=SCHEMA)


def test_files_below_hidden_folders_are_skipped(tmp_path: Path) -> None:
    """A Spark write in progress (``_temporary/0/...``) or a hidden folder adds no rows; the
    named folder itself may start with ``_``."""
    root = tmp_path / "_staging" / "dt=2026-11-25"
    root.mkdir(parents=True)
    _write(root, _table(20), cuts=(), group_rows=20)
    for hidden in ("_temporary/0/_temporary/attempt_1", ".spark-staging"):
        (root / hidden).mkdir(parents=True)
        _write(root / hidden, _table(20), cuts=(), group_rows=20)
    assert open_dataset(root, schema=SCHEMA).num_samples == 20
    assert open_dataset(f"{root}/**/*.parquet", schema=SCHEMA).num_samples == 20


def test_a_list_column_is_read_as_ragged_ids(tmp_path: Path) -> None:
    """Each sample's ids hashed into the buckets, empty and null lists holding none, across
    files and row groups and in any slice of a Batch."""
    tags = [["a", "b"], [], None, ["c"], ["a", None, "d"]] * 40
    table = pa.table({"label": pa.array([1.0, 0.0] * 100), "tags": pa.array(tags)})
    _write(tmp_path, table, cuts=(77,), group_rows=30)
    schema = DataSchema(categorical=(CategoricalColumnConfig(name="tags", combiner="mean"),))
    reader = open_dataset(tmp_path, schema=schema)
    assert reader.schema.categorical == ()
    assert [(c.name, c.combiner) for c in reader.schema.lists] == [("tags", "mean")]
    buckets = schema.default_buckets
    for start, stop in ((0, 200), (25, 95), (76, 78)):
        ragged = reader.read(start, stop).lists[0]
        for i, row in enumerate(tags[start:stop]):
            got = ragged.values[ragged.row_splits[i] : ragged.row_splits[i + 1]]
            names = ["" if v is None else v for v in (row or [])]
            want = to_buckets(hash_strings(names), buckets) if names else np.empty(0, np.int64)
            np.testing.assert_array_equal(got, want)
    whole = reader.read(0, 200)
    part = whole[3:9].lists[0]
    assert part.row_splits.tolist() == [0, 1, 4, 6, 6, 6, 7]
    np.testing.assert_array_equal(part.values, reader.read(3, 9).lists[0].values)


def test_a_row_group_hashes_each_distinct_string_once_in_one_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """String columns are decoded as the dictionaries Parquet stores (no string per row is
    materialised) and every string column's distinct values are hashed in one vectorised pass;
    the ids are those of each row's string hashed on its own, a null as "", and consecutive
    shards of one row group decode it once."""
    rows = 600
    table = pa.table(
        {
            "label": np.arange(rows) % 2 == 0,
            "user": [f"user-{i % 7}" for i in range(rows)],
            "city": [None if i % 5 == 0 else f"city-{i % 3}" for i in range(rows)],
        }
    )
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=rows)
    schema = DataSchema.model_validate(
        {"categorical": [{"name": "user", "buckets": 101}, {"name": "city", "buckets": 13}]}
    )
    hashed: list[int] = []  # strings per hashing pass
    decoded: list[pa.Schema] = []  # the tables of each row group decoded
    string_hashes, to_batch = arrow_columns._string_hashes, parquet.to_batch
    monkeypatch.setattr(
        arrow_columns, "_string_hashes", lambda s: hashed.append(len(s)) or string_hashes(s)
    )
    monkeypatch.setattr(
        parquet, "to_batch", lambda t, *a: decoded.append(t.schema) or to_batch(t, *a)
    )
    reader = open_dataset(tmp_path, schema=schema)
    first, second = reader.read(0, 250), reader.read(250, 600)  # two shards, one row group
    assert len(decoded) == 1
    assert all(pa.types.is_dictionary(decoded[0].field(c).type) for c in ("user", "city"))
    assert hashed == [(7 + 1) + (3 + 1)]  # each column's distinct strings, and "" for nulls
    ids = np.concatenate([first.categorical, second.categorical])
    strings = {
        c: ["" if s is None else s for s in table.column(c).to_pylist()]
        for c in table.column_names[1:]
    }
    np.testing.assert_array_equal(ids[:, 0], to_buckets(hash_strings(strings["user"]), 101))
    np.testing.assert_array_equal(ids[:, 1], to_buckets(hash_strings(strings["city"]), 13))
