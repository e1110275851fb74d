"""Score a batch with each new CTR model, as soon as a training DAG publishes it.

The DAG is scheduled on two model Assets: the one ``rover_daily_retrain``'s ``train`` task
updates with every model it trains (``dags/daily_retrain.py``), and the one
``rover_etl_to_model``'s ``publish_model`` task updates with every model that passed its AUC
gate (``dags/etl_to_model.py``). Each event's metadata names the model (``saved_model_uri``),
its held-out AUC, the samples it saw, the data interval it was trained for, and its held-out
data (``eval_data``; for the ETL model also ``data_format``, ``data_schema`` and the
``aws_conn_id`` that reads it).

``score_batch`` loads the SavedModel with TensorFlow alone (``tf.saved_model.load``: no
airflow_rover in the model's path), scores the first rows of the model's held-out split (read
by airflow_rover's reader: the dense features as the job read them, the categorical columns'
raw values, which the SavedModel hashes) and returns what it found as its XCom. A run
triggered by hand scores the newest model of either Asset.

.. seealso:: ``docs/serving.md`` and ``docs/tutorial-etl-to-model.md``
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pendulum
from airflow.sdk import Asset, dag, task

from airflow_rover.operators.model_asset import model_asset

CTR_MODEL = model_asset("rover_daily_retrain", "train")  # its train task's default Asset
ETL_MODEL = model_asset("rover_etl_to_model", "publish_model")  # models past its gate
MODELS = (CTR_MODEL, ETL_MODEL)
BATCH_ROWS = 4096


@dag(
    dag_id="rover_score_on_new_model",
    schedule=CTR_MODEL | ETL_MODEL,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    tags=["airflow-rover", "example"],
)
def rover_score_on_new_model() -> None:
    @task(inlets=list(MODELS))
    def score_batch(
        triggering_asset_events: Any = None, inlet_events: Any = None
    ) -> dict[str, Any]:
        """Score the newest model's batch: mean click probability, and AUC on its labels."""
        event = newest_event(triggering_asset_events, MODELS) or newest_event(inlet_events, MODELS)
        if event is None:
            raise ValueError(f"no model event on any of {[a.uri for a in MODELS]}")
        return score(dict(event.extra))

    score_batch()


def newest_event(events: Any, assets: Iterable[Asset]) -> Any:
    """The most recent event of ``assets`` in ``events`` (triggering or inlet events), or
    None."""
    found = []
    for asset in assets:
        try:
            found.append(events[asset][-1])
        except (KeyError, IndexError, TypeError):  # no events of it (or no events at all)
            continue
    return max(found, key=lambda e: e.timestamp, default=None)


def score(meta: dict[str, Any]) -> dict[str, Any]:
    """Score the first ``BATCH_ROWS`` held-out rows of the model the event ``meta`` names."""
    import os

    import numpy as np
    import tensorflow as tf

    from airflow_rover.core.data_schema import DataSchema
    from airflow_rover.core.metrics import roc_auc
    from airflow_rover.data.reader import open_dataset
    from airflow_rover.hooks.checkpoint_store import CheckpointStoreHook

    if not meta.get("saved_model_uri") or not meta.get("eval_data"):
        raise ValueError(f"the model event has no saved_model_uri or eval_data: {meta}")
    model = tf.saved_model.load(meta["saved_model_uri"].removeprefix("file://"))
    if meta.get("aws_conn_id"):  # data on S3: the reader takes the connection's settings
        os.environ.update(CheckpointStoreHook(meta["aws_conn_id"]).aws_settings().to_env())
    schema = meta.get("data_schema")
    data = open_dataset(
        meta["eval_data"],
        data_format=meta.get("data_format") or "auto",
        schema=DataSchema.model_validate(schema) if schema else None,
    )
    rows = min(BATCH_ROWS, data.num_samples)
    batch = data.read(0, rows)
    columns = {"dense_features": tf.constant(batch.dense)}
    raw = getattr(data, "serving_columns", None)
    if raw is not None:  # Parquet, TFRecord, CSV: the raw values, hashed by the SavedModel
        columns |= {name: tf.constant(values) for name, values in raw(0, rows).items()}
    else:  # npy-columns: the ids as they are
        names = [column.name for column in data.schema.categorical]
        columns |= {n: tf.constant(batch.categorical[:, j]) for j, n in enumerate(names)}
    probability = model.serve(columns)["probability"].numpy()  # TensorFlow alone
    return {
        "model_uri": meta.get("model_uri"),
        "trained_by": meta.get("run_id"),
        "trained_dag": meta.get("dag_id"),
        "trained_auc": meta.get("auc"),
        "rows": int(probability.size),
        "mean_probability": float(np.mean(probability)),
        "batch_auc": roc_auc(batch.label, probability.astype(np.float64)),
    }


rover_score_on_new_model()
