"""The users' own data through real Airflow: the same rows as npy-columns on disk and as
Parquet files with string ids on S3 (moto's server on loopback, reached through an Airflow
connection), and as TFRecord files of the same on S3, train to success with held-out AUCs
within 0.002; small Parquet and TFRecord datasets with a list column and a shared table train to
success; a schema naming a column the files lack fails the task at once, naming the column."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))  # the S3 stand-in's helpers
from moto_server import ACCESS_KEY, SECRET_KEY, moto_server, new_bucket, s3_client

from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.data.synthetic_files import write_parquet, write_tfrecord

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIXTURE_DAGS = Path(__file__).resolve().parents[1] / "fixtures" / "dags"
DAG_ID = "rover_data_formats_test"
DAY = "2026-11-25"
CONN_ID = "rover_data_s3"
AUC_TOLERANCE = 0.002  # the bound between the two formats


@pytest.fixture(scope="module")
def airflow_env(airflow_env: dict[str, str]) -> dict[str, str]:
    return {**airflow_env, "AIRFLOW__CORE__DAGS_FOLDER": str(FIXTURE_DAGS)}


@pytest.fixture(scope="module")
def outcome(
    run_dag: Any, airflow_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("formats")
    data = generate_dataset(root / "npy", SyntheticConfig(num_train=40_000, num_eval=10_000))
    train = write_parquet(data.train_dir, root / "pq" / "train", num_files=4, string_ids=True)
    held_out = write_parquet(data.eval_dir, root / "pq" / "eval", num_files=1, string_ids=True)
    with moto_server() as endpoint:
        bucket = new_bucket(endpoint)
        client = s3_client(endpoint)
        records = write_tfrecord(data.train_dir, root / "tfr" / "train", string_ids=True)
        held_out_records = write_tfrecord(
            data.eval_dir, root / "tfr" / "eval", num_files=1, string_ids=True
        )
        uploads = (
            (train, f"clicks/train/dt={DAY}/"),
            (held_out, "clicks/eval/"),
            (records, f"clicks/tfrecord/train/dt={DAY}/"),
            (held_out_records, "clicks/tfrecord/eval/"),
            *_list_files(root),
        )
        for folder, prefix in uploads:
            for path in sorted(folder.iterdir()):
                client.upload_file(str(path), bucket, f"{prefix}{path.name}")
        connection = {
            "conn_type": "aws",
            "login": ACCESS_KEY,
            "password": SECRET_KEY,
            "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
        airflow_env[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(connection)
        conf = {
            "npy_train": str(data.train_dir),
            "npy_eval": str(data.eval_dir),
            "s3_root": f"s3://{bucket}/clicks",
            "jobs_root": str(root / "jobs"),
            "aws_conn_id": CONN_ID,
        }
        started = time.monotonic()
        result: dict[str, Any] = run_dag(DAG_ID, DAY, conf, timeout=900)
    aucs = {t: (result["xcom"].get(f"{t}:return_value") or {}).get("auc") for t in result["tasks"]}
    print(f"\ndata formats DAG: tasks {result['tasks']}; held-out AUC {aucs}")
    took = {t: round(float(v[2] or 0), 1) for t, v in result.get("times", {}).items()}
    print(f"DAG run {time.monotonic() - started:.1f} s; per task (s): {took}")
    return result


def _list_files(root: Path) -> tuple[tuple[Path, str], ...]:
    """Small Parquet and TFRecord splits with string ids and the list column ``bag``, and
    where they go on S3."""
    small = generate_dataset(root / "small", SyntheticConfig(num_train=4_000, num_eval=1_000))
    out = []
    for split, source in (("train", small.train_dir), ("eval", small.eval_dir)):
        for fmt, write in (("parquet", write_parquet), ("tfrecord", write_tfrecord)):
            folder = write(
                source, root / "lists" / fmt / split, num_files=2, string_ids=True, list_column=True
            )
            out.append((folder, f"clicks/lists/{fmt}/{split}/"))
    return tuple(out)


def _result(outcome: dict[str, Any], task: str) -> dict[str, Any]:
    assert outcome["tasks"][task] == ["success", 1], outcome["log"][-6000:]
    return outcome["xcom"][f"{task}:return_value"]


def test_parquet_on_s3_with_string_ids_trains_as_npy_columns_does(outcome: dict[str, Any]) -> None:
    npy, parquet = _result(outcome, "npy_columns"), _result(outcome, "parquet_on_s3")
    for result in (npy, parquet):
        batches = result["accounting"]["batches"]
        assert batches["trained_once"] == batches["expected"]
        assert result["auc"] > 0.7
    assert abs(npy["auc"] - parquet["auc"]) <= AUC_TOLERANCE, (npy["auc"], parquet["auc"])


def test_tfrecord_on_s3_with_string_ids_trains_as_parquet_does(outcome: dict[str, Any]) -> None:
    """The same rows, the same hashing, one worker: the same model as from Parquet."""
    records, parquet = _result(outcome, "tfrecord_on_s3"), _result(outcome, "parquet_on_s3")
    batches = records["accounting"]["batches"]
    assert batches["trained_once"] == batches["expected"]
    assert abs(records["auc"] - parquet["auc"]) <= AUC_TOLERANCE, (records["auc"], parquet["auc"])


def test_parquet_and_tfrecord_with_a_list_column_and_a_shared_table_train(
    outcome: dict[str, Any],
) -> None:
    """String ids, the list column ``bag`` pooled by its mean and sharing C1's table: both
    formats train every batch once, to the same model (the same rows, one worker)."""
    parquet = _result(outcome, "parquet_lists_on_s3")
    records = _result(outcome, "tfrecord_lists_on_s3")
    for result in (parquet, records):
        batches = result["accounting"]["batches"]
        assert batches["trained_once"] == batches["expected"]
        assert result["auc"] > 0.65
    assert abs(records["auc"] - parquet["auc"]) <= AUC_TOLERANCE, (records["auc"], parquet["auc"])


def test_a_schema_naming_a_missing_column_fails_at_once(outcome: dict[str, Any]) -> None:
    task = "schema_names_a_missing_column"
    assert outcome["tasks"][task] == ["failed", 1]  # AirflowFailException: no retry
    log = outcome["log"]
    assert "categorical column 'C27' is missing; the columns found: label, I1," in log
    assert "part-00000.parquet" in log
