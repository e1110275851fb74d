"""Evaluation: the held-out split scored with the model as the PS hold it now."""

from __future__ import annotations

import numpy as np

from airflow_rover.core.metrics import roc_auc
from airflow_rover.data.reader import SampleReader
from airflow_rover.rpc import master_api
from airflow_rover.worker.ps_model import PSModel


def evaluate(model: PSModel, reader: SampleReader, batch_size: int = 8192) -> master_api.EvalReport:
    """Score the held-out split with the model as the PS hold it now."""
    scores: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    for lo in range(0, reader.num_samples, batch_size):
        batch = reader.read(lo, min(lo + batch_size, reader.num_samples))
        scores.append(model.predict(batch))
        labels.append(batch.label)
    y = np.concatenate(labels)
    p = np.clip(np.concatenate(scores).astype(np.float64), 1e-7, 1 - 1e-7)
    logloss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    auc = roc_auc(y, p)
    return master_api.EvalReport(node_id="evaluator", auc=auc, logloss=logloss, samples=y.size)
