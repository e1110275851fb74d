"""A job on Parquet files: preflight checks its schema against the files and builds the model
on their rows, errors name the split and the column, and the fingerprint follows the files."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_rover.core.spec import JobSpec
from airflow_rover.data.fingerprint import training_fingerprint
from airflow_rover.data.preflight import PreflightError
from airflow_rover.worker.preflight import preflight

SCHEMA = {
    "label": "clicked",
    "dense": [{"name": "price", "normalize": "log1p"}],
    "categorical": [{"name": "user", "buckets": 4096}, {"name": "ad"}],
    "default_buckets": 1024,
}


def _write(path: Path, rows: int, seed: int, drop: str | None = None) -> None:
    rng = np.random.default_rng(seed)
    table = pa.table(
        {
            "clicked": rng.integers(0, 2, rows).astype(bool),
            "price": rng.random(rows) * 10,
            "user": [f"u{i}" for i in rng.integers(0, 300, rows)],
            "ad": rng.integers(0, 50, rows),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.drop_columns([drop]) if drop else table, path, row_group_size=100)


@pytest.fixture()
def data(tmp_path: Path) -> dict[str, Path]:
    for day, seed in (("2026-11-24", 1), ("2026-11-25", 2)):
        _write(tmp_path / "train" / f"dt={day}" / "part-0.parquet", 300, seed)
    _write(tmp_path / "eval" / "part-0.parquet", 200, 3)
    return {"train": tmp_path / "train", "eval": tmp_path / "eval"}


def _spec(train: str, evaluated: str, **fields: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "job_id": "parquet",
            "train_data": train,
            "eval_data": evaluated,
            "data_schema": SCHEMA,
            **fields,
        }
    )


def test_preflight_builds_the_model_on_parquet_rows(data: dict[str, Path]) -> None:
    """Default features from the schema: a table per categorical column sized by its buckets
    (and the wide model's 1-dim ones); the model is called on the files' first rows."""
    features = preflight(_spec(f"file://{data['train']}", str(data["eval"])))
    assert features.num_dense == 1
    sizes = {t.name: t.vocab_size for t in features.tables}
    assert sizes == {"user": 4096, "ad": 1024, "user_wide": 4096, "ad_wide": 1024}


def test_a_glob_over_partitions_is_one_dataset(data: dict[str, Path]) -> None:
    preflight(_spec(f"{data['train']}/dt=2026-11-2*/*.parquet", str(data["eval"])))


def test_a_missing_column_in_the_held_out_split_is_named(data: dict[str, Path]) -> None:
    _write(data["eval"] / "part-0.parquet", 200, 3, drop="ad")
    spec = _spec(str(data["train"]), str(data["eval"]))
    with pytest.raises(PreflightError) as info:
        preflight(spec)
    message = str(info.value)
    assert message.startswith(f"eval_data={str(data['eval'])!r}: ")
    assert "categorical column 'ad' is missing; the columns found: clicked, price, user" in message


def test_a_categorical_column_of_floats_is_named_with_its_type(data: dict[str, Path]) -> None:
    schema = {**SCHEMA, "categorical": [{"name": "price"}], "dense": []}
    with pytest.raises(PreflightError, match=r"categorical column 'price' holds float; "):
        preflight(_spec(str(data["train"]), str(data["eval"]), data_schema=schema))


def test_the_fingerprint_follows_the_files_and_the_schema(data: dict[str, Path]) -> None:
    spec = _spec(str(data["train"]), str(data["eval"]))
    first = training_fingerprint(spec)
    assert training_fingerprint(spec) == first
    other_schema = {**SCHEMA, "default_buckets": 2048}
    assert (
        training_fingerprint(_spec(str(data["train"]), str(data["eval"]), data_schema=other_schema))
        != first
    )
    part = data["train"] / "dt=2026-11-25" / "part-0.parquet"
    _write(part, 300, 9)  # the ETL rewrote the partition
    os.utime(part, ns=(1, 1))
    assert training_fingerprint(spec) != first


def _list_data(path: Path, tags: list[list[object]]) -> None:
    n = len(tags)
    table = pa.table(
        {
            "label": [float(i % 2) for i in range(n)],
            "city": [f"c{i % 3}" for i in range(n)],
            "home": [f"c{i % 5}" for i in range(n)],
            "tags": tags,
        }
    )
    path.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path / "part-0.parquet")


def test_a_list_column_and_a_shared_table_make_their_features(tmp_path: Path) -> None:
    """``tags`` (a list, mean) gets an entry pooled by its combiner; ``city`` and ``home`` read
    one table ``geo`` (their wide entries one ``geo_wide``); the model is called on the rows."""
    _list_data(tmp_path, [["a"], ["b", "c"], [], ["a", "a", "d"]])
    schema = {
        "categorical": [
            {"name": "city", "table": "geo"},
            {"name": "home", "table": "geo"},
            {"name": "tags", "combiner": "mean"},
        ],
        "default_buckets": 64,
    }
    spec = JobSpec.model_validate(
        {"job_id": "lists", "train_data": str(tmp_path), "data_schema": schema}
    )
    features = preflight(spec)
    entries = {t.name: (t.rows_of, t.pooling, t.multivalued, t.values) for t in features.tables}
    assert entries == {
        "city": ("geo", "sum", False, "strings"),
        "home": ("geo", "sum", False, "strings"),
        "tags": ("tags", "mean", True, "strings"),
        "city_wide": ("geo_wide", "sum", False, "strings"),
        "home_wide": ("geo_wide", "sum", False, "strings"),
        "tags_wide": ("tags_wide", "mean", True, "strings"),
    }


def test_a_list_ids_outside_its_table_is_named_at_preflight(tmp_path: Path) -> None:
    _list_data(tmp_path, [[1], [2, 70], [], [3]])
    schema = {
        "categorical": [{"name": "city"}, {"name": "tags", "hashed": False, "buckets": 64}],
        "default_buckets": 64,
    }
    spec = JobSpec.model_validate(
        {"job_id": "lists", "train_data": str(tmp_path), "data_schema": schema}
    )
    with pytest.raises(PreflightError, match=r"column 'tags' holds id 70 at row 1; table 'tags'"):
        preflight(spec)
