"""The ETL example's stand-in ETL (``dags/etl_to_model.py``) on an S3 API (moto's server on
loopback, reached through an Airflow connection), and how ``dags/score_on_new_model.py``
picks the model to score. The whole DAG under Airflow: ``test_etl_to_model_dag.py``."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from moto_server import ACCESS_KEY, SECRET_KEY, connection_env, moto_server, new_bucket, s3_client

from airflow_rover.core.data_schema import DataSchema
from airflow_rover.data.reader import open_dataset
from airflow_rover.data.sources import file_stamps
from airflow_rover.data.synthetic import generate_dataset

DAGS = Path(__file__).resolve().parents[2] / "dags"
CONN_ID = "etl_example_s3"
DS = "2026-11-25"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", DAGS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def etl() -> ModuleType:
    return _load("etl_to_model")


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture()
def params(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The DAG's params for a fresh bucket; the connection and, for reading back, the
    environment the training job gets from it."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection_env(endpoint))
    for name, value in {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    return {
        "bucket": new_bucket(endpoint),
        "prefix": "ad_clicks",
        "aws_conn_id": CONN_ID,
        "rows_per_day": 300,
        "holdout_rows": 100,
    }


@pytest.fixture(scope="module")
def day(etl: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated training split of ``DS``, 300 rows."""
    config = etl.day_config(DS, {"rows_per_day": 300, "holdout_rows": 100})
    return generate_dataset(tmp_path_factory.mktemp("day"), config).train_dir


def _objects(endpoint: str, bucket: str, prefix: str) -> dict[str, str]:
    listing = s3_client(endpoint).list_objects_v2(Bucket=bucket, Prefix=prefix)
    return {o["Key"].removeprefix(prefix): o["ETag"] for o in listing.get("Contents", [])}


def test_a_rerun_of_a_day_rewrites_its_partition_byte_for_byte(
    etl: ModuleType,
    day: Path,
    params: dict[str, Any],
    endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same objects and ETags (so training's fingerprint is the same and the finished job
    is returned); files an earlier run left that this one does not write are deleted."""
    bucket, where = params["bucket"], f"ad_clicks/dt={DS}/"
    client = s3_client(endpoint)
    monkeypatch.setattr(etl, "ROWS_PER_FILE", 100)
    assert etl.write_partition(client, day, bucket, where) == [
        f"part-0000{i}.parquet" for i in range(3)
    ]
    objects = _objects(endpoint, bucket, where)
    assert sorted(objects) == [
        "_SUCCESS",
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    stamps = file_stamps(f"s3://{bucket}/{where}")
    etl.write_partition(client, day, bucket, where)
    assert _objects(endpoint, bucket, where) == objects
    assert file_stamps(f"s3://{bucket}/{where}") == stamps
    monkeypatch.setattr(etl, "ROWS_PER_FILE", 150)  # the ETL changed: fewer, larger files
    etl.write_partition(client, day, bucket, where)
    assert sorted(_objects(endpoint, bucket, where)) == [
        "_SUCCESS",
        "part-00000.parquet",
        "part-00001.parquet",
    ]


def test_a_day_reads_as_training_reads_it_with_the_dags_schema(
    etl: ModuleType, params: dict[str, Any]
) -> None:
    """Both splits, written through the connection (on the first day: the teacher as it
    starts), read with the DAG's schema."""
    written = etl.write_day(etl.DATA_EPOCH.isoformat(), params)
    schema = DataSchema.model_validate(etl.DATA_SCHEMA)
    for uri, rows in ((written["train_data"], 300), (written["holdout_data"], 100)):
        data = open_dataset(uri, data_format="parquet", schema=schema)
        assert data.num_samples == rows
        assert [c.name for c in data.schema.categorical] == list(etl.SYNTHETIC_IDS)
        batch = data.read(0, rows)
        assert set(batch.label.tolist()) == {0.0, 1.0} and batch.dense.shape == (rows, 4)
    assert 0.6 < written["teacher_auc"] < 1.0


def test_each_day_has_rows_of_its_own_from_a_drifting_teacher(etl: ModuleType) -> None:
    assert [etl.day_number(d) for d in ("2026-10-01", "2026-11-01", DS)] == [0, 0, 24]
    params = {"rows_per_day": 300, "holdout_rows": 100}
    one, two = (etl.day_config(d, params) for d in ("2026-11-24", DS))
    assert (one.day, two.day, one.drift) == (23, 24, etl.TEACHER_DRIFT) and etl.TEACHER_DRIFT > 0
    assert one.seed == two.seed  # the same teacher, drifted one more day


def _event(minute: int, name: str) -> SimpleNamespace:
    return SimpleNamespace(timestamp=datetime(2026, 11, 25, 3, minute, tzinfo=UTC), name=name)


def test_the_scorer_takes_the_newest_event_of_either_model() -> None:
    scorer = _load("score_on_new_model")
    daily, etl_model = scorer.CTR_MODEL, scorer.ETL_MODEL
    events = {daily: [_event(1, "daily-1"), _event(5, "daily-2")], etl_model: [_event(3, "etl")]}
    assert scorer.newest_event(events, scorer.MODELS).name == "daily-2"
    events[etl_model].append(_event(9, "etl-2"))
    assert scorer.newest_event(events, scorer.MODELS).name == "etl-2"
    assert scorer.newest_event({etl_model: []}, scorer.MODELS) is None
    assert scorer.newest_event(None, scorer.MODELS) is None
