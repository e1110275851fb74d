"""The ETL example (``dags/etl_to_model.py``) run by real Airflow (``dag.test()``) against S3 on
loopback (moto's server, reached through an Airflow AWS connection) for two consecutive days,
then ``dags/score_on_new_model.py`` triggered by hand.

Day 1 writes its Parquet partition with string ids and trains from scratch; day 2 writes its
own and continues from day 1's model, found through the history store; each day's model that
passed the AUC gate updates the ETL model Asset with metadata that says how to read its
held-out data, and the scorer scores day 2's model (the newest) with its SavedModel.
"""

from __future__ import annotations

import importlib.util
import io
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))  # the S3 stand-in's helpers
from moto_server import connection_env, moto_server, new_bucket, s3_client

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "rover_etl_to_model"
DAYS = ("2026-11-24", "2026-11-25")
CONN_ID = "rover_etl_s3"
PREFIX = "ad_clicks"
ROWS, HOLDOUT = 4_000, 2_000
ETL_MODEL_URI = "x-rover-model://rover_etl_to_model/publish_model"


def _example() -> Any:
    """``dags/etl_to_model.py`` as a module (its constants)."""
    spec = importlib.util.spec_from_file_location("etl_to_model", REPO / "dags" / "etl_to_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(run_dags: Any, airflow_env: dict[str, str]) -> dict[str, Any]:
    started = time.monotonic()
    with moto_server() as endpoint:
        bucket = new_bucket(endpoint)
        airflow_env[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = connection_env(endpoint)
        conf = {
            "bucket": bucket,
            "prefix": PREFIX,
            "aws_conn_id": CONN_ID,
            "rows_per_day": ROWS,
            "holdout_rows": HOLDOUT,
            "num_workers": 1,
            "num_ps": 1,
            "min_auc": 0.5,  # 8 batches a day (AUC 0.56, 0.61): the gate's wiring, not quality
        }
        runs = [(DAG_ID, ds, conf) for ds in DAYS]  # one process: Airflow imported once
        *outcomes, scored = run_dags([*runs, ("rover_score_on_new_model", DAYS[1], {})])
        days = dict(zip(DAYS, outcomes, strict=True))
        for name, outcome in (*days.items(), ("scoring", scored)):
            seconds = {t: round(v[2] or 0, 1) for t, v in outcome["times"].items()}
            print(f"\n{name}: {outcome['seconds']} s; task seconds {seconds}")
        client = s3_client(endpoint)
        listing = client.list_objects_v2(Bucket=bucket, Prefix=f"{PREFIX}/dt={DAYS[0]}/")
        keys = sorted(o["Key"] for o in listing.get("Contents", []))
        first = client.get_object(Bucket=bucket, Key=f"{PREFIX}/dt={DAYS[0]}/part-00000.parquet")
        part = pq.read_table(io.BytesIO(first["Body"].read()))
    print(f"ETL example module: {time.monotonic() - started:.1f} s")
    db = Path(airflow_env["AIRFLOW_HOME"]) / "airflow.db"
    with sqlite3.connect(db) as conn:
        events = conn.execute(
            "select e.extra from asset_event e join asset a on a.id = e.asset_id "
            "where a.uri = ? order by e.timestamp",
            (ETL_MODEL_URI,),
        ).fetchall()
    return {
        "days": days,
        "scored": scored,
        "bucket": bucket,
        "keys": keys,
        "part": part,
        "events": [json.loads(extra) for (extra,) in events],
    }


def _train(outcome: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = outcome["xcom"]["train:return_value"]
    return result


def test_both_days_succeed_and_the_etl_wrote_the_teams_parquet(runs: dict[str, Any]) -> None:
    for ds, outcome in runs["days"].items():
        assert outcome["state"] == "success", (ds, outcome["tasks"], outcome["log"][-6000:])
        assert all(t == ["success", 1] for t in outcome["tasks"].values()), outcome["tasks"]
        assert _train(outcome)["samples_trained"] == ROWS
        assert _train(outcome)["eval_samples"] == HOLDOUT
    assert runs["keys"] == [
        f"{PREFIX}/dt={DAYS[0]}/{n}" for n in ("_SUCCESS", "part-00000.parquet")
    ]
    schema = _example().DATA_SCHEMA
    columns = [schema["label"], *(c["name"] for c in (*schema["dense"], *schema["categorical"]))]
    part = runs["part"]
    assert part.column_names == columns and part.num_rows == ROWS
    assert part.column("user_id")[0].as_py().startswith("u-")
    assert str(part.schema.field("clicked").type) == "bool"


def test_day1_trains_from_scratch_and_day2_continues_from_day1s_model(
    runs: dict[str, Any],
) -> None:
    day1, day2 = (runs["days"][ds] for ds in DAYS)
    assert day1["xcom"]["train:init_from"] is None
    log = day1["log"]  # the log of both days (and the scoring)
    assert log.count(f"init_from='previous': no successful run of {DAG_ID}.train") == 1
    assert _train(day1)["recovery"]["started_from"] == "scratch"
    folder, job1 = _train(day1)["model_folder"], _train(day1)["job_id"]
    source = day2["xcom"]["train:init_from"]
    assert source["location"] == folder and source["evict_after_days"] == 30
    assert f"of {DAG_ID}.train (job {job1})" in source["origin"]
    started = f"Starting from run {day1['run_id']!r} of {DAG_ID}.train (job {job1}): {folder}"
    assert log.count(started) == 1, log[-6000:]
    assert _train(day2)["recovery"]["started_from"].startswith(f"init_from {folder}")
    # every row of day 1's model was seen within evict_after_days: all taken, none left out
    assert _train(day1)["recovery"]["initial_rows"] is None
    loaded = {"loaded": _train(day1)["embedding_rows"], "evicted": 0}
    assert _train(day2)["recovery"]["initial_rows"] == loaded
    assert Path(folder).parent.parent.name == DAYS[0]  # models/<dag>/<ds>/models/<stamp>


def test_each_gated_model_updates_the_asset_with_how_to_read_its_data(
    runs: dict[str, Any],
) -> None:
    events = runs["events"]
    assert len(events) == 2, events
    schema = _example().DATA_SCHEMA
    for ds, extra in zip(DAYS, events, strict=True):
        result = _train(runs["days"][ds])
        assert extra["auc"] == result["auc"] and extra["samples_trained"] == ROWS
        folder = Path(result["model_folder"])
        assert extra["model_uri"] == folder.as_uri()
        assert extra["saved_model_uri"] == (folder / "saved_model").as_uri()
        assert extra["run_id"] == runs["days"][ds]["run_id"]
        assert extra["train_data"] == f"s3://{runs['bucket']}/{PREFIX}/dt={ds}/"
        assert extra["eval_data"] == f"s3://{runs['bucket']}/{PREFIX}_holdout/dt={ds}/"
        assert extra["data_format"] == "parquet" and extra["data_schema"] == schema
        assert extra["aws_conn_id"] == CONN_ID
        assert extra["data_interval_start"].startswith(ds)
        gate = runs["days"][ds]["xcom"]["quality_gate:return_value"]
        assert gate["auc"] == result["auc"] > 0.5


def test_the_scorer_scores_the_newest_model_from_its_held_out_parquet(
    runs: dict[str, Any],
) -> None:
    scored = runs["scored"]
    assert scored["state"] == "success", scored["log"][-6000:]
    score = scored["xcom"]["score_batch:return_value"]
    latest = runs["events"][-1]
    assert score["model_uri"] == latest["model_uri"] and score["trained_dag"] == DAG_ID
    assert score["rows"] == HOLDOUT and 0.0 < score["mean_probability"] < 1.0
    assert abs(score["batch_auc"] - latest["auc"]) < 1e-4  # the same rows: the held-out split
