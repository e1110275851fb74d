"""Bad feature configs and model paths fail before any process starts, naming the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from airflow_rover.core.spec import FeatureConfig, JobSpec, TableConfig
from airflow_rover.data.preflight import PreflightError, preflight
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset

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
        ({"train_data": "/no/such/dir"}, r"train_data='/no/such/dir'"),
        ({"eval_data": "/no/such/dir"}, r"eval_data='/no/such/dir'"),
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


def test_rover_train_rejects_a_bad_config_before_starting_anything(data, tmp_path) -> None:
    """The CLI exits 2 with the field named, and no job directory or process appears."""
    config = tmp_path / "job.yaml"
    config.write_text(
        f"train_data: {data.train_dir}\nfeatures:\n  num_dense: 13\n  tables:\n"
        "    - {name: t, column: C77, vocab_size: 10, dim: 4}\n"
    )
    job_dir = tmp_path / "job"
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
    )
    assert proc.returncode == 2, proc.stderr
    assert "features.tables[0].column='C77'" in proc.stderr
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
