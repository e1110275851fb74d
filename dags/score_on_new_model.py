"""Score a batch with each new CTR model, as soon as ``rover_daily_retrain`` publishes it.

The DAG is scheduled on the training task's model Asset: every successful ``train`` task
emits an event whose metadata names the model (``saved_model_uri``), its held-out AUC, the
samples it saw and the data interval it was trained for. ``score_batch`` loads the SavedModel
with TensorFlow alone (``tf.saved_model.load``: no airflow_rover in the model's path), scores
the first rows of the day's held-out split and returns what it found as its XCom.

.. seealso:: ``docs/serving.md``
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import dag, task

from airflow_rover.operators.model_asset import model_asset

CTR_MODEL = model_asset("rover_daily_retrain", "train")  # its train task's default Asset
BATCH_ROWS = 4096


@dag(
    dag_id="rover_score_on_new_model",
    schedule=[CTR_MODEL],
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    tags=["airflow-rover", "example"],
)
def rover_score_on_new_model() -> None:
    @task
    def score_batch(triggering_asset_events: Any = None) -> dict[str, Any]:
        """Score the newest model's batch: mean click probability, and AUC on its labels."""
        import numpy as np
        import tensorflow as tf

        from airflow_rover.core.metrics import roc_auc
        from airflow_rover.data.reader import open_dataset

        event = triggering_asset_events[CTR_MODEL][-1]
        meta = dict(event.extra)
        if not meta.get("saved_model_uri") or not meta.get("eval_data"):
            raise ValueError(f"the model event has no saved_model_uri or eval_data: {meta}")
        path = meta["saved_model_uri"].removeprefix("file://")
        model = tf.saved_model.load(path)  # TensorFlow alone from here on
        data = open_dataset(meta["eval_data"])
        batch = data.read(0, min(BATCH_ROWS, data.num_samples))
        names = [column.name for column in data.schema.categorical]
        columns = {"dense_features": tf.constant(batch.dense)}
        columns |= {n: tf.constant(batch.categorical[:, j]) for j, n in enumerate(names)}
        probability = model.serve(columns)["probability"].numpy()
        return {
            "model_uri": meta.get("model_uri"),
            "trained_by": meta.get("run_id"),
            "trained_auc": meta.get("auc"),
            "rows": int(probability.size),
            "mean_probability": float(np.mean(probability)),
            "batch_auc": roc_auc(batch.label, probability.astype(np.float64)),
        }

    score_batch()


rover_score_on_new_model()
