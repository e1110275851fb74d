"""The emulated job of ``bench/recovery.py``: N parameter servers and one trainer in one process.

The embedding rows live in real ``airflow_rover.ps`` ``ParameterServer`` / ``EmbeddingTable``
objects, partitioned over the PS with ``core.hashing.partition_of`` (fused per dim group, as the
rover PS stores them), so checkpoints, partial saves and restores go through the real
``snapshot`` / ``restore`` code and a lost PS really loses its rows. The dense part of the
Wide&Deep model (``bench/_baselines.py``'s (a*) math: MLP 256-128, sparse-row Adagrad lr 0.2)
is a ``tf.function`` step over plain variables; it gets the pulled rows as inputs and returns
their gradients, which are pushed to the owning PS.

A step's time is split in ``StepClock`` (pull, TF step, push, parity) so the ECRM difference
propagation can be charged from the same steps it ran in.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

from airflow_rover.core.embedding_placement import EmbeddingGroup, EmbeddingPlacement
from airflow_rover.core.hashing import partition_of
from airflow_rover.core.metrics import roc_auc
from airflow_rover.core.spec import FeatureConfig, default_features
from airflow_rover.core.training_optimizers import ADAGRAD_INITIAL_ACCUMULATOR, EPSILON, Optimizer
from airflow_rover.data import open_dataset
from airflow_rover.data.reader import Batch
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.ps.server import ParameterServer
from airflow_rover.ps.tables import EmbeddingTable

BATCH_SIZE = 512
LEARNING_RATE = 0.2
EMBEDDING_DIM = 16
HIDDEN = (256, 128)
SEED = 0

Fields = dict[str, np.ndarray]


@dataclass(frozen=True)
class Workload:
    """The synthetic Criteo-shaped data, read into memory, and the model's embedding layout."""

    train: Batch
    held_out: Batch
    features: FeatureConfig
    layout: EmbeddingPlacement
    columns: dict[str, int]
    teacher_auc: float

    @property
    def num_train(self) -> int:
        return len(self.train)

    @property
    def steps(self) -> int:
        return math.ceil(self.num_train / BATCH_SIZE)

    def batch(self, step: int) -> Batch:
        a, b = step * BATCH_SIZE, min((step + 1) * BATCH_SIZE, self.num_train)
        t = self.train
        return Batch(t.dense[a:b], t.categorical[a:b], t.label[a:b])


def load_workload(work_dir: Path, num_train: int, num_eval: int) -> Workload:
    data = generate_dataset(
        work_dir / f"data-n{num_train}-e{num_eval}-s{SEED}",
        SyntheticConfig(num_train=num_train, num_eval=num_eval, seed=SEED),
    )
    train_reader, eval_reader = open_dataset(data.train_dir), open_dataset(data.eval_dir)
    schema = train_reader.schema
    columns = [(c.name, c.vocab_size) for c in schema.categorical]
    features = default_features(columns, schema.num_dense, "wide_deep", EMBEDDING_DIM)
    return Workload(
        train=train_reader.read(0, train_reader.num_samples),
        held_out=eval_reader.read(0, eval_reader.num_samples),
        features=features,
        layout=EmbeddingPlacement.from_features(features),
        columns={name: i for i, (name, _) in enumerate(columns)},
        teacher_auc=data.teacher_auc,
    )


def optimizer() -> Optimizer:
    return Optimizer("adagrad", LEARNING_RATE)


# ----------------------------------------------------------------------------- rows


# ----------------------------------------------------------------------------- dense model


class DenseNet:
    """Wide&Deep's dense part as plain TF variables with Keras' Adagrad formula, as in
    ``bench/_baselines.py`` (a*); the embedding rows come in as inputs."""

    def __init__(self, features: FeatureConfig, layout: EmbeddingPlacement) -> None:
        self.groups = layout.groups
        num_dense = features.num_dense
        deep_width = num_dense + sum(g.dim * len(g.tables) for g in self.groups if g.dim > 1)
        rng = np.random.default_rng(SEED)

        def glorot(fan_in: int, fan_out: int) -> np.ndarray:
            limit = math.sqrt(6.0 / (fan_in + fan_out))
            return rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)

        init: dict[str, np.ndarray] = {
            "wide_kernel": glorot(num_dense, 1),
            "wide_bias": np.zeros(1, np.float32),
        }
        width = deep_width
        for i, units in enumerate((*HIDDEN, 1)):
            init[f"deep_{i}_kernel"] = glorot(width, units)
            init[f"deep_{i}_bias"] = np.zeros(units, np.float32)
            width = units
        self.names = list(init)
        self.num_layers = len(HIDDEN) + 1
        self._init = init
        self.vars = {n: tf.Variable(v) for n, v in init.items()}
        self.accums = {
            n: tf.Variable(np.full(v.shape, ADAGRAD_INITIAL_ACCUMULATOR, np.float32))
            for n, v in init.items()
        }
        sig = [tf.TensorSpec([None, num_dense], tf.float32), tf.TensorSpec([None], tf.float32)]
        for g in self.groups:
            sig += [
                tf.TensorSpec([None, g.dim], tf.float32),
                tf.TensorSpec([None, len(g.tables)], tf.int32),
            ]
        self.step = tf.function(self._step, input_signature=sig, reduce_retracing=True)

    def _logits(self, dense: tf.Tensor, embedded: list[tf.Tensor]) -> tf.Tensor:
        v = self.vars
        wide = tf.matmul(dense, v["wide_kernel"]) + v["wide_bias"]
        deep_in = [dense]
        for group, rows in zip(self.groups, embedded, strict=True):
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

    def _step(self, dense: tf.Tensor, label: tf.Tensor, *group_inputs: tf.Tensor) -> Any:
        rows = list(group_inputs[0::2])
        inverse = list(group_inputs[1::2])
        with tf.GradientTape() as tape:
            tape.watch(rows)
            embedded = [tf.gather(r, i) for r, i in zip(rows, inverse, strict=True)]
            logits = self._logits(dense, embedded)
            loss = tf.reduce_mean(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits)
            )
        grads = tape.gradient(loss, [*rows, *(self.vars[n] for n in self.names)])
        lr = tf.constant(LEARNING_RATE, tf.float32)
        for name, grad in zip(self.names, grads[len(rows) :], strict=True):
            accum = self.accums[name].assign_add(grad * grad)
            self.vars[name].assign_sub(lr * grad / tf.sqrt(accum + EPSILON))
        return loss, [tf.convert_to_tensor(g) for g in grads[: len(rows)]]

    def reset(self) -> None:
        """Back to the initial weights: one net (one traced step) serves every run."""
        for n, v in self._init.items():
            self.vars[n].assign(v)
            self.accums[n].assign(np.full(v.shape, ADAGRAD_INITIAL_ACCUMULATOR, np.float32))

    def state(self) -> dict[str, np.ndarray]:
        out = {f"dense/{n}": v.numpy() for n, v in self.vars.items()}
        out.update({f"dstate/{n}/accum": v.numpy() for n, v in self.accums.items()})
        return out

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        for n in self.names:
            self.vars[n].assign(arrays[f"dense/{n}"])
            self.accums[n].assign(arrays[f"dstate/{n}/accum"])

    def numpy_logits(self, dense: np.ndarray, embedded: list[np.ndarray]) -> np.ndarray:
        v = {n: var.numpy() for n, var in self.vars.items()}
        wide = dense @ v["wide_kernel"] + v["wide_bias"]
        deep_in = [dense]
        for group, rows in zip(self.groups, embedded, strict=True):
            if group.dim == 1:
                wide = wide + rows.sum(axis=1)
            else:
                deep_in.append(rows.reshape(len(dense), -1))
        x = np.concatenate(deep_in, axis=1)
        for i in range(self.num_layers):
            x = x @ v[f"deep_{i}_kernel"] + v[f"deep_{i}_bias"]
            if i < self.num_layers - 1:
                x = np.maximum(x, 0)
        return (wide + x).ravel()


# ----------------------------------------------------------------------------- the cluster


@dataclass
class StepClock:
    """Seconds spent per part of the training steps (the trainer's thread only)."""

    pull: float = 0.0
    compute: float = 0.0
    push: float = 0.0
    parity: float = 0.0  # ECRM difference propagation, inside push
    degraded: float = 0.0  # ECRM degraded reads, inside pull
    steps: int = 0

    @property
    def total(self) -> float:
        return self.pull + self.compute + self.push


@dataclass
class GroupBatch:
    """One step's rows of one group: unique fused ids, their owners, per-PS selections."""

    group: EmbeddingGroup
    ids: np.ndarray
    inverse: np.ndarray
    per_ps: list[tuple[int, np.ndarray, np.ndarray]] = field(default_factory=list)


class PsHooks:
    """What ECRM changes in a PS's pull and push (``bench/_recovery_ecrm.py``): both run
    under the PS's lock; ``flush`` after it is released (parity messages to other PS)."""

    def pull(self, ps: int, table: EmbeddingTable, ids: np.ndarray) -> np.ndarray:
        return table.lookup(ids)

    def push(self, ps: int, table: EmbeddingTable, ids: np.ndarray, grads: np.ndarray) -> None:
        table.apply_gradients(ids, grads)

    def flush(self) -> None:
        return None


class Cluster:
    """``num_ps`` real parameter servers holding the embedding rows, and the dense model."""

    def __init__(self, work: Workload, num_ps: int, net: DenseNet) -> None:
        self.work = work
        self.num_ps = num_ps
        self.layout = work.layout
        # CPR-SSU (r, sample period): every PS's tables sample their pulls (``enable_ssu``).
        self.ssu: tuple[float, int] | None = None
        self.clock = StepClock()
        self.ps = [self.new_ps(i) for i in range(num_ps)]
        self.owner = {
            g.name: partition_of(g.name, np.arange(g.vocab_size, dtype=np.int64), num_ps).astype(
                np.int16
            )
            for g in self.layout.groups
        }
        self.net = net
        net.reset()
        self.hooks = PsHooks()
        # Held by the trainer while it touches a PS; ECRM's rebuild thread takes them too.
        self.locks = [threading.RLock() for _ in range(num_ps)]

    def new_ps(self, index: int) -> ParameterServer:
        """A PS process as it starts: empty tables, rows created on first use (and with
        CPR-SSU on, its tables sampling the pulls, as ``PartialRecovery.setup_ps`` does)."""
        ps = ParameterServer(index, self.num_ps, self.layout, optimizer(), SEED)
        if self.ssu is not None:
            r, period = self.ssu
            for table in ps.tables.values():
                table.enable_ssu(r, period, SEED + 31 * index + self.clock.steps)
        return ps

    def enable_ssu(self, r: float, sample_period: int) -> None:
        self.ssu = (r, sample_period)
        for p, ps in enumerate(self.ps):
            for table in ps.tables.values():
                table.enable_ssu(r, sample_period, SEED + 31 * p)

    def rows_held(self) -> int:
        return sum(t.size for ps in self.ps for t in ps.tables.values())

    def _split(self, batch: Batch) -> list[GroupBatch]:
        out = []
        for group in self.layout.groups:
            fused = group.fused_ids(batch.categorical, self.work.columns)
            ids, inverse = np.unique(fused, return_inverse=True)
            gb = GroupBatch(group, ids, inverse.reshape(fused.shape).astype(np.int32))
            owners = self.owner[group.name][ids]
            order = np.argsort(owners, kind="stable")
            counts = np.bincount(owners, minlength=self.num_ps)
            start = 0
            for p, c in enumerate(counts):
                if c:
                    pos = order[start : start + c]
                    gb.per_ps.append((p, ids[pos], pos))
                start += c
            out.append(gb)
        return out

    def train_step(self, step: int) -> float:
        batch = self.work.batch(step)
        t0 = time.perf_counter()
        groups = self._split(batch)
        inputs: list[Any] = [batch.dense, batch.label]
        for gb in groups:
            rows = np.empty((gb.ids.size, gb.group.dim), np.float32)
            for p, ids, pos in gb.per_ps:
                with self.locks[p]:
                    rows[pos] = self.hooks.pull(p, self.ps[p].tables[gb.group.name], ids)
            inputs += [rows, gb.inverse]
        t1 = time.perf_counter()
        loss, grads = self.net.step(*inputs)
        grads = [g.numpy() for g in grads]
        t2 = time.perf_counter()
        for gb, grad in zip(groups, grads, strict=True):
            for p, ids, pos in gb.per_ps:
                with self.locks[p]:
                    self.hooks.push(p, self.ps[p].tables[gb.group.name], ids, grad[pos])
                self.hooks.flush()
        t3 = time.perf_counter()
        c = self.clock
        c.pull += t1 - t0
        c.compute += t2 - t1
        c.push += t3 - t2
        c.steps += 1
        return float(loss)

    def evaluate(self) -> float:
        """Held-out AUC from the rows the PS hold now (read without creating any)."""
        held = self.work.held_out
        embedded = []
        for group in self.layout.groups:
            fused = group.fused_ids(held.categorical, self.work.columns)
            ids, inverse = np.unique(fused, return_inverse=True)
            rows = np.empty((ids.size, group.dim), np.float32)
            owners = self.owner[group.name][ids]
            for p in range(self.num_ps):
                mine = np.flatnonzero(owners == p)
                rows[mine] = self.ps[p].tables[group.name].lookup(ids[mine], create=False)
            embedded.append(rows[inverse.reshape(fused.shape)])
        return roc_auc(held.label, self.net.numpy_logits(held.dense, embedded))


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start
