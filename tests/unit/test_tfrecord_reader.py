"""TFRecord datasets of tf.train.Example: the record index across files, the same rows as the
npy-columns split they were written from, and errors naming the feature."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from airflow_rover.core.data_schema import CategoricalColumnConfig, DataSchema, DenseColumn
from airflow_rover.data import tfrecord
from airflow_rover.data.arrow_columns import DataSchemaError
from airflow_rover.data.reader import open_dataset
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.data.synthetic_files import parquet_schema, write_parquet, write_tfrecord
from airflow_rover.data.tfrecord import TFRecordReader, record_offsets


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    return generate_dataset(root, SyntheticConfig(num_train=1200, num_eval=200, seed=6)).train_dir


@pytest.mark.parametrize("string_ids", [False, True])
def test_records_read_back_as_the_parquet_rows(
    split: Path, tmp_path: Path, string_ids: bool
) -> None:
    """Any range, inside a file or across files, equals the same rows written as Parquet."""
    records = write_tfrecord(split, tmp_path / "tfr", num_files=3, string_ids=string_ids)
    files = write_parquet(split, tmp_path / "pq", num_files=2, string_ids=string_ids)
    schema = parquet_schema(split, string_ids=string_ids)
    reader = open_dataset(records, schema=schema)
    assert isinstance(reader, TFRecordReader)
    assert reader.num_samples == 1200
    expected = open_dataset(files, schema=schema)
    assert reader.schema == expected.schema
    for start, stop in ((0, 1200), (0, 0), (390, 410), (399, 801), (1199, 1200)):
        got, want = reader.read(start, stop), expected.read(start, stop)
        np.testing.assert_array_equal(got.categorical, want.categorical)
        np.testing.assert_array_equal(got.dense, want.dense)
        np.testing.assert_array_equal(got.label, want.label)
    copy = pickle.loads(pickle.dumps(reader))
    np.testing.assert_array_equal(copy.read(5, 9).categorical, reader.read(5, 9).categorical)


@pytest.mark.parametrize("chunk", [7, 100, 1 << 20])
def test_the_index_holds_each_records_offset(
    split: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Whatever the read size: headers split between chunks, records longer than a chunk."""
    monkeypatch.setattr(tfrecord, "CHUNK", chunk)
    records = write_tfrecord(split, tmp_path / "tfr", num_files=1)
    path = records / "part-00000.tfrecord"
    offsets = record_offsets(str(path))
    data = path.read_bytes()
    lengths = [int.from_bytes(data[o : o + 8], "little") for o in offsets[:-1]]
    np.testing.assert_array_equal(np.diff(offsets), np.array(lengths) + 16)
    assert len(offsets) == 1201
    assert offsets[0] == 0 and offsets[-1] == path.stat().st_size
    assert (np.diff(offsets) > 16).all()


def test_a_schema_is_required_and_checked(split: Path, tmp_path: Path) -> None:
    records = write_tfrecord(split, tmp_path / "tfr", num_files=1, string_ids=True)
    with pytest.raises(DataSchemaError, match=r"Examples carry no schema; give data_schema"):
        open_dataset(records)
    schema = DataSchema(
        dense=(DenseColumn(name="C2"),), categorical=(CategoricalColumnConfig(name="C1"),)
    )
    with pytest.raises(DataSchemaError, match=r"dense column 'C2' holds string; accepted"):
        open_dataset(records, schema=schema)
    schema = DataSchema(categorical=(CategoricalColumnConfig(name="user"),))
    with pytest.raises(DataSchemaError, match=r"categorical column 'user' is missing; the col"):
        open_dataset(records, schema=schema)


def test_a_list_feature_reads_back_as_the_parquet_lists(split: Path, tmp_path: Path) -> None:
    """``bag`` holds zero to three strings per record: a list the schema says is multivalued
    (its first record may hold one value), read as Parquet's list column is."""
    records = write_tfrecord(
        split, tmp_path / "tfr", num_files=2, string_ids=True, list_column=True
    )
    files = write_parquet(split, tmp_path / "pq", num_files=2, string_ids=True, list_column=True)
    schema = parquet_schema(split, string_ids=True, list_column=True)
    reader, expected = open_dataset(records, schema=schema), open_dataset(files, schema=schema)
    assert reader.schema == expected.schema
    assert [c.name for c in reader.schema.lists] == ["bag"]
    for start, stop in ((0, 1200), (0, 0), (599, 601), (7, 8)):
        got, want = reader.read(start, stop).lists[0], expected.read(start, stop).lists[0]
        np.testing.assert_array_equal(got.values, want.values)
        np.testing.assert_array_equal(got.row_splits, want.row_splits)


def test_a_feature_said_multivalued_that_is_a_scalar_in_parquet_is_named(
    split: Path, tmp_path: Path
) -> None:
    files = write_parquet(split, tmp_path / "pq", num_files=1)
    said = CategoricalColumnConfig(name="C1", multivalued=True)
    schema = DataSchema(categorical=(said,))
    with pytest.raises(
        DataSchemaError, match=r"'C1' holds int, with multivalued=true; accepted: l"
    ):
        open_dataset(files, schema=schema)


def test_serving_columns_are_the_raw_values_in_every_format(split: Path, tmp_path: Path) -> None:
    """What a served model takes: the strings as written (not hashed), a list's values one
    after the other and its lengths; the same from Parquet, TFRecord and CSV."""
    from airflow_rover.data.synthetic_files import write_csv

    schema = parquet_schema(split, string_ids=True, list_column=True)
    kw = {"num_files": 2, "string_ids": True, "list_column": True}
    readers = [
        open_dataset(write(split, tmp_path / name, **kw), schema=schema)
        for name, write in (("pq", write_parquet), ("tfr", write_tfrecord), ("csv", write_csv))
    ]
    npy = open_dataset(split).read(598, 603)
    want = readers[0].serving_columns(598, 603)
    assert want["C2"].tolist() == [f"C2:{i}".encode() for i in npy.categorical[:, 1]]
    np.testing.assert_array_equal(want["bag_lengths"], npy.categorical[:, 3] % 4)
    assert want["bag"].size == want["bag_lengths"].sum()
    for reader in readers[1:]:
        got = reader.serving_columns(598, 603)
        assert got.keys() == want.keys()
        for name, values in want.items():
            assert got[name].tolist() == values.tolist(), name
