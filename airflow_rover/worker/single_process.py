"""The yardstick: the same model trained in one process with in-graph Keras embeddings.

Used to check that training on the PS loses nothing in quality (the AUC parity test) and as
the single-process baseline of ``bench/throughput.py``. Same tables (one ``Embedding`` each,
initialised like the PS rows), same model factory, same optimizer settings, same sample order.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.hashing import INIT_SCALE, initial_rows
from airflow_rover.core.metrics import roc_auc
from airflow_rover.core.spec import FeatureConfig, JobSpec, TrainingConfig
from airflow_rover.core.training_optimizers import ADAGRAD_INITIAL_ACCUMULATOR, EPSILON
from airflow_rover.data.features import resolve_features
from airflow_rover.data.preprocessing import checked, load_preprocess
from airflow_rover.data.reader import Batch, open_split
from airflow_rover.worker.models import DENSE_INPUT, ModelFactory, load_factory

EVAL_BATCH = 8192


def in_graph_model(
    features: FeatureConfig,
    columns: list[str],
    factory: ModelFactory,
    seed: int,
    lists: Sequence[str] = (),
) -> keras.Model:
    """``factory(features)`` fed by one in-graph ``Embedding`` per table (entries sharing a
    table share it); a list column comes padded with -1 (``padded_lists``) and is pooled.

    The tower is built first (so the same seed gives the same dense weights as on a worker)
    and every row starts at the value the PS would give it (``core.hashing.initial_rows``).
    """
    if features.id_tables:
        raise ValueError(
            f"tables {list(features.id_tables)} have index 'ids': the single-process baseline "
            "holds every table as a dense Keras Embedding over [0, vocab_size), which raw ids "
            "do not index; train them on the PS"
        )
    tower = factory(features)
    dense_in = keras.Input((features.num_dense,), name="x_dense")
    ids_in = keras.Input((len(columns),), dtype="int64", name="x_ids")
    list_in = {name: keras.Input((None,), dtype="int64", name=f"x_list_{name}") for name in lists}
    index = {name: i for i, name in enumerate(columns)}
    looked_up: dict[str, Any] = {DENSE_INPUT: dense_in}
    for group in EmbeddingPlacement.from_features(features).groups:
        embeddings: dict[str, keras.layers.Embedding] = {}
        for table in group.tables:
            if table.table not in embeddings:
                fused = np.arange(table.vocab_size, dtype=np.int64) + table.offset
                init = initial_rows(group.name, fused, group.dim, seed, INIT_SCALE)
                embeddings[table.table] = keras.layers.Embedding(
                    table.vocab_size,
                    group.dim,
                    embeddings_initializer=keras.initializers.Constant(init),
                    name=f"emb_{table.table}",
                )
            embedding = embeddings[table.table]
            if table.column in list_in:
                looked_up[table.name] = _pooled(embedding, list_in[table.column], table.pooling)
            else:
                looked_up[table.name] = embedding(ids_in[:, index[table.column]])
    inputs = {"x_dense": dense_in, "x_ids": ids_in} | {f"x_list_{n}": t for n, t in list_in.items()}
    return keras.Model(inputs, tower(looked_up))


def _pooled(embedding: keras.layers.Embedding, ids: Any, pooling: str) -> Any:
    """Per sample the sum or mean of the rows of its ids (padding: -1), zeros for none."""
    valid = keras.ops.cast(ids >= 0, "float32")
    rows = embedding(keras.ops.maximum(ids, 0)) * valid[..., None]
    summed = keras.ops.sum(rows, axis=1)
    if pooling != "mean":
        return summed
    return summed / keras.ops.maximum(keras.ops.sum(valid, axis=1), 1.0)[:, None]


def padded_lists(batch: Batch, names: Sequence[str]) -> dict[str, np.ndarray]:
    """A batch's list columns as ``x_list_<name>`` (samples, longest list) int64, padded -1."""
    out = {}
    for name, ragged in zip(names, batch.lists, strict=True):
        lengths = np.diff(ragged.row_splits)
        padded = np.full((lengths.size, max(int(lengths.max(initial=0)), 1)), -1, np.int64)
        rows = np.repeat(np.arange(lengths.size), lengths)
        padded[rows, np.arange(ragged.values.size) - ragged.row_splits[rows]] = ragged.values
        out[f"x_list_{name}"] = padded
    return out


def keras_optimizer(training: TrainingConfig) -> keras.optimizers.Optimizer:
    """The Keras optimizer with the settings the PS uses."""
    if training.optimizer == "adagrad":
        return keras.optimizers.Adagrad(
            learning_rate=training.learning_rate,
            initial_accumulator_value=ADAGRAD_INITIAL_ACCUMULATOR,
            epsilon=EPSILON,
        )
    if training.optimizer == "adam":
        return keras.optimizers.Adam(learning_rate=training.learning_rate, epsilon=EPSILON)
    return keras.optimizers.SGD(learning_rate=training.learning_rate)


def train_single_process(spec: JobSpec) -> dict[str, float]:
    """Train ``spec``'s model on its data in this process; held-out AUC, log loss, speed."""
    if spec.eval_data is None:
        raise ValueError("eval_data: the single-process yardstick needs a held-out split")
    keras.utils.set_random_seed(spec.training.seed)
    features = resolve_features(spec)
    train_reader, eval_reader = open_split(spec, spec.train_data), open_split(spec, spec.eval_data)
    preprocess = load_preprocess(spec.preprocess)  # the job's features, as on its workers
    train = checked(
        preprocess,
        train_reader.read(0, train_reader.num_samples),
        train_reader.schema,
        spec.preprocess,
    )
    held_out = checked(
        preprocess,
        eval_reader.read(0, eval_reader.num_samples),
        eval_reader.schema,
        spec.preprocess,
    )
    columns = [c.name for c in train_reader.schema.categorical]
    lists = [c.name for c in train_reader.schema.lists]
    model = in_graph_model(features, columns, load_factory(spec.model), spec.training.seed, lists)
    model.compile(
        optimizer=keras_optimizer(spec.training),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    inputs = {"x_dense": train.dense, "x_ids": train.categorical} | padded_lists(train, lists)
    # Keras's sample_weight: the loss is the batch's mean of weight * log loss, as on a worker
    samples = (inputs, train.label) if train.weight is None else (inputs, train.label, train.weight)
    data = (
        tf.data.Dataset.from_tensor_slices(samples)
        .batch(spec.training.batch_size)
        .repeat(spec.training.epochs)
        .prefetch(tf.data.AUTOTUNE)
    )
    started = time.perf_counter()
    model.fit(data, epochs=1, verbose=0)
    seconds = time.perf_counter() - started
    logits = model.predict(
        {"x_dense": held_out.dense, "x_ids": held_out.categorical} | padded_lists(held_out, lists),
        batch_size=EVAL_BATCH,
        verbose=0,
    )
    p = np.clip(1.0 / (1.0 + np.exp(-np.asarray(logits, np.float64).ravel())), 1e-7, 1 - 1e-7)
    y = held_out.label
    return {
        "auc": roc_auc(y, p),
        "logloss": float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))),
        "samples_per_second": len(train) * spec.training.epochs / seconds,
        "train_seconds": seconds,
    }
