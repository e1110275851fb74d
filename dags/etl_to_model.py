"""From an ETL team's daily Parquet partition on S3 to a model trained incrementally every day.

etl_partition -> train -> quality_gate (held-out AUC >= params.min_auc) -> publish_model

- ``etl_partition`` stands in for the team's ETL job: it writes the day's click log as Parquet
  files with the team's own column names and string ids to
  ``s3://<bucket>/<prefix>/dt=<ds>/part-*.parquet``, and a held-out sample of the same day to
  ``s3://<bucket>/<prefix>_holdout/dt=<ds>/``, through the AWS connection
  ``params.aws_conn_id``. The rows are synthetic: the same for a date every time (a re-run
  rewrites the partition byte for byte), labelled by a teacher that drifts a little from one
  day to the next, as real click behaviour does. Replace this task by your ETL (or by a sensor
  waiting for its ``_SUCCESS`` file); nothing else in the DAG changes.
- ``train`` reads that partition (``data_format="parquet"``, ``DATA_SCHEMA``: which column is
  the label, which are dense, which are ids hashed into how many buckets) and continues from
  the model of the last successful run of this task (``params.init_from``, ``"previous"`` by
  default; the first run trains from scratch). Its job, model and SavedModel live in ``MODEL_DIR``.
- ``quality_gate`` fails the run if the held-out AUC is below ``params.min_auc``.
- ``publish_model`` updates the Asset ``ETL_MODEL`` only for a model that passed the gate;
  ``dags/score_on_new_model.py`` is scheduled on it.

.. seealso:: ``docs/tutorial-etl-to-model.md`` (the step-by-step tutorial of this DAG) and
    ``docs/data-formats.md`` (formats and schema).
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pendulum
from airflow.sdk import Param, dag, get_current_context, task

from airflow_rover.operators.model_asset import model_asset
from airflow_rover.operators.training import ElasticTrainingOperator
from airflow_rover.sensors.elastic_job import ElasticJobSensor

if TYPE_CHECKING:
    from pathlib import PurePath

DAG_ID = "rover_etl_to_model"
ROVER_HOME = Path(
    os.environ.get("ROVER_HOME", Path(os.environ.get("AIRFLOW_HOME", "~/airflow")) / "rover")
).expanduser()
# Where the data lands (the ETL's table and its held-out sample) and where models go.
TRAIN_DATA = "s3://{{ params.bucket }}/{{ params.prefix }}/dt={{ ds }}/"
HOLDOUT_DATA = "s3://{{ params.bucket }}/{{ params.prefix }}_holdout/dt={{ ds }}/"
MODEL_DIR = str(ROVER_HOME / "models" / DAG_ID / "{{ ds }}")
EVICT_AFTER_DAYS = 30  # ids not seen for 30 days leave the tables

# The ETL's columns, as the team names them, and how training reads them.
DATA_SCHEMA: dict[str, Any] = {
    "label": "clicked",  # bool
    "dense": [  # floats, already scaled by the ETL (raw counts would take "normalize": "log1p")
        {"name": "price_level"},
        {"name": "user_activity"},
        {"name": "ad_age"},
        {"name": "hour_of_day"},
    ],
    "categorical": [  # string ids such as "u-48213", hashed into each table's buckets
        {"name": "user_id", "buckets": 1 << 18},
        {"name": "ad_id", "buckets": 1 << 16},
        {"name": "advertiser_id", "buckets": 1 << 13},
        {"name": "site", "buckets": 1 << 14},
        {"name": "device", "buckets": 64},
        {"name": "country", "buckets": 1024},
    ],
}

# Only for the stand-in ETL: the ids each column draws from, and how its ids are spelled.
SYNTHETIC_IDS = {
    "user_id": (20_000, "u-"),
    "ad_id": (5_000, "ad-"),
    "advertiser_id": (500, "adv-"),
    "site": (2_000, "site-"),
    "device": (8, "dev-"),
    "country": (60, "cc-"),
}
TEACHER_SEED = 24  # the click behaviour the synthetic rows follow...
TEACHER_DRIFT = 0.1  # ...drifting by this share a day from DATA_EPOCH on
DATA_EPOCH = dt.date(2026, 11, 1)
ROWS_PER_FILE = 100_000
ROWS_PER_GROUP = 8192  # a Parquet row group: one training shard reads one

# The model Asset, updated when a model passed the gate; ``train`` itself updates its own
# default Asset (x-rover-model://rover_etl_to_model/train) for every model it trains.
ETL_MODEL = model_asset(DAG_ID, "publish_model")  # x-rover-model://rover_etl_to_model/publish_model


@dag(
    dag_id=DAG_ID,
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # each day continues from the day before: one at a time
    render_template_as_native_obj=True,
    default_args={"retries": 2, "retry_delay": pendulum.duration(seconds=30)},
    params={
        "bucket": Param("my-data-lake", type="string", description="the ETL's bucket"),
        "prefix": Param("ad_clicks", type="string", description="the ETL's table (a key prefix)"),
        "aws_conn_id": Param(
            "aws_default",
            type="string",
            description="the Airflow AWS connection to the bucket ('': boto3's default chain)",
        ),
        "init_from": Param(
            "previous",
            type="string",
            description="'previous': continue from the last successful run's model; a model "
            "folder to continue from that one; '': train from scratch (after a schema change)",
        ),
        "rows_per_day": Param(200_000, type="integer", minimum=1_000),
        "holdout_rows": Param(50_000, type="integer", minimum=1_000),
        "num_workers": Param(2, type="integer", minimum=1),
        "num_ps": Param(1, type="integer", minimum=1),
        "min_auc": Param(0.70, type="number", minimum=0.5, maximum=1.0),
    },
    tags=["airflow-rover", "example"],
)
def rover_etl_to_model() -> None:
    @task
    def etl_partition(
        ds: str | None = None, params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The day's partition and its held-out sample, written to S3 (the ETL's job)."""
        assert ds is not None and params is not None  # injected by Airflow from the context
        return write_day(ds, params)

    partition = etl_partition()

    train = ElasticTrainingOperator(
        task_id="train",
        train_data=TRAIN_DATA,
        eval_data=HOLDOUT_DATA,
        data_format="parquet",
        data_schema=DATA_SCHEMA,
        aws_conn_id="{{ params.aws_conn_id }}",
        init_from="{{ params.init_from }}",
        evict_after_days=EVICT_AFTER_DAYS,
        output_dir=MODEL_DIR,
        model="wide_deep",
        plan={"num_workers": "{{ params.num_workers }}", "num_ps": "{{ params.num_ps }}"},
        training={"epochs": 1, "batch_size": 512, "optimizer": "adagrad"},
        poll_interval=2.0,
    )

    quality_gate = ElasticJobSensor(
        task_id="quality_gate",
        job_dir=MODEL_DIR,
        states=[],
        min_auc="{{ params.min_auc }}",
        poke_interval=2.0,
        timeout=600,
        retries=0,  # a model below the bar stays below it
    )

    @task(outlets=[ETL_MODEL])
    def publish_model(result: Any, gate: Any) -> dict[str, Any]:
        """Update ``ETL_MODEL`` with the model that passed the gate: its AUC, samples, model
        and SavedModel URIs, and how to read its data (format, schema, connection)."""
        from airflow_rover.operators.model_asset import attach_model_event

        context = get_current_context()
        render = context["task"].render_template
        data = {
            "train_data": render(TRAIN_DATA, context),
            "eval_data": render(HOLDOUT_DATA, context),
            "data_format": "parquet",
            "data_schema": DATA_SCHEMA,
            "aws_conn_id": context["params"]["aws_conn_id"],
        }
        extra = attach_model_event(ETL_MODEL, result, context, data)
        print(f"model {extra['model_uri']}: held-out AUC {extra['auc']}, gate {gate}")
        return extra

    partition >> train >> quality_gate
    publish_model(result=train.output, gate=quality_gate.output)


# -- the stand-in ETL ----------------------------------------------------------------------
def day_number(ds: str) -> int:
    """Days from DATA_EPOCH to ``ds`` (0 before it): how far the teacher has drifted."""
    return max(0, (dt.date.fromisoformat(ds) - DATA_EPOCH).days)


def day_config(ds: str, params: dict[str, Any]) -> Any:
    """The synthetic generator's settings for ``ds``: the same teacher drifted to the day, and
    rows of the day's own."""
    from airflow_rover.data.synthetic import SyntheticConfig

    return SyntheticConfig(
        num_train=params["rows_per_day"],
        num_eval=params["holdout_rows"],
        seed=TEACHER_SEED,
        num_dense=len(DATA_SCHEMA["dense"]),
        vocab_sizes=tuple(size for size, _ in SYNTHETIC_IDS.values()),
        day=day_number(ds),
        drift=TEACHER_DRIFT,
    )


def write_day(ds: str, params: dict[str, Any]) -> dict[str, Any]:
    """Generate the day's rows and write both splits to S3; returns where they went."""
    import tempfile

    from airflow_rover.data.synthetic import generate_dataset
    from airflow_rover.hooks.checkpoint_store import CheckpointStoreHook

    # The connection in the Amazon provider's shape, read as the training task reads it (with
    # that provider installed, S3Hook(aws_conn_id).get_conn() gives the same client).
    settings = CheckpointStoreHook(params["aws_conn_id"]).aws_settings()
    client = settings.session().client("s3", endpoint_url=settings.endpoint_url)
    bucket, prefix = params["bucket"], params["prefix"]
    with tempfile.TemporaryDirectory() as tmp:
        data = generate_dataset(tmp, day_config(ds, params))
        train = write_partition(client, data.train_dir, bucket, f"{prefix}/dt={ds}/")
        holdout = write_partition(client, data.eval_dir, bucket, f"{prefix}_holdout/dt={ds}/")
    print(f"wrote {train} and {holdout}; the teacher's AUC: {data.teacher_auc:.4f}")
    return {
        "train_data": f"s3://{bucket}/{prefix}/dt={ds}/",
        "holdout_data": f"s3://{bucket}/{prefix}_holdout/dt={ds}/",
        "files": {"train": train, "holdout": holdout},
        "teacher_auc": data.teacher_auc,
    }


def write_partition(client: Any, split_dir: PurePath, bucket: str, prefix: str) -> list[str]:
    """The split's rows as ``prefix/part-NNNNN.parquet`` files, then ``_SUCCESS``; objects
    left under ``prefix`` by an earlier run are deleted, so the partition is this run's alone.
    The bytes depend only on the rows: a re-run leaves the same objects (and ETags)."""
    import io

    import pyarrow.parquet as pq

    from airflow_rover.data.reader import NpyColumnsReader

    reader = NpyColumnsReader(split_dir)
    names = []
    for index, start in enumerate(range(0, reader.num_samples, ROWS_PER_FILE)):
        stop = min(start + ROWS_PER_FILE, reader.num_samples)
        buffer = io.BytesIO()
        pq.write_table(team_table(reader, start, stop), buffer, row_group_size=ROWS_PER_GROUP)
        names.append(f"part-{index:05d}.parquet")
        client.put_object(Bucket=bucket, Key=prefix + names[-1], Body=buffer.getvalue())
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    stale = [o["Key"] for p in pages for o in p.get("Contents", [])]
    stale = [k for k in stale if k.removeprefix(prefix) not in names]
    if stale:
        client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in stale]})
    client.put_object(Bucket=bucket, Key=prefix + "_SUCCESS", Body=b"")
    return names


def team_table(reader: Any, start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` of a generated split as the ETL's table: its column names, bool
    labels and string ids."""
    import pyarrow as pa

    batch = reader.read(start, stop)
    columns: dict[str, Any] = {DATA_SCHEMA["label"]: pa.array(batch.label > 0.5)}
    for j, column in enumerate(DATA_SCHEMA["dense"]):
        columns[column["name"]] = pa.array(batch.dense[:, j])
    for j, (name, (_, spelling)) in enumerate(SYNTHETIC_IDS.items()):
        columns[name] = pa.array([f"{spelling}{i}" for i in batch.categorical[:, j].tolist()])
    return pa.table(columns)


rover_etl_to_model()
