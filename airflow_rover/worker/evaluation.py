"""Evaluation: the held-out split scored with the model as the PS hold it now, on the features
the model trained on (the job's preprocessing applied, as on the trainers)."""

from __future__ import annotations

import numpy as np

from airflow_rover.core.metrics import roc_auc
from airflow_rover.data.preprocessing import Preprocess, checked, unchanged
from airflow_rover.data.reader import SampleReader
from airflow_rover.rpc import master_api
from airflow_rover.worker.ps_model import PSModel


def evaluate(
    model: PSModel,
    reader: SampleReader,
    preprocess: Preprocess = unchanged,
    preprocess_ref: str | None = None,
    batch_size: int = 8192,
    node_id: str = "evaluator",
) -> master_api.EvalReport:
    """Score the held-out split, each batch preprocessed (``preprocess_ref`` names it in
    errors), with the model as the PS hold it now; ``node_id``: the node that reports it."""
    scores: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    for lo in range(0, reader.num_samples, batch_size):
        batch = reader.read(lo, min(lo + batch_size, reader.num_samples))
        batch = checked(preprocess, batch, reader.schema, preprocess_ref)
        scores.append(model.predict(batch))
        labels.append(batch.label)
    y = np.concatenate(labels)
    p = np.clip(np.concatenate(scores).astype(np.float64), 1e-7, 1 - 1e-7)
    logloss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    auc = roc_auc(y, p)
    return master_api.EvalReport(node_id=node_id, auc=auc, logloss=logloss, samples=y.size)
