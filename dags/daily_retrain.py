"""Daily retraining of a CTR model on the embedded (local-process) backend.

Each logical date gets its own data and its own model folder, so a backfill of three dates
trains three independent models. Running a date again trains a new model for that date only
when its data or the training parameters changed, and replaces the date's model once the new
one has succeeded; otherwise it returns the model already trained.

generate_day_data -> warm_start -> train -> quality_gate (held-out AUC >= params.min_auc)
-> publish_metrics

``train`` also writes the model's SavedModel (``model/saved_model``) and, on success, updates
the Asset ``CTR_MODEL`` with the AUC, samples, model URI and data interval:
``dags/score_on_new_model.py`` is scheduled on it.

Backfills: ``airflow backfill create --dag-id rover_daily_retrain --from-date 2026-11-01
--to-date 2026-11-21 --max-active-runs 3`` (or the UI's "Trigger" > "Backfill") trains up to
three dates at once, all on one cluster budget: ``train`` leaves ``cluster_budget="auto"``, this
host's memory with the local launcher (``[rover] cluster_budget`` for a cluster). A date whose
plan does not fit waits deferred, holding no worker slot, until a running job ends; a backfill
run weighs 1 and a scheduled or manual one 2, so today's model starts first and may shrink a
backfill job to its minimum workers to get room (``docs/backfills.md``).

``warm_start`` picks the training plan from the most similar past runs recorded in the history
store (``$AIRFLOW_HOME/rover/history.db``; every finished ``train`` job is recorded there) and
falls back to ``params.num_workers`` / ``params.num_ps`` when there is none, or when the run
is triggered with ``warm_start=false``; ``train``'s optimizer starts from what those runs
measured (``autoscale.prior``; cold without them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import Param, dag, task

from airflow_rover.operators.model_asset import model_asset
from airflow_rover.operators.training import ElasticTrainingOperator
from airflow_rover.operators.warm_start import WarmStartOperator
from airflow_rover.sensors.elastic_job import ElasticJobSensor

ROVER_HOME = Path(
    os.environ.get("ROVER_HOME", Path(os.environ.get("AIRFLOW_HOME", "~/airflow")) / "rover")
).expanduser()
DATA_DIR = str(ROVER_HOME / "data" / "{{ ds }}")
MODEL_DIR = str(ROVER_HOME / "models" / "{{ ds }}")
CTR_MODEL = model_asset("rover_daily_retrain", "train")  # x-rover-model://rover_daily_retrain/train


@dag(
    dag_id="rover_daily_retrain",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=3,
    render_template_as_native_obj=True,
    default_args={"retries": 1, "retry_delay": pendulum.duration(seconds=10)},
    params={
        "num_train": Param(200_000, type="integer", minimum=1_000),
        "num_eval": Param(50_000, type="integer", minimum=1_000),
        "num_workers": Param(2, type="integer", minimum=1),
        "num_ps": Param(2, type="integer", minimum=1),
        "epochs": Param(1, type="integer", minimum=1),
        "min_auc": Param(0.70, type="number", minimum=0.5, maximum=1.0),
        "warm_start": Param(
            True,
            type="boolean",
            description="start from the plans of similar past runs; "
            "num_workers/num_ps are the plan when there is none (or when false)",
        ),
    },
    tags=["airflow-rover", "example"],
)
def rover_daily_retrain() -> None:
    @task
    def generate_day_data(
        ds: str | None = None, params: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The day's click log: synthetic Criteo-shaped data, deterministic for the date."""
        from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset

        assert ds is not None and params is not None  # injected by Airflow from the context

        config = SyntheticConfig(
            num_train=params["num_train"],
            num_eval=params["num_eval"],
            seed=int(ds.replace("-", "")),
        )
        data = generate_dataset(ROVER_HOME / "data" / ds, config)
        return {
            "train": str(data.train_dir),
            "eval": str(data.eval_dir),
            "teacher_auc": data.teacher_auc,
        }

    day = generate_day_data()

    warm_start = WarmStartOperator(
        task_id="warm_start",
        model="wide_deep",
        train_data=f"{DATA_DIR}/train",
        for_task_id="train",
        cold_start_plan={
            "num_workers": "{{ params.num_workers }}",
            "num_ps": "{{ params.num_ps }}",
        },
        k="{{ 5 if params.warm_start else 0 }}",
        batch_size=512,  # the train task's: the autoscaler's prior is fitted for it
    )

    train = ElasticTrainingOperator(
        task_id="train",
        train_data=f"{DATA_DIR}/train",
        eval_data=f"{DATA_DIR}/eval",
        output_dir=MODEL_DIR,
        model="wide_deep",
        plan="{{ ti.xcom_pull(task_ids='warm_start')['plan'] }}",
        training={"epochs": "{{ params.epochs }}", "batch_size": 512, "optimizer": "adam"},
        # the optimizer may grow a PS to 4 cores and 8 GB at most (docs/operators.md)
        autoscale={
            "max_ps_cpu": 4,
            "max_ps_memory_mb": 8192,
            "min_workers": 1,
            # Backfills yield to the day's own run on the shared budget.
            "weight": "{{ 1 if dag_run.run_type == 'backfill' else 2 }}",
            # where the optimizer starts: what similar past runs measured (None: cold)
            "prior": "{{ ti.xcom_pull(task_ids='warm_start')['prior'] }}",
        },
        cluster_budget="auto",  # the default, named for readers: shared by every run
        poll_interval=2.0,
        model_asset=CTR_MODEL,  # the default for this dag and task, named for readers
    )

    quality_gate = ElasticJobSensor(
        task_id="quality_gate",
        job_dir=MODEL_DIR,
        states=[],
        min_auc="{{ params.min_auc }}",
        poke_interval=2.0,
        timeout=3600,
    )

    @task
    def publish_metrics(metrics: Any, gate: Any, ds: str | None = None) -> str:
        """Write the day's metrics next to its model, where a serving job would pick them up."""
        path = Path(metrics["model_dir"]).parent / "metrics.json"
        path.write_text(json.dumps({"ds": ds, **metrics, "quality_gate": gate}, indent=2))
        print(f"model:   {metrics['model_dir']}")
        print(f"metrics: {path}")
        print(
            f"auc={metrics['auc']:.4f} samples={metrics['samples_trained']} "
            f"samples/s={metrics['samples_per_second']}"
        )
        return str(path)

    day >> warm_start >> train >> quality_gate
    publish_metrics(metrics=train.output, gate=quality_gate.output)


rover_daily_retrain()
