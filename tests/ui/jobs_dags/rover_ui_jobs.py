"""Training DAGs for ``tests/ui/test_job_pages.py``, in team_a's bundle: data from the run's
conf, job directories where the operator puts them by default (under ``$AIRFLOW_HOME``).

- ``rover_ui_daily``: a short CPR job that shares a cluster budget; it succeeds.
- ``rover_ui_approval``: a long job whose proposals wait for a person
  (``autoscale={"plan_approval": True}``); the test acts on it from the UI and stops it.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param

from airflow_rover.operators.training import ElasticTrainingOperator

PARAMS = {"train_data": Param("", type="string"), "eval_data": Param("", type="string")}
START = pendulum.datetime(2026, 1, 1, tz="UTC")

with DAG(dag_id="rover_ui_daily", schedule=None, start_date=START, params=PARAMS):
    ElasticTrainingOperator(
        task_id="train",
        train_data="{{ params.train_data }}",
        eval_data="{{ params.eval_data }}",
        plan={"num_ps": 1, "num_workers": 1},
        training={"shard_size": 2048, "batch_size": 128, "epochs": 5},
        checkpoint_policy="cpr",
        recovery={"checkpoint_interval_s": 2},
        cluster_budget={"name": "ui-test", "cpu": 8},
        poll_interval=1,
    )

with DAG(dag_id="rover_ui_approval", schedule=None, start_date=START, params=PARAMS):
    ElasticTrainingOperator(
        task_id="train",
        train_data="{{ params.train_data }}",
        eval_data="{{ params.eval_data }}",
        plan={"num_ps": 1, "num_workers": 1},
        training={"shard_size": 512, "batch_size": 64, "epochs": 200},
        autoscale={"plan_approval": True},
        retries=1,  # a person's stop must not be retried
        retry_delay=timedelta(seconds=1),
        poll_interval=1,
    )
