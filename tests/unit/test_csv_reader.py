"""CSV datasets: line offsets across files, the same rows as Parquet, errors naming the file,
the line and the column."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from airflow_rover.core.data_schema import CategoricalColumnConfig, DataSchema
from airflow_rover.data.arrow_columns import DataSchemaError
from airflow_rover.data.csv_files import CsvReader
from airflow_rover.data.reader import open_dataset
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.data.synthetic_files import parquet_schema, write_csv, write_parquet


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    return generate_dataset(root, SyntheticConfig(num_train=1500, num_eval=200, seed=7)).train_dir


@pytest.mark.parametrize("string_ids", [False, True])
def test_lines_read_back_as_the_parquet_rows(split: Path, tmp_path: Path, string_ids: bool) -> None:
    lines = write_csv(split, tmp_path / "csv", num_files=3, string_ids=string_ids)
    files = write_parquet(split, tmp_path / "pq", num_files=2, string_ids=string_ids)
    schema = parquet_schema(split, string_ids=string_ids)
    reader = open_dataset(lines, schema=schema)
    assert isinstance(reader, CsvReader)
    assert reader.num_samples == 1500
    expected = open_dataset(files, schema=schema)
    for start, stop in ((0, 1500), (0, 0), (490, 510), (499, 1001), (1499, 1500)):
        got, want = reader.read(start, stop), expected.read(start, stop)
        np.testing.assert_array_equal(got.categorical, want.categorical)
        np.testing.assert_allclose(got.dense, want.dense, rtol=1e-6)
        np.testing.assert_array_equal(got.label, want.label)
    copy = pickle.loads(pickle.dumps(reader))
    np.testing.assert_array_equal(copy.read(5, 9).categorical, reader.read(5, 9).categorical)


def test_a_bad_value_names_the_file_and_lines(tmp_path: Path) -> None:
    rows = ["label,user,price"] + [f"{i % 2},{i},{i * 0.5}" for i in range(1200)]
    rows[1100] = "1,not-a-number,3.0"  # after the lines the types are inferred from
    (tmp_path / "a.csv").write_text("\n".join(rows) + "\n")
    schema = DataSchema(categorical=(CategoricalColumnConfig(name="user"),))
    reader = open_dataset(tmp_path, schema=schema)
    assert reader.num_samples == 1200
    reader.read(0, 1000)
    with pytest.raises(DataSchemaError, match=r"a\.csv \(lines 1002-1201\): .*user"):
        reader.read(1000, 1200)


def test_headers_must_agree_and_a_schema_is_required(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("label,user\n1,3\n")
    (tmp_path / "b.csv").write_text("label,usr\n0,4")  # no final newline
    schema = DataSchema(categorical=(CategoricalColumnConfig(name="user"),))
    with pytest.raises(DataSchemaError, match=r"b\.csv: its header differs from .*a\.csv"):
        open_dataset(tmp_path, schema=schema)
    with pytest.raises(DataSchemaError, match=r"give data_schema for CSV files"):
        open_dataset(tmp_path / "a.csv")
    (tmp_path / "b.csv").write_text("label,user\n0,4")
    assert open_dataset(tmp_path, schema=schema).read(0, 2).categorical.shape == (2, 1)


def test_a_multivalued_column_reads_back_as_the_parquet_lists(split: Path, tmp_path: Path) -> None:
    """``bag``'s cells (``C1:5|C2:7``, empty for none) split at ``|`` as Parquet's list."""
    lines = write_csv(split, tmp_path / "csv", num_files=2, string_ids=True, list_column=True)
    files = write_parquet(split, tmp_path / "pq", num_files=2, string_ids=True, list_column=True)
    schema = parquet_schema(split, string_ids=True, list_column=True)
    reader, expected = open_dataset(lines, schema=schema), open_dataset(files, schema=schema)
    assert reader.schema == expected.schema
    for start, stop in ((0, reader.num_samples), (0, 0), (3, 9)):
        got, want = reader.read(start, stop), expected.read(start, stop)
        np.testing.assert_array_equal(got.lists[0].values, want.lists[0].values)
        np.testing.assert_array_equal(got.lists[0].row_splits, want.lists[0].row_splits)
        np.testing.assert_array_equal(got.categorical, want.categorical)
