"""The TFRecord record index and the CSV line index are found once per file and kept: a second
open of the same files scans none of them, a rewritten file is scanned again, and a kept index
that is corrupt or not of its file is rebuilt, never trusted."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from airflow_rover.core.data_schema import DataSchema
from airflow_rover.data import csv_files, tfrecord
from airflow_rover.data.offset_index import ENV_INDEX_DIR, SUFFIX, file_identity
from airflow_rover.data.reader import open_dataset

SCHEMA = DataSchema.model_validate(
    {"dense": [{"name": "x"}], "categorical": [{"name": "ad", "buckets": 64}]}
)


def _rows(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "label": rng.integers(0, 2, n).astype(np.float32),
        "x": rng.random(n).astype(np.float32),
        "ad": rng.integers(0, 1000, n),
    }


def _write_csv(path: Path, n: int, seed: int) -> None:
    pacsv.write_csv(pa.table(_rows(n, seed)), path)


def _write_tfrecord(path: Path, n: int, seed: int) -> None:
    import tensorflow as tf

    rows = _rows(n, seed)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(n):
            feature = {
                "label": tf.train.Feature(float_list=tf.train.FloatList(value=[rows["label"][i]])),
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[rows["x"][i]])),
                "ad": tf.train.Feature(int64_list=tf.train.Int64List(value=[rows["ad"][i]])),
            }
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())


FORMATS: dict[str, tuple[Any, str, Callable[[Path, int, int], None]]] = {
    "csv": (csv_files, "line_offsets", _write_csv),
    "tfrecord": (tfrecord, "record_offsets", _write_tfrecord),
}


def _counting_scans(monkeypatch: pytest.MonkeyPatch, fmt: str) -> list[str]:
    """The paths the format's scanner reads from end to end, as it is called."""
    module, name, _ = FORMATS[fmt]
    scan = getattr(module, name)
    scanned: list[str] = []

    def counted(path: str) -> Any:
        scanned.append(path)
        return scan(path)

    monkeypatch.setattr(module, name, counted)
    return scanned


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_second_open_scans_no_file_and_a_rewritten_one_is_scanned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    write = FORMATS[fmt][2]
    files = [tmp_path / f"part-{i}.{fmt}" for i in range(2)]
    for i, path in enumerate(files):
        write(path, 300, i)
    scanned = _counting_scans(monkeypatch, fmt)
    first = open_dataset(tmp_path, schema=SCHEMA)
    assert sorted(scanned) == [str(p) for p in files]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(SUFFIX)) == [
        f".part-0.{fmt}{SUFFIX}",
        f".part-1.{fmt}{SUFFIX}",
    ]  # beside the data, hidden: not a data file of the dataset
    scanned.clear()
    again = open_dataset(tmp_path, schema=SCHEMA)
    assert scanned == []
    assert again.num_samples == first.num_samples == 600
    np.testing.assert_array_equal(
        again.read(250, 350).categorical, first.read(250, 350).categorical
    )

    write(files[1], 120, 9)  # the ETL rewrote one file
    rewritten = open_dataset(tmp_path, schema=SCHEMA)
    assert scanned == [str(files[1])]
    assert rewritten.num_samples == 420
    np.testing.assert_array_equal(rewritten.read(300, 420).label, _rows(120, 9)["label"])


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_the_same_size_rewritten_is_scanned_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """Size and modification time both name the file: a new mtime alone rescans."""
    path = tmp_path / f"part-0.{fmt}"
    FORMATS[fmt][2](path, 50, 1)
    open_dataset(tmp_path, schema=SCHEMA)
    scanned = _counting_scans(monkeypatch, fmt)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    open_dataset(tmp_path, schema=SCHEMA)
    assert scanned == [str(path)]


def _index(path: Path) -> Path:
    return path.with_name(f".{path.name}{SUFFIX}")


def _forge(kept: Path, path: Path, kind: str, offsets: np.ndarray) -> None:
    np.savez(
        kept,
        kind=np.str_(kind),
        identity=np.str_(file_identity(str(path))[0]),
        version=np.int64(1),
        offsets=offsets.astype(np.int64),
        header=np.frombuffer(b"label,x,ad\n", np.uint8),
    )


@pytest.mark.parametrize(
    "spoil",
    [
        lambda kept, path: kept.write_bytes(b"PK\x03\x04 half an index"),
        lambda kept, path: kept.write_bytes(b""),
        # an index claiming to be of this very file, whose offsets do not end at its size
        lambda kept, path: _forge(kept, path, "csv", np.array([10, 20], np.int64)),
        # a sound index of another kind for the same file
        lambda kept, path: _forge(kept, path, "tfrecord", np.array([0, path.stat().st_size])),
    ],
    ids=["truncated", "empty", "offsets_off_the_end", "another_kind"],
)
def test_a_corrupt_or_foreign_index_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spoil: Callable[[Path, Path], Any]
) -> None:
    path = tmp_path / "part-0.csv"
    _write_csv(path, 80, 2)
    expected = open_dataset(tmp_path, schema=SCHEMA).read(0, 80)
    spoil(_index(path), path)
    scanned = _counting_scans(monkeypatch, "csv")
    reader = open_dataset(tmp_path, schema=SCHEMA)
    assert scanned == [str(path)]
    np.testing.assert_array_equal(reader.read(0, 80).categorical, expected.categorical)
    scanned.clear()
    open_dataset(tmp_path, schema=SCHEMA)  # the rebuilt index was kept in its place
    assert scanned == []


def test_data_that_cannot_hold_its_index_keeps_it_in_the_jobs_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder beside the data is not writable (here: a file stands where it would go)."""
    data = tmp_path / "data"
    data.mkdir()
    path = data / "part-0.csv"
    _write_csv(path, 40, 3)
    _index(path).mkdir()  # not a file: the index cannot be written there
    jobs = tmp_path / "job" / "data-index"
    monkeypatch.setenv(ENV_INDEX_DIR, str(jobs))
    open_dataset(data, schema=SCHEMA)
    kept = list(jobs.iterdir())
    assert [p.name.endswith(f"-part-0.csv{SUFFIX}") for p in kept] == [True]
    scanned = _counting_scans(monkeypatch, "csv")
    assert open_dataset(data, schema=SCHEMA).num_samples == 40
    assert scanned == []
