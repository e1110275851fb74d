"""The baselines of ``bench/throughput.py``, each run in a child process of the bench.

(a) ``run_keras``: the reference ``wide_deep`` Keras model fed by in-graph
``keras.layers.Embedding`` lookups, trained with ``model.fit`` in one process.
(a*) ``run_local_loop``: the same model as plain variables with a sparse-row Adagrad, as a
``tf.function`` step in one process (Keras' Adagrad does dense work over every table each step).
(b) ``run_tf_ps``: TensorFlow's own ``ParameterServerStrategy`` on localhost (1 PS, 1+ worker
``tf.distribute.Server`` processes, the coordinator here), a custom training loop over plain
``tf.Variable``s with the same Wide&Deep math and the same Adagrad formula as Keras.

All use what the rover PS uses: embedding rows uniform in [-0.05, 0.05), Adagrad with
learning rate 0.2, initial accumulator 0.1 and epsilon 1e-7 inside the square root.
"""

from __future__ import annotations

import ctypes
import json
import math
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from airflow_rover.core.embedding_placement import EmbeddingGroup, EmbeddingPlacement
from airflow_rover.core.hashing import INIT_SCALE
from airflow_rover.core.metrics import roc_auc
from airflow_rover.core.spec import FeatureConfig
from airflow_rover.core.training_optimizers import ADAGRAD_INITIAL_ACCUMULATOR, EPSILON
from airflow_rover.data.reader import Batch, open_dataset
from airflow_rover.worker import models

# The reference model's dense-features input key ("dense" in older versions of models.py).
DENSE_KEY: str = getattr(models, "DENSE_INPUT", "dense")

HIDDEN = (256, 128)  # the reference model's MLP
WARMUP_STEPS = 20  # steps excluded from the steady-state rate (tracing, first-touch pages)
EVAL_BATCH = 8192


@dataclass(frozen=True)
class BenchSetup:
    """What every configuration shares: data, features, optimisation settings."""

    train_dir: Path
    eval_dir: Path
    features: FeatureConfig
    columns: tuple[str, ...]
    batch_size: int
    learning_rate: float
    seed: int = 0

    @property
    def layout(self) -> EmbeddingPlacement:
        return EmbeddingPlacement.from_features(self.features)

    def group_columns(self, group: EmbeddingGroup) -> tuple[list[int], np.ndarray]:
        """Dataset column of each table of ``group`` and the table's offset in the group."""
        index = {name: i for i, name in enumerate(self.columns)}
        cols = [index[t.column] for t in group.tables]
        return cols, np.array([t.offset for t in group.tables], dtype=np.int64)


def _read_all(path: Path) -> Batch:
    reader = open_dataset(path)
    return reader.read(0, reader.num_samples)


def _scores(labels: np.ndarray, logits: np.ndarray) -> dict[str, float]:
    """Held-out AUC and log loss (clipped as the rover evaluator clips) from logits."""
    z = np.asarray(logits, dtype=np.float64).ravel()
    p = np.clip(1.0 / (1.0 + np.exp(-z)), 1e-7, 1 - 1e-7)
    logloss = float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))
    return {"auc": roc_auc(labels, z), "logloss": logloss}


def _steady_rate(num_samples: int, batch_size: int, seconds: float) -> float:
    return (num_samples - WARMUP_STEPS * batch_size) / seconds


# -- (a) single-process Keras ----------------------------------------------------------------
class _StepClock(keras.callbacks.Callback):
    """Wall time from the end of warm-up step ``WARMUP_STEPS`` to the end of training."""

    def __init__(self) -> None:
        super().__init__()
        self.fit_start = 0.0
        self.steady_start = 0.0
        self.end = 0.0

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.fit_start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if batch == WARMUP_STEPS - 1:
            self.steady_start = time.perf_counter()

    def on_train_end(self, logs: dict | None = None) -> None:
        self.end = time.perf_counter()


def keras_model(setup: BenchSetup, fused: bool) -> keras.Model:
    """``wide_deep(features)`` behind in-graph embeddings: one ``Embedding`` per table, or one
    per dim group over fused ids (``EmbeddingPlacement`` offsets), as the rover PS stores them."""
    dense_in = keras.Input((setup.features.num_dense,), name="x_dense")
    ids_in = keras.Input((len(setup.columns),), dtype="int64", name="x_ids")
    looked_up: dict[str, Any] = {DENSE_KEY: dense_in}
    for group in setup.layout.groups:
        cols, offsets = setup.group_columns(group)
        if fused:
            fused_ids = keras.ops.take(ids_in, cols, axis=1) + offsets
            rows = keras.layers.Embedding(
                group.vocab_size,
                group.dim,
                embeddings_initializer=keras.initializers.RandomUniform(-INIT_SCALE, INIT_SCALE),
                name=f"emb_{group.name}",
            )(fused_ids)
            for i, table in enumerate(group.tables):
                looked_up[table.name] = rows[:, i, :]
        else:
            for col, table in zip(cols, group.tables, strict=True):
                looked_up[table.name] = keras.layers.Embedding(
                    table.vocab_size,
                    group.dim,
                    embeddings_initializer=keras.initializers.RandomUniform(
                        -INIT_SCALE, INIT_SCALE
                    ),
                    name=f"emb_{table.name}",
                )(ids_in[:, col])
    logit = models.wide_deep(setup.features, HIDDEN)(looked_up)
    return keras.Model({"x_dense": dense_in, "x_ids": ids_in}, logit)


def run_keras(setup: BenchSetup, fused: bool) -> dict[str, Any]:
    keras.utils.set_random_seed(setup.seed)
    train, held_out = _read_all(setup.train_dir), _read_all(setup.eval_dir)
    model = keras_model(setup, fused)
    model.compile(
        optimizer=keras.optimizers.Adagrad(
            learning_rate=setup.learning_rate,
            initial_accumulator_value=ADAGRAD_INITIAL_ACCUMULATOR,
            epsilon=EPSILON,
        ),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    data = (
        tf.data.Dataset.from_tensor_slices(
            ({"x_dense": train.dense, "x_ids": train.categorical}, train.label)
        )
        .batch(setup.batch_size)
        .prefetch(tf.data.AUTOTUNE)
    )
    clock = _StepClock()
    model.fit(data, epochs=1, verbose=0, callbacks=[clock])
    logits = model.predict(
        {"x_dense": held_out.dense, "x_ids": held_out.categorical}, batch_size=EVAL_BATCH, verbose=0
    )
    n = len(train)
    return {
        "samples_per_second": _steady_rate(n, setup.batch_size, clock.end - clock.steady_start),
        "epoch_samples_per_second": n / (clock.end - clock.fit_start),
        "train_seconds": clock.end - clock.fit_start,
        **_scores(held_out.label, logits),
    }


# -- (b) TensorFlow ParameterServerStrategy ----------------------------------------------------
_SERVER_CODE = """
import json, sys
import tensorflow as tf
cluster = tf.train.ClusterSpec(json.loads(sys.argv[1]))
tf.distribute.Server(cluster, job_name=sys.argv[2], task_index=int(sys.argv[3]),
                     protocol="grpc", start=True).join()
"""


def _die_with_parent() -> None:
    """In the server child before exec: SIGKILL it when this process goes away."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in socks:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _npy_data_offset(path: Path) -> int:
    with open(path, "rb") as fh:
        major, _ = np.lib.format.read_magic(fh)
        if major == 1:
            np.lib.format.read_array_header_1_0(fh)
        else:
            np.lib.format.read_array_header_2_0(fh)
        return fh.tell()


def _record_dataset(path: Path, row_bytes: int, num: int, batch: int) -> tf.data.Dataset:
    """Batches of raw rows of a .npy file, read on the worker: one record per batch."""
    header = _npy_data_offset(path)
    full, rest = divmod(num, batch)
    ds = tf.data.FixedLengthRecordDataset(
        str(path),
        record_bytes=row_bytes * batch,
        header_bytes=header,
        footer_bytes=row_bytes * rest,
    )
    if full == 0:
        ds = ds.take(0)
    if rest:
        tail = tf.data.FixedLengthRecordDataset(
            str(path), record_bytes=row_bytes * rest, header_bytes=header + full * batch * row_bytes
        )
        ds = ds.concatenate(tail)
    return ds


class _PSWideDeep:
    """Wide&Deep as plain variables (created under a PS strategy's scope) and its math."""

    def __init__(self, setup: BenchSetup) -> None:
        self.setup = setup
        self.groups = setup.layout.groups
        self.cols = [setup.group_columns(g) for g in self.groups]
        num_dense = setup.features.num_dense
        deep_width = num_dense + sum(g.dim * len(g.tables) for g in self.groups if g.dim > 1)
        seeds = iter(range(1000))

        def uniform(shape: tuple[int, ...], limit: float) -> tf.Variable:
            seed = [setup.seed, next(seeds)]
            return tf.Variable(
                lambda: tf.random.stateless_uniform(shape, seed, -limit, limit), dtype=tf.float32
            )

        def glorot(fan_in: int, fan_out: int) -> tf.Variable:
            return uniform((fan_in, fan_out), math.sqrt(6.0 / (fan_in + fan_out)))

        def zeros(shape: tuple[int, ...]) -> tf.Variable:
            return tf.Variable(lambda: tf.zeros(shape), dtype=tf.float32)

        self.tables = [uniform((g.vocab_size, g.dim), INIT_SCALE) for g in self.groups]
        self.dense_vars: dict[str, tf.Variable] = {
            "wide_kernel": glorot(num_dense, 1),
            "wide_bias": zeros((1,)),
        }
        width = deep_width
        for i, units in enumerate((*HIDDEN, 1)):
            self.dense_vars[f"deep_{i}_kernel"] = glorot(width, units)
            self.dense_vars[f"deep_{i}_bias"] = zeros((units,))
            width = units
        self.num_layers = len(HIDDEN) + 1

        def accumulator(var: tf.Variable) -> tf.Variable:
            shape = tuple(var.shape)
            return tf.Variable(
                lambda: tf.fill(shape, ADAGRAD_INITIAL_ACCUMULATOR), dtype=tf.float32
            )

        self.table_accums = [accumulator(t) for t in self.tables]
        self.dense_accums = {n: accumulator(v) for n, v in self.dense_vars.items()}

    def fused_ids(self, ids: tf.Tensor) -> list[tf.Tensor]:
        return [tf.gather(ids, cols, axis=1) + offsets for cols, offsets in self.cols]

    def logits(self, dense: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
        v = self.dense_vars
        wide = tf.matmul(dense, v["wide_kernel"]) + v["wide_bias"]
        deep_in = [dense]
        for group, table, fused in zip(self.groups, self.tables, self.fused_ids(ids), strict=True):
            rows = tf.nn.embedding_lookup(table, fused)  # (batch, tables, dim)
            if group.dim == 1:
                wide += tf.reduce_sum(rows, axis=1)
            else:
                deep_in.append(tf.reshape(rows, [-1, len(group.tables) * group.dim]))
        x = tf.concat(deep_in, axis=1)
        for i in range(self.num_layers):
            x = tf.matmul(x, v[f"deep_{i}_kernel"]) + v[f"deep_{i}_bias"]
            if i < self.num_layers - 1:
                x = tf.nn.relu(x)
        return tf.squeeze(wide + x, -1)

    def train_step(self, dense: tf.Tensor, ids: tf.Tensor, label: tf.Tensor) -> tf.Tensor:
        """Loss and gradients on the worker, Keras' Adagrad applied to the PS variables
        (rows: gradients summed per unique id first, as the rover PS does)."""
        names = list(self.dense_vars)
        with tf.GradientTape() as tape:
            logits = self.logits(dense, ids)
            loss = tf.reduce_mean(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits)
            )
        grads = tape.gradient(loss, [*self.tables, *(self.dense_vars[n] for n in names)])
        lr = tf.constant(self.setup.learning_rate, tf.float32)
        for table, accum, grad in zip(
            self.tables, self.table_accums, grads[: len(self.tables)], strict=True
        ):
            unique, position = tf.unique(grad.indices)
            g = tf.math.unsorted_segment_sum(grad.values, position, tf.shape(unique)[0])
            accum.scatter_add(tf.IndexedSlices(g * g, unique))
            step = lr * g / tf.sqrt(tf.gather(accum, unique) + EPSILON)
            table.scatter_sub(tf.IndexedSlices(step, unique))
        for name, grad in zip(names, grads[len(self.tables) :], strict=True):
            accum = self.dense_accums[name].assign_add(grad * grad)
            self.dense_vars[name].assign_sub(lr * grad / tf.sqrt(accum + EPSILON))
        return loss

    def numpy_logits(self, batch: Batch) -> np.ndarray:
        """Held-out scores from the trained variables, fetched once from the PS."""
        tables = [t.numpy() for t in self.tables]
        v = {n: var.numpy() for n, var in self.dense_vars.items()}
        wide = batch.dense @ v["wide_kernel"] + v["wide_bias"]
        deep_in = [batch.dense]
        for group, table, (cols, offsets) in zip(self.groups, tables, self.cols, strict=True):
            rows = table[batch.categorical[:, cols] + offsets]
            if group.dim == 1:
                wide = wide + rows.sum(axis=1)
            else:
                deep_in.append(rows.reshape(len(batch), -1))
        x = np.concatenate(deep_in, axis=1)
        for i in range(self.num_layers):
            x = x @ v[f"deep_{i}_kernel"] + v[f"deep_{i}_bias"]
            if i < self.num_layers - 1:
                x = np.maximum(x, 0)
        return (wide + x).ravel()


def run_local_loop(setup: BenchSetup) -> dict[str, Any]:
    """(a) without Keras' optimizer: the same variables and sparse-row Adagrad as (b), in one
    process, as a ``tf.function`` step over an in-memory ``tf.data`` pipeline."""
    train, held_out = _read_all(setup.train_dir), _read_all(setup.eval_dir)
    model = _PSWideDeep(setup)
    data = (
        tf.data.Dataset.from_tensor_slices((train.dense, train.categorical, train.label))
        .batch(setup.batch_size)
        .prefetch(tf.data.AUTOTUNE)
    )
    step = tf.function(model.train_step)
    start = steady_start = time.perf_counter()
    for i, (dense, ids, label) in enumerate(data):
        step(dense, ids, label)
        if i == WARMUP_STEPS - 1:
            steady_start = time.perf_counter()
    end = time.perf_counter()
    n = len(train)
    return {
        "samples_per_second": _steady_rate(n, setup.batch_size, end - steady_start),
        "epoch_samples_per_second": n / (end - start),
        "train_seconds": end - start,
        **_scores(held_out.label, model.numpy_logits(held_out)),
    }


def run_tf_ps(setup: BenchSetup, num_workers: int = 1) -> dict[str, Any]:
    ports = _free_ports(2 + num_workers)
    cluster = {
        "chief": [f"localhost:{ports[0]}"],
        "ps": [f"localhost:{ports[1]}"],
        "worker": [f"localhost:{p}" for p in ports[2:]],
    }
    tasks = [("ps", 0)] + [("worker", i) for i in range(num_workers)]
    servers = [
        subprocess.Popen(
            [sys.executable, "-c", _SERVER_CODE, json.dumps(cluster), job, str(index)],
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        for job, index in tasks
    ]
    try:
        return _train_tf_ps(setup, cluster, num_workers)
    finally:
        for proc in servers:
            proc.kill()
        for proc in servers:
            proc.wait()


def _train_tf_ps(setup: BenchSetup, cluster: dict[str, list[str]], num_workers: int) -> dict:
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = _PSWideDeep(setup)

    reader = open_dataset(setup.train_dir)
    n, batch = reader.num_samples, setup.batch_size
    num_dense, num_cat = setup.features.num_dense, len(setup.columns)
    files = {k: setup.train_dir / f"{k}.npy" for k in ("dense", "categorical", "label")}

    def dataset_fn() -> tf.data.Dataset:
        parts = (
            _record_dataset(files["dense"], 4 * num_dense, n, batch),
            _record_dataset(files["categorical"], 8 * num_cat, n, batch),
            _record_dataset(files["label"], 4, n, batch),
        )

        def decode(d: tf.Tensor, c: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, ...]:
            return (
                tf.reshape(tf.io.decode_raw(d, tf.float32), [-1, num_dense]),
                tf.reshape(tf.io.decode_raw(c, tf.int64), [-1, num_cat]),
                tf.io.decode_raw(y, tf.float32),
            )

        return tf.data.Dataset.zip(parts).map(decode).prefetch(tf.data.AUTOTUNE)

    # Each worker walks its own copy of the data; with several workers the first
    # ``steps / workers`` batches of each copy are trained (same sample count, not the same
    # samples), so the AUC of a multi-worker run is only roughly comparable.
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step(it: Any) -> tf.Tensor:
        return strategy.run(model.train_step, args=next(it))

    num_steps = math.ceil(n / batch)
    start = time.perf_counter()
    for _ in range(WARMUP_STEPS):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    steady_start = time.perf_counter()
    for _ in range(num_steps - WARMUP_STEPS):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    end = time.perf_counter()
    held_out = _read_all(setup.eval_dir)
    return {
        "samples_per_second": _steady_rate(n, batch, end - steady_start),
        "epoch_samples_per_second": n / (end - start),
        "train_seconds": end - start,
        **_scores(held_out.label, model.numpy_logits(held_out)),
        "workers": num_workers,
    }
