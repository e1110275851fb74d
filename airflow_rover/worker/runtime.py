"""The training loop of a worker: lease a shard, read its samples, train against the PS.

Embeddings are looked up on the parameter servers (unique ids per batch, one pull per PS), the
Keras model computes the loss, and gradients (summed per unique id by ``tf.gather``'s gradient)
go back in one push per PS. Workers train asynchronously: each pushes on its own.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from airflow_rover.core.metrics import roc_auc
from airflow_rover.core.spec import FeatureConfig
from airflow_rover.data.reader import Batch, SampleReader
from airflow_rover.master import protocol
from airflow_rover.master.client import MasterClient
from airflow_rover.ps.client import PSClient

log = logging.getLogger(__name__)


@dataclass
class BatchIds:
    """Unique ids per table and, per table, each sample's index into them."""

    unique: dict[str, np.ndarray]
    inverse: dict[str, np.ndarray]


class PSModel:
    """A Keras model whose embedding tables live on the parameter servers."""

    def __init__(
        self, model: keras.Model, features: FeatureConfig, columns: list[str], ps: PSClient
    ) -> None:
        missing = sorted({t.column for t in features.tables} - set(columns))
        if missing:
            raise ValueError(f"features.tables: columns {missing} are not in the dataset")
        self.model = model
        self.features = features
        self.ps = ps
        self._column_index = {name: i for i, name in enumerate(columns)}
        self._table_names = [t.name for t in features.tables]
        self.variables = list(model.trainable_variables)
        self.var_names = [v.path for v in self.variables]
        signature = (
            tf.TensorSpec([None, features.num_dense], tf.float32),
            [tf.TensorSpec([None, t.dim], tf.float32) for t in features.tables],
            [tf.TensorSpec([None], tf.int32) for _ in features.tables],
        )
        self._grad_fn = tf.function(
            self._loss_and_grads,
            input_signature=(*signature, tf.TensorSpec([None], tf.float32)),
        )
        self._predict_fn = tf.function(self._predict, input_signature=signature)

    # -- graph functions ---------------------------------------------------------------------
    def _inputs(
        self, dense: tf.Tensor, rows: list[tf.Tensor], inverse: list[tf.Tensor]
    ) -> dict[str, tf.Tensor]:
        inputs = {"dense": dense}
        for name, table_rows, idx in zip(self._table_names, rows, inverse, strict=True):
            inputs[name] = tf.gather(table_rows, idx)
        return inputs

    def _loss_and_grads(
        self,
        dense: tf.Tensor,
        rows: list[tf.Tensor],
        inverse: list[tf.Tensor],
        label: tf.Tensor,
    ) -> tuple[tf.Tensor, list[tf.Tensor], list[tf.Tensor]]:
        with tf.GradientTape() as tape:
            tape.watch(rows)
            logits = tf.squeeze(self.model(self._inputs(dense, rows, inverse), training=True), -1)
            loss = tf.reduce_mean(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits)
            )
        row_grads, var_grads = tape.gradient(loss, (rows, self.variables))
        # tf.gather's gradient is IndexedSlices; densifying sums the duplicates per unique id.
        row_grads = [tf.convert_to_tensor(g) for g in row_grads]
        var_grads = [tf.convert_to_tensor(g) for g in var_grads]
        return loss, row_grads, var_grads

    def _predict(
        self, dense: tf.Tensor, rows: list[tf.Tensor], inverse: list[tf.Tensor]
    ) -> tf.Tensor:
        logits = self.model(self._inputs(dense, rows, inverse), training=False)
        return tf.sigmoid(tf.squeeze(logits, -1))

    # -- host side ---------------------------------------------------------------------------
    def batch_ids(self, batch: Batch) -> BatchIds:
        by_column: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        unique: dict[str, np.ndarray] = {}
        inverse: dict[str, np.ndarray] = {}
        for table in self.features.tables:
            if table.column not in by_column:
                col = batch.categorical[:, self._column_index[table.column]]
                uniq, inv = np.unique(col, return_inverse=True)
                by_column[table.column] = (uniq, inv.astype(np.int32))
            unique[table.name], inverse[table.name] = by_column[table.column]
        return BatchIds(unique, inverse)

    def _load_dense(self, values: dict[str, np.ndarray]) -> None:
        for var, name in zip(self.variables, self.var_names, strict=True):
            var.assign(values[name])

    def offer_initial_weights(self) -> None:
        self.ps.init_dense(
            {n: v.numpy() for n, v in zip(self.var_names, self.variables, strict=True)}
        )

    def train_batch(self, batch: Batch) -> float:
        ids = self.batch_ids(batch)
        rows, dense_values = self.ps.pull(ids.unique, dense=True)
        self._load_dense(dense_values)
        loss, row_grads, var_grads = self._grad_fn(
            batch.dense,
            [rows[n] for n in self._table_names],
            [ids.inverse[n] for n in self._table_names],
            batch.label,
        )
        self.ps.push(
            ids.unique,
            {n: g.numpy() for n, g in zip(self._table_names, row_grads, strict=True)},
            {n: g.numpy() for n, g in zip(self.var_names, var_grads, strict=True)},
        )
        return float(loss)

    def predict(self, batch: Batch) -> np.ndarray:
        ids = self.batch_ids(batch)
        rows, dense_values = self.ps.pull(ids.unique, dense=True, create=False)
        self._load_dense(dense_values)
        out = self._predict_fn(
            batch.dense,
            [rows[n] for n in self._table_names],
            [ids.inverse[n] for n in self._table_names],
        )
        return np.asarray(out)


class Progress:
    """Counters the heartbeat thread reports while the training loop updates them."""

    def __init__(self) -> None:
        self.steps = 0
        self.samples = 0
        self.step_time_ms = 0.0  # exponential moving average

    def record(self, samples: int, seconds: float) -> None:
        self.steps += 1
        self.samples += samples
        ms = seconds * 1000.0
        self.step_time_ms = ms if self.steps == 1 else 0.9 * self.step_time_ms + 0.1 * ms

    def heartbeat(self) -> protocol.Heartbeat:
        return protocol.Heartbeat(
            steps=self.steps, samples=self.samples, step_time_ms=self.step_time_ms
        )


def start_heartbeats(
    master: MasterClient,
    node_id: str,
    progress: Progress,
    stop: threading.Event,
    interval_s: float = 1.0,
) -> threading.Thread:
    def beat() -> None:
        while not stop.wait(interval_s):
            try:
                if master.heartbeat(node_id, progress.heartbeat()):
                    log.info("master asked %s to stop", node_id)
                    stop.set()
            except Exception as exc:  # a missed beat is not fatal; the lease deadline is
                log.warning("heartbeat failed: %s", exc)

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    return thread


def train(
    node_id: str,
    model: PSModel,
    reader: SampleReader,
    master: MasterClient,
    batch_size: int,
    stop: threading.Event,
) -> Progress:
    """Lease shards until the master says the queue is done."""
    progress = Progress()
    start_heartbeats(master, node_id, progress, stop)
    while not stop.is_set():
        reply = master.lease(node_id)
        if reply.status == "done":
            break
        if reply.status == "wait" or reply.shard is None:
            time.sleep(0.2)
            continue
        shard = reply.shard
        samples = reader.read(shard.start, shard.end)
        for lo in range(0, len(samples), batch_size):
            hi = min(lo + batch_size, len(samples))
            batch = Batch(samples.dense[lo:hi], samples.categorical[lo:hi], samples.label[lo:hi])
            t0 = time.perf_counter()
            model.train_batch(batch)
            progress.record(hi - lo, time.perf_counter() - t0)
        if not master.shard_done(node_id, shard.shard_id):
            log.warning("master rejected completion of shard %d", shard.shard_id)
    master.heartbeat(node_id, progress.heartbeat())
    return progress


def evaluate(model: PSModel, reader: SampleReader, batch_size: int = 8192) -> protocol.EvalReport:
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
    return protocol.EvalReport(
        node_id="evaluator", auc=roc_auc(y, p), logloss=logloss, samples=y.size
    )
