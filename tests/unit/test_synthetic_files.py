"""The synthetic rows written as Parquet read back as the npy-columns split's rows: integer ids
as they are, string ids hashed into their buckets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from airflow_rover.core.data_schema import CategoricalColumnConfig, DataSchema
from airflow_rover.core.hashing import hash_strings, to_buckets
from airflow_rover.data.arrow_columns import DataSchemaError
from airflow_rover.data.reader import open_dataset
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.data.synthetic_files import parquet_schema, write_parquet


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    return generate_dataset(root, SyntheticConfig(num_train=3000, num_eval=500, seed=2)).train_dir


def test_integer_ids_read_back_as_the_npy_rows(split: Path, tmp_path: Path) -> None:
    out = write_parquet(split, tmp_path / "pq", num_files=3, rows_per_group=700)
    reader = open_dataset(out, schema=parquet_schema(split, string_ids=False))
    expected = open_dataset(split)
    assert reader.schema == expected.schema
    for start, stop in ((0, 3000), (650, 1450), (2999, 3000)):
        got, want = reader.read(start, stop), expected.read(start, stop)
        np.testing.assert_array_equal(got.dense, want.dense)
        np.testing.assert_array_equal(got.categorical, want.categorical)
        np.testing.assert_array_equal(got.label, want.label)


def test_string_ids_are_hashed_into_their_buckets(split: Path, tmp_path: Path) -> None:
    out = write_parquet(split, tmp_path / "pq", num_files=2, string_ids=True)
    schema = parquet_schema(split, string_ids=True, buckets_per_id=4)
    reader = open_dataset(out, schema=schema)
    want = open_dataset(split).read(0, 3000)
    got = reader.read(0, 3000)
    np.testing.assert_array_equal(got.dense, want.dense)
    first = reader.schema.categorical[0]
    assert first.vocab_size == 4 * open_dataset(split).schema.categorical[0].vocab_size
    names = [f"{first.name}:{i}" for i in want.categorical[:, 0].tolist()]
    np.testing.assert_array_equal(
        got.categorical[:, 0], to_buckets(hash_strings(names), first.vocab_size)
    )


def test_strings_cannot_be_used_unhashed(split: Path, tmp_path: Path) -> None:
    out = write_parquet(split, tmp_path / "pq", num_files=1, string_ids=True)
    schema = DataSchema(categorical=(CategoricalColumnConfig(name="C3", hashed=False),))
    with pytest.raises(DataSchemaError, match=r"column 'C3' holds string with hashed=false"):
        open_dataset(out, schema=schema)


def test_the_list_column_is_derived_from_the_rows_own_ids(split: Path, tmp_path: Path) -> None:
    """``bag``: the first C4 mod 4 of C1..C3's strings, so the labels stay as generated; with
    the schema's shared table its first value reads C1's row."""
    out = write_parquet(split, tmp_path / "pq", num_files=1, string_ids=True, list_column=True)
    npy = open_dataset(split).read(0, 200)
    schema = parquet_schema(split, string_ids=True, list_column=True)
    batch = open_dataset(out, schema=schema).read(0, 200)
    bag = batch.lists[0]
    np.testing.assert_array_equal(np.diff(bag.row_splits), npy.categorical[:, 3] % 4)
    np.testing.assert_array_equal(batch.label, npy.label)
    first = bag.row_splits[:-1][np.diff(bag.row_splits) > 0]
    holders = np.nonzero(np.diff(bag.row_splits) > 0)[0]
    np.testing.assert_array_equal(bag.values[first], batch.categorical[holders, 0])
