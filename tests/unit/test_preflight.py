"""Bad datasets, feature configs and model paths fail before any process starts, naming the
field; ids outside a table's vocabulary are found on a bounded sample of the data."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from airflow_rover.core.spec import FeatureConfig, JobSpec, TableConfig
from airflow_rover.data.preflight import PreflightError
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.data.vocab_check import SAMPLE_ROWS, SAMPLE_SHARDS, sample_ranges
from airflow_rover.worker.preflight import preflight

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory):
    return generate_dataset(
        tmp_path_factory.mktemp("data"), SyntheticConfig(num_train=500, num_eval=200, seed=3)
    )


def spec(data, **fields) -> JobSpec:
    base = {"job_id": "pre", "train_data": str(data.train_dir), "eval_data": str(data.eval_dir)}
    return JobSpec.model_validate({**base, **fields})


def table(column: str = "C1", vocab: int = 100_000, dim: int = 8) -> dict:
    return {"name": f"t_{column}", "column": column, "vocab_size": vocab, "dim": dim}


def test_a_valid_spec_resolves_its_default_features(data) -> None:
    """Default features: one 16-dim and one 1-dim table per categorical column."""
    features = preflight(spec(data))
    assert isinstance(features, FeatureConfig)
    assert len(features.tables) == 2 * 26 and features.num_dense == 13


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"train_data": "/no/such/dir"}, r"^train_data='/no/such/dir': \S+ does not exist$"),
        ({"eval_data": "/no/such/dir"}, r"^eval_data='/no/such/dir': \S+ does not exist$"),
        (
            {"features": {"num_dense": 13, "tables": [table("C99")]}},
            r"features\.tables\[0\]\.column='C99' is not a column.*accepted",
        ),
        (
            {"features": {"num_dense": 13, "tables": [table("C1", vocab=3)]}},
            r"features\.tables\[0\]\.vocab_size=3 is smaller",
        ),
        ({"features": {"num_dense": 7, "tables": [table()]}}, r"features\.num_dense=7"),
        ({"model": "no_such_module_xyz:build"}, r"model='no_such_module_xyz:build'.*not import"),
        ({"model": "json:no_such_factory"}, r"no callable 'no_such_factory'"),
    ],
)
def test_bad_specs_fail_with_the_field_named(data, fields: dict, match: str) -> None:
    with pytest.raises(PreflightError, match=match):
        preflight(spec(data, **fields))


def test_a_directory_without_a_manifest_is_told_what_a_dataset_holds(tmp_path) -> None:
    """An existing directory is not called missing: it lacks a manifest, and the message says
    what a dataset directory holds; a file is not a directory."""
    with pytest.raises(PreflightError) as info:
        preflight(JobSpec(job_id="pre", train_data=str(tmp_path)))
    message = str(info.value)
    assert f"train_data='{tmp_path}': {tmp_path} has no manifest.json" in message
    assert "does not exist" not in message
    assert "dense.npy, categorical.npy and label.npy" in message and "npy-columns" in message
    (tmp_path / "data.npy").write_bytes(b"")
    with pytest.raises(PreflightError, match=r"data\.npy is not a directory"):
        preflight(JobSpec(job_id="pre", train_data=str(tmp_path / "data.npy")))


def with_id(data, tmp_path: Path, split: str, row: int, column: int, value: int) -> Path:
    """A copy of the fixture's dataset with ``value`` at ``row`` of categorical ``column``."""
    copy = tmp_path / "data"
    shutil.copytree(data.train_dir.parent, copy)
    ids = np.load(copy / split / "categorical.npy", mmap_mode="r+")
    ids[row, column] = value
    ids.flush()
    return copy


SHARD = 50  # the fixture's 500 rows in 10 shards: preflight samples shards 0,1,3,4,5,6,8,9


def test_an_id_outside_a_tables_vocabulary_is_found_in_the_last_shard(data, tmp_path) -> None:
    """The message names the field, the column, the table, its vocab_size, the id and its row;
    the bad id sits in the last shard, which preflight samples (as it does the first)."""
    copy = with_id(data, tmp_path, "train", row=9 * SHARD + 5, column=1, value=507)  # C2: 500
    bad = spec(data, train_data=str(copy / "train"), training={"shard_size": SHARD})
    with pytest.raises(PreflightError) as info:
        preflight(bad)
    assert str(info.value).startswith(
        f"train_data='{copy / 'train'}': column 'C2' holds id 507 at row 455; table 'C2' reads "
        "it with vocab_size 500, so its ids must be in [0, 500); 1 of the 400 rows sampled "
        "hold one outside"
    ), info.value


def test_a_negative_id_in_the_held_out_split_names_eval_data(data, tmp_path) -> None:
    copy = with_id(data, tmp_path, "eval", row=3, column=25, value=-2)
    bad = spec(data, eval_data=str(copy / "eval"))
    with pytest.raises(PreflightError, match=r"^eval_data=.*column 'C26' holds id -2 at row 3;"):
        preflight(bad)


def test_ids_are_checked_against_the_tables_vocabulary_not_the_manifests(data, tmp_path) -> None:
    """A table may be larger than the column's vocabulary in the manifest: ids up to its
    vocab_size are what the workers accept, so preflight accepts them too."""
    copy = with_id(data, tmp_path, "train", row=0, column=1, value=550)  # manifest: C2 has 500
    fields = {"num_dense": 13, "tables": [table("C2", vocab=600)]}
    preflight(spec(data, train_data=str(copy / "train"), features=fields))
    fields = {"num_dense": 13, "tables": [table("C2", vocab=500)]}
    with pytest.raises(PreflightError, match=r"column 'C2' holds id 550 at row 0; table 't_C2'"):
        preflight(spec(data, train_data=str(copy / "train"), features=fields))


def test_the_id_sample_is_bounded_and_spans_the_data() -> None:
    """However large the dataset, at most SAMPLE_SHARDS * SAMPLE_ROWS rows are read: the first
    shard's, the last shard's and shards spread evenly between."""
    ranges = sample_ranges(10**10, 8192)
    assert len(ranges) == SAMPLE_SHARDS
    assert sum(stop - start for start, stop in ranges) == SAMPLE_SHARDS * SAMPLE_ROWS
    assert ranges[0] == (0, SAMPLE_ROWS)
    last_shard = (10**10 - 1) // 8192 * 8192
    assert ranges[-1] == (last_shard, last_shard + SAMPLE_ROWS)
    assert sample_ranges(300, 8192) == [(0, 300)]
    assert sample_ranges(0, 8192) == []


def test_a_user_model_path_is_checked_by_importing_it(data, monkeypatch) -> None:
    """An importable callable passes; a non-callable attribute is rejected."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    preflight(spec(data, model="user_models:small_tower"))
    with pytest.raises(PreflightError, match="no callable 'NOT_CALLABLE'"):
        preflight(spec(data, model="user_models:NOT_CALLABLE"))


def test_a_bad_table_config_is_rejected_by_the_schema() -> None:
    """Duplicate table names and a zero dim never get as far as preflight."""
    with pytest.raises(ValueError, match="duplicate table names"):
        FeatureConfig(num_dense=1, tables=(TableConfig(**table()), TableConfig(**table())))
    with pytest.raises(ValueError, match="dim"):
        TableConfig(**table(dim=0))


@pytest.mark.parametrize(
    ("yaml", "named"),
    [
        (
            "features:\n  num_dense: 13\n  tables:\n"
            "    - {name: t, column: C77, vocab_size: 10, dim: 4}\n",
            "features.tables[0].column='C77'",
        ),
        ("model: bad_models:four_wide\n", "model='bad_models:four_wide' returned shape (64, 4)"),
    ],
)
def test_rover_train_rejects_a_bad_config_before_starting_anything(
    data, tmp_path, yaml: str, named: str
) -> None:
    """The CLI exits 2 with the field or the model named, and no job directory or process
    appears."""
    config = tmp_path / "job.yaml"
    config.write_text(f"train_data: {data.train_dir}\n{yaml}")
    job_dir = tmp_path / "job"
    path = os.pathsep.join(p for p in (str(FIXTURES), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_rover.cli",
            "train",
            "--config",
            str(config),
            "--job-dir",
            str(job_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert proc.returncode == 2, proc.stderr
    assert named in proc.stderr
    assert not job_dir.exists()


def test_rover_train_rejects_an_invalid_yaml_field(tmp_path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text("train_data: /x\nplan: {num_workers: 0}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_rover.cli", "train", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "plan.num_workers" in proc.stderr
