"""The Keras model whose embedding tables live on the parameter servers.

The model runs on rows read from the PS and on dense weights passed in (``stateless_call``):
its step function returns the loss and the gradients of both, which the training loop pushes.
A batch's ids per embedding group are made unique once, list columns' ids among them, so a
list column's rows are pulled and pushed with the others (its gradient summed per id); each
sample's rows of a list column are pooled in the graph (``worker.pooling``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from airflow_rover.core.spec import FeatureConfig
from airflow_rover.data.batch import RaggedIds
from airflow_rover.data.batch_ids import BatchIds, Element, ElementEncoder
from airflow_rover.data.reader import Batch
from airflow_rover.rpc.ps_client import PSClient
from airflow_rover.worker.flat_call import FlatCall
from airflow_rover.worker.models import DENSE_INPUT
from airflow_rover.worker.pooling import pool


class PSModel:
    """A Keras model whose embedding tables live on the parameter servers. ``columns``: the
    dataset's scalar categorical columns, ``lists``: its list columns (``Batch.lists``)."""

    def __init__(
        self,
        model: keras.Model,
        features: FeatureConfig,
        columns: list[str],
        ps: PSClient,
        lists: Sequence[str] = (),
    ) -> None:
        self.encoder = ElementEncoder(features, columns, lists)
        self.model = model
        self.features = features
        self.placement = self.encoder.placement
        self.groups = self.encoder.groups
        self.ps = ps
        self._scalar = self.encoder.scalar
        self._lists = self.encoder.lists
        self.variables = list(model.trainable_variables)
        self.var_names = [v.path for v in self.variables]
        self._non_trainable = [v.value for v in model.non_trainable_variables]
        ragged = [tf.TensorSpec([None], tf.int32) for _ in self._lists]
        signature = (
            tf.TensorSpec([None, features.num_dense], tf.float32),
            [tf.TensorSpec([None, g.dim], tf.float32) for g in self.groups],
            [tf.TensorSpec([None, len(s)], tf.int32) for s in self._scalar],
            ragged,
            list(ragged),
            [tf.TensorSpec(v.shape, tf.float32) for v in self.variables],
        )
        self._grad_fn = tf.function(
            self._loss_and_grads,
            input_signature=(*signature, *[tf.TensorSpec([None], tf.float32)] * 2),
        )
        self._predict_fn = tf.function(self._predict, input_signature=signature)
        # The step's one trace, called on flat inputs: a tf.function call first matches its
        # arguments against its traces, and a trace's call binds them to its signature.
        self._step_fn: FlatCall | None = None

    # -- graph functions ---------------------------------------------------------------------
    def _inputs(
        self,
        dense: tf.Tensor,
        rows: list[tf.Tensor],
        inverse: list[tf.Tensor],
        list_ids: list[tf.Tensor],
        segments: list[tf.Tensor],
    ) -> dict[str, tf.Tensor]:
        inputs = {DENSE_INPUT: dense}
        for scalar, group_rows, idx in zip(self._scalar, rows, inverse, strict=True):
            if scalar:
                per_table = tf.unstack(tf.gather(group_rows, idx), num=len(scalar), axis=1)
                inputs.update({t.name: e for t, e in zip(scalar, per_table, strict=True)})
        samples = tf.shape(dense)[0]
        for (group, table), ids, seg in zip(self._lists, list_ids, segments, strict=True):
            inputs[table.name] = pool(tf.gather(rows[group], ids), seg, samples, table.pooling)
        return inputs

    def _call(self, *args: Any, training: bool) -> tf.Tensor:
        """The model on the given dense weights (``stateless_call``: passed in, not assigned);
        ``args``: dense, rows, inverse, list ids, segments, weights."""
        *inputs, weights = args
        logits, _ = self.model.stateless_call(
            weights, self._non_trainable, self._inputs(*inputs), training=training
        )
        return tf.squeeze(logits, -1)

    def _loss_and_grads(
        self,
        dense: tf.Tensor,
        rows: list[tf.Tensor],
        inverse: list[tf.Tensor],
        list_ids: list[tf.Tensor],
        segments: list[tf.Tensor],
        weights: list[tf.Tensor],
        label: tf.Tensor,
        sample_weight: tf.Tensor,
    ) -> tuple[tf.Tensor, list[tf.Tensor], list[tf.Tensor]]:
        """The batch's loss is the mean of each sample's log loss times its weight (as Keras's
        ``sample_weight``); a weight of 1 leaves the loss bit-identical to the unweighted one."""
        with tf.GradientTape() as tape:
            tape.watch(rows)
            tape.watch(weights)
            logits = self._call(dense, rows, inverse, list_ids, segments, weights, training=True)
            losses = tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits)
            loss = tf.reduce_mean(sample_weight * losses)
        row_grads, var_grads = tape.gradient(loss, (rows, weights))
        # tf.gather's gradient is IndexedSlices; densifying sums the duplicates per unique id.
        row_grads = [tf.convert_to_tensor(g) for g in row_grads]
        var_grads = [tf.convert_to_tensor(g) for g in var_grads]
        return loss, row_grads, var_grads

    def _predict(
        self,
        dense: tf.Tensor,
        rows: list[tf.Tensor],
        inverse: list[tf.Tensor],
        list_ids: list[tf.Tensor],
        segments: list[tf.Tensor],
        weights: list[tf.Tensor],
    ) -> tf.Tensor:
        return tf.sigmoid(
            self._call(dense, rows, inverse, list_ids, segments, weights, training=False)
        )

    # -- host side ---------------------------------------------------------------------------
    def batch_ids(self, categorical: np.ndarray, lists: Sequence[RaggedIds] = ()) -> BatchIds:
        return self.encoder.batch_ids(categorical, lists)

    def offer_initial_weights(self) -> None:
        self.ps.init_dense(
            {n: v.numpy() for n, v in zip(self.var_names, self.variables, strict=True)}
        )

    def ids_element(self, batch: Batch) -> Element:
        """A batch and its ids: one element of the input pipeline (no PS access)."""
        return self.encoder.element(batch)

    def _list_inputs(self, element: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        return (
            [element[f"list/{t.name}"] for _, t in self._lists],
            [element[f"segments/{t.name}"] for _, t in self._lists],
        )

    def element_signature(self) -> dict[str, tf.TensorSpec]:
        spec = {
            "dense": tf.TensorSpec([None, self.features.num_dense], tf.float32),
            "label": tf.TensorSpec([None], tf.float32),
            "weight": tf.TensorSpec([None], tf.float32),
            "shard_id": tf.TensorSpec([], tf.int64),
            "key": tf.TensorSpec([], tf.int64),
            "last": tf.TensorSpec([], tf.bool),
            "ps_set_version": tf.TensorSpec([], tf.int64),
        }
        for g, scalar in zip(self.groups, self._scalar, strict=True):
            spec[f"unique/{g.name}"] = tf.TensorSpec([None], tf.int64)
            spec[f"inverse/{g.name}"] = tf.TensorSpec([None, len(scalar)], tf.int32)
        for _, t in self._lists:
            spec[f"list/{t.name}"] = tf.TensorSpec([None], tf.int32)
            spec[f"segments/{t.name}"] = tf.TensorSpec([None], tf.int32)
        return spec

    def gradients(
        self, element: dict[str, Any], rows: dict[str, np.ndarray], dense: dict[str, np.ndarray]
    ) -> tuple[float, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Loss, row gradients per group and dense gradients for one element."""
        if self._step_fn is None:
            self._step_fn = FlatCall(self._grad_fn.get_concrete_function())
        list_ids, segments = self._list_inputs(element)
        loss, row_grads, var_grads = self._step_fn(
            [
                element["dense"],
                *(rows[g.name] for g in self.groups),
                *(element[f"inverse/{g.name}"] for g in self.groups),
                *list_ids,
                *segments,
                *(dense[n] for n in self.var_names),
                element["label"],
                element["weight"],
            ]
        )
        row_out = {g.name: r.numpy() for g, r in zip(self.groups, row_grads, strict=True)}
        dense_out = {n: v.numpy() for n, v in zip(self.var_names, var_grads, strict=True)}
        return float(loss), row_out, dense_out

    def traces(self) -> int:
        """How often the step function was traced: 1 after ``warm_up`` and for good (its input
        signature is fixed), more would mean retracing on the hot path."""
        return int(self._grad_fn.experimental_get_tracing_count())

    def warm_up(self) -> None:
        """Trace the step function on a one-sample batch, so a worker that says it is ready
        trains at full speed from its first step (no PS access: zero rows, initial weights)."""
        step = self._grad_fn.get_concrete_function()
        step(
            np.zeros((1, self.features.num_dense), np.float32),
            [np.zeros((1, g.dim), np.float32) for g in self.groups],
            [np.zeros((1, len(s)), np.int32) for s in self._scalar],
            [np.zeros(0, np.int32) for _ in self._lists],
            [np.zeros(0, np.int32) for _ in self._lists],
            [v.numpy() for v in self.variables],
            np.zeros(1, np.float32),
            np.ones(1, np.float32),
        )
        self._step_fn = FlatCall(step)

    def predict(self, batch: Batch) -> np.ndarray:
        element = self.ids_element(batch)
        unique = {g.name: element[f"unique/{g.name}"] for g in self.groups}
        rows, dense = self.ps.pull(unique, create=False)
        out = self._predict_fn(
            element["dense"],
            [rows[g.name] for g in self.groups],
            [element[f"inverse/{g.name}"] for g in self.groups],
            *self._list_inputs(element),
            [dense[n] for n in self.var_names],
        )
        return np.asarray(out)
