"""The training loop of a worker: lease shards, read samples, train against the PS.

Per step: unique fused ids per embedding group, the Keras model's loss and gradients
(``tf.gather``'s gradient sums duplicates per unique id), and one round trip per PS
(``PushPull``) that applies the previous step's gradients and reads the next step's rows while
this step's gradients are computed (``_TrainLoop``: the worker replays its own update on the
rows read ahead, so it never computes on rows that miss its own last update, and with one
worker training is exactly sequential). Dense weights are mirrored on the worker
(``DenseMirror``) and travel back only when another worker changed them.
A ``tf.data`` pipeline leases shards, reads samples and computes ids ahead (``prefetch``).
Training is asynchronous across workers: each pushes on its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import keras
import numpy as np
import tensorflow as tf

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.ledger import NO_KEY
from airflow_rover.core.metrics import roc_auc
from airflow_rover.core.spec import FeatureConfig
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.data.reader import Batch, SampleReader
from airflow_rover.rpc import master_api
from airflow_rover.rpc.master_client import MasterClient
from airflow_rover.rpc.ps_client import DenseReply, PSClient, Push
from airflow_rover.worker.models import DENSE_INPUT

log = logging.getLogger(__name__)

PREFETCH_BATCHES = 2
NO_SHARD = -1


@dataclass
class BatchIds:
    """Unique fused ids per embedding group and each sample's (batch, tables) index into them."""

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
        self.layout = EmbeddingPlacement.from_features(features)
        self.groups = self.layout.groups
        self.ps = ps
        self._column_index = {name: i for i, name in enumerate(columns)}
        self.variables = list(model.trainable_variables)
        self.var_names = [v.path for v in self.variables]
        self._non_trainable = [v.value for v in model.non_trainable_variables]
        signature = (
            tf.TensorSpec([None, features.num_dense], tf.float32),
            [tf.TensorSpec([None, g.dim], tf.float32) for g in self.groups],
            [tf.TensorSpec([None, len(g.tables)], tf.int32) for g in self.groups],
            [tf.TensorSpec(v.shape, tf.float32) for v in self.variables],
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
        inputs = {DENSE_INPUT: dense}
        for group, group_rows, idx in zip(self.groups, rows, inverse, strict=True):
            per_table = tf.unstack(tf.gather(group_rows, idx), num=len(group.tables), axis=1)
            inputs.update({t.name: e for t, e in zip(group.tables, per_table, strict=True)})
        return inputs

    def _call(
        self,
        dense: tf.Tensor,
        rows: list[tf.Tensor],
        inverse: list[tf.Tensor],
        weights: list[tf.Tensor],
        training: bool,
    ) -> tf.Tensor:
        """The model on the given dense weights (``stateless_call``: passed in, not assigned)."""
        logits, _ = self.model.stateless_call(
            weights, self._non_trainable, self._inputs(dense, rows, inverse), training=training
        )
        return tf.squeeze(logits, -1)

    def _loss_and_grads(
        self,
        dense: tf.Tensor,
        rows: list[tf.Tensor],
        inverse: list[tf.Tensor],
        weights: list[tf.Tensor],
        label: tf.Tensor,
    ) -> tuple[tf.Tensor, list[tf.Tensor], list[tf.Tensor]]:
        with tf.GradientTape() as tape:
            tape.watch(rows)
            tape.watch(weights)
            logits = self._call(dense, rows, inverse, weights, training=True)
            loss = tf.reduce_mean(
                tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits)
            )
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
        weights: list[tf.Tensor],
    ) -> tf.Tensor:
        return tf.sigmoid(self._call(dense, rows, inverse, weights, training=False))

    # -- host side ---------------------------------------------------------------------------
    def batch_ids(self, categorical: np.ndarray) -> BatchIds:
        unique: dict[str, np.ndarray] = {}
        inverse: dict[str, np.ndarray] = {}
        for group in self.groups:
            fused = group.fused_ids(categorical, self._column_index)
            uniq, inv = np.unique(fused, return_inverse=True)
            unique[group.name] = uniq
            inverse[group.name] = inv.reshape(fused.shape).astype(np.int32)
        return BatchIds(unique, inverse)

    def offer_initial_weights(self) -> None:
        self.ps.init_dense(
            {n: v.numpy() for n, v in zip(self.var_names, self.variables, strict=True)}
        )

    def ids_element(self, batch: Batch) -> dict[str, np.ndarray]:
        """A batch and its ids: one element of the input pipeline (no PS access)."""
        ids = self.batch_ids(batch.categorical)
        element = {"dense": batch.dense, "label": batch.label}
        for g in self.groups:
            element[f"unique/{g.name}"] = ids.unique[g.name]
            element[f"inverse/{g.name}"] = ids.inverse[g.name]
        return element

    def element_signature(self) -> dict[str, tf.TensorSpec]:
        spec = {
            "dense": tf.TensorSpec([None, self.features.num_dense], tf.float32),
            "label": tf.TensorSpec([None], tf.float32),
            "shard_id": tf.TensorSpec([], tf.int64),
            "key": tf.TensorSpec([], tf.int64),
            "last": tf.TensorSpec([], tf.bool),
            "layout": tf.TensorSpec([], tf.int64),
        }
        for g in self.groups:
            spec[f"unique/{g.name}"] = tf.TensorSpec([None], tf.int64)
            spec[f"inverse/{g.name}"] = tf.TensorSpec([None, len(g.tables)], tf.int32)
        return spec

    def gradients(
        self, element: dict[str, Any], rows: dict[str, np.ndarray], dense: dict[str, np.ndarray]
    ) -> tuple[float, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Loss, row gradients per group and dense gradients for one element."""
        loss, row_grads, var_grads = self._grad_fn(
            element["dense"],
            [rows[g.name] for g in self.groups],
            [element[f"inverse/{g.name}"] for g in self.groups],
            [dense[n] for n in self.var_names],
            element["label"],
        )
        row_out = {g.name: r.numpy() for g, r in zip(self.groups, row_grads, strict=True)}
        dense_out = {n: v.numpy() for n, v in zip(self.var_names, var_grads, strict=True)}
        return float(loss), row_out, dense_out

    def warm_up(self) -> None:
        """Trace the step function on a one-sample batch, so a worker that says it is ready
        trains at full speed from its first step (no PS access: zero rows, initial weights)."""
        self._grad_fn(
            np.zeros((1, self.features.num_dense), np.float32),
            [np.zeros((1, g.dim), np.float32) for g in self.groups],
            [np.zeros((1, len(g.tables)), np.int32) for g in self.groups],
            [v.numpy() for v in self.variables],
            np.zeros(1, np.float32),
        )

    def predict(self, batch: Batch) -> np.ndarray:
        element = self.ids_element(batch)
        unique = {g.name: element[f"unique/{g.name}"] for g in self.groups}
        rows, dense = self.ps.pull(unique, create=False)
        out = self._predict_fn(
            element["dense"],
            [rows[g.name] for g in self.groups],
            [element[f"inverse/{g.name}"] for g in self.groups],
            [dense[n] for n in self.var_names],
        )
        return np.asarray(out)


class DenseMirror:
    """The worker's copy of the dense weights and their optimizer state, kept equal to the PS's.

    After each push the worker applies its own dense gradients locally with the PS's optimizer
    (the same NumPy code on the same float32 bytes, so the result is bit-identical). When no
    other worker pushed in between, the PS's dense version is the one the worker expects and
    nothing travels back; otherwise the PS sends its values and state and the copy is replaced.
    One worker thus moves its dense gradients once per step instead of gradients + weights.
    The model reads these values as inputs of its step function (nothing is assigned).
    """

    def __init__(self, model: PSModel, optimizer: Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer
        self.owner = {name: model.ps.dense_owner(name) for name in model.var_names}
        self._owners = set(self.owner.values())
        self.values: dict[str, np.ndarray] = {}
        self.state: dict[str, dict[str, np.ndarray]] = {}
        self.versions = [-1] * model.ps.num_ps  # -1: nothing known yet, the PS sends it all

    def expected(self, pushing: bool) -> list[int]:
        """The versions each PS will have after this worker's push, if nobody else pushes."""
        return [
            v + 1 if pushing and v >= 0 and i in self._owners else v
            for i, v in enumerate(self.versions)
        ]

    def after_reply(self, reply: DenseReply, own: dict[str, np.ndarray] | None) -> None:
        """Take a PushPull's reply, then apply ``own`` (gradients the reply cannot include yet:
        they travel with the next push)."""
        for name, ps in self.owner.items():
            if reply.fresh[ps]:
                self.values[name] = np.array(reply.values[name])
                self.state[name] = {k: np.array(v) for k, v in reply.state.get(name, {}).items()}
            if own is not None:
                self.optimizer.apply(self.values[name], self.state[name], own[name])
        self.versions = list(reply.versions)

    def pushed(self) -> None:
        """A plain push of gradients already applied here has landed."""
        self.versions = self.expected(pushing=True)


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

    def heartbeat(self) -> master_api.Heartbeat:
        return master_api.Heartbeat(
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


def leased_batches(
    node_id: str,
    reader: SampleReader,
    master: MasterClient,
    batch_size: int,
    stop: threading.Event,
    wait_s: float = 0.2,
    layout: Callable[[], int | None] = lambda: None,
    wake: threading.Event | None = None,
    keeps: Callable[[int], bool] | None = None,
) -> Iterator[tuple[Batch, int, bool, int, int]]:
    """(batch, shard id, last batch of its shard, batch key, PS layout version) for every shard
    the master hands out (from where it resumes: a requeued shard skips batches every PS already
    applied), and an empty batch whenever the master has nothing to hand out yet (``wait``): the
    trainer then flushes its pending gradients, which may be exactly what completes the queue
    (or lets a PS resize begin). ``layout()``: the PS layout the trainer uses now; the master
    hands no shard to a trainer of another layout (one that has not noticed a PS change).
    ``wake``: cuts a wait short (the trainer learnt of a new layout). ``keeps(version)``:
    whether the trainer still trains shards leased under that layout (default: it is the
    trainer's; an ECRM replacement keeps the shards of the layout before)."""
    if keeps is None:
        keeps = lambda version: layout() in (None, version)  # noqa: E731
    while not stop.is_set():
        reply = master.lease(node_id, layout())
        if reply.status == "done":
            return
        if reply.status == "wait" or reply.shard is None:
            yield reader.read(0, 0), NO_SHARD, False, NO_KEY, reply.ps_set_version
            if wake is None:
                time.sleep(wait_s)
            elif wake.wait(wait_s):
                wake.clear()
            continue
        shard = reply.shard
        samples = reader.read(shard.start, shard.end)
        for index, lo in enumerate(range(0, len(samples), batch_size)):
            if not keeps(reply.ps_set_version):
                break  # the trainer moved on (a lost PS is back): the master requeued the shard
            hi = min(lo + batch_size, len(samples))
            batch = Batch(samples.dense[lo:hi], samples.categorical[lo:hi], samples.label[lo:hi])
            last = hi == len(samples)
            yield batch, shard.shard_id, last, shard.first_key + index, reply.ps_set_version


PS_LOST_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
RELAUNCH_WAIT_S = 60.0  # how long a worker waits for a lost PS to be back before giving up
RELAUNCH_POLL_S = 0.05  # between requests the master did not hold (a local GET: cheap)
RELAUNCH_WAIT_REQUEST_S = 1.0  # how long the master holds one request for the new layout


class PSLost(Exception):
    """A PS went away and did not come back within ``RELAUNCH_WAIT_S`` (or the job ended)."""


def train(
    node_id: str,
    model: PSModel,
    optimizer: Optimizer,
    reader: SampleReader,
    master: MasterClient,
    batch_size: int,
    stop: threading.Event,
    ps_set_version: int = 0,
    report_s: float = 1.0,
) -> Progress:
    """Lease shards until the master says the queue is done. ``ps_set_version``: that of the
    PS list ``model.ps`` was made from; ``report_s``: seconds between progress reports.

    A lost PS does not end the worker. Under ECRM it trains on (``core.ecrm.degraded``: lost rows
    are decoded, its part of each push held) until the master announces the replacement, then
    delivers what it held there and moves on (``_TrainLoop._switch_layout``). Otherwise its
    training loop stops (what was in flight is dropped; the master requeues those shards from
    the PS ledgers), it waits for the master to announce the relaunched PS (a new layout
    version) and trains on against it, TensorFlow and the input pipeline warm (elements leased
    before are skipped). Raises ``PSLost`` if that does not happen within
    ``RELAUNCH_WAIT_S``."""
    progress = Progress()
    start_heartbeats(master, node_id, progress, stop, report_s)
    wake = threading.Event()
    loop = _TrainLoop(node_id, model, optimizer, master, progress, ps_set_version, stop, wake)
    # The lambda reads ``loop`` when called: the layout of whichever loop trains now.
    elements = iter(
        _input_pipeline(
            node_id,
            model,
            reader,
            master,
            batch_size,
            stop,
            lambda: loop.ps_set_version,
            wake,
            lambda version: loop.trains(version),
        )
    )
    while True:
        try:
            _run_loop(loop, elements)
            break
        except grpc.RpcError as exc:
            if exc.code() not in PS_LOST_CODES:
                raise
            log.warning("%s: a parameter server went away (%s); waiting for it", node_id, exc)
        finally:
            loop.close()
        cluster = _wait_for_relaunch(master, loop.ps_set_version, stop)
        loop.move_to(cluster, carry=False)
        model.offer_initial_weights()  # only what the PS lacks: none unless it lost them all
        loop = _TrainLoop(
            node_id, model, optimizer, master, progress, cluster.ps_set_version, stop, wake
        )
        log.info(
            "%s: training on against the relaunched PS (layout %d)", node_id, loop.ps_set_version
        )
    master.heartbeat(node_id, progress.heartbeat())
    return progress


def _input_pipeline(
    node_id: str,
    model: PSModel,
    reader: SampleReader,
    master: MasterClient,
    batch_size: int,
    stop: threading.Event,
    layout: Callable[[], int],
    wake: threading.Event | None = None,
    keeps: Callable[[int], bool] | None = None,
) -> tf.data.Dataset:
    """The leased shards' batches as model inputs, prefetched; built once per worker (building
    one costs about 0.1 s, which a relaunched PS would otherwise add to every recovery).
    ``layout()``: the PS layout the trainer is on (leases ask for it)."""

    def elements() -> Iterator[dict[str, np.ndarray]]:
        batches = leased_batches(
            node_id, reader, master, batch_size, stop, layout=layout, wake=wake, keeps=keeps
        )
        for batch, shard_id, last, key, version in batches:
            element = model.ids_element(batch)
            element["shard_id"] = np.array(shard_id, dtype=np.int64)
            element["key"] = np.array(key, dtype=np.int64)
            element["last"] = np.array(last)
            element["layout"] = np.array(version, dtype=np.int64)
            yield element

    return tf.data.Dataset.from_generator(
        elements, output_signature=model.element_signature()
    ).prefetch(PREFETCH_BATCHES)


def _run_loop(loop: _TrainLoop, elements: Iterator[dict[str, Any]]) -> None:
    for element in elements:
        version = int(element["layout"])
        if version < loop.ps_set_version and not loop.trains(version):
            continue  # leased before a lost PS was relaunched: the master requeued its shard
        loop.feed(element if int(element["label"].shape[0]) else None, version)
    loop.feed(None)


def _wait_for_relaunch(
    master: MasterClient, layout: int, stop: threading.Event
) -> master_api.ClusterInfo:
    """The PS list once the master announces a layout after ``layout`` (the lost PS is back);
    the master holds each request until then (up to ``RELAUNCH_WAIT_REQUEST_S``)."""
    deadline = time.monotonic() + RELAUNCH_WAIT_S
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            cluster = master.next_layout(layout, RELAUNCH_WAIT_REQUEST_S)
        except httpx.HTTPStatusError:
            cluster = None  # the PS are not all up yet
        if cluster is not None and cluster.ps_set_version > layout:
            return cluster
        stop.wait(RELAUNCH_POLL_S)  # the master answered without waiting (or the wait ran out)
    raise PSLost("the master stopped the job" if stop.is_set() else "no relaunched PS in time")


@dataclass
class _Pulled:
    """An element whose rows are read (and replayed up to date), gradients not yet computed."""

    element: dict[str, Any]
    unique: dict[str, np.ndarray]
    rows: dict[str, np.ndarray]


class _TrainLoop:
    """Overlaps each step's gradients with the PushPull that sends the previous step's
    gradients and reads the next step's rows.

    The rows read ahead miss one update: this step's own, still being computed. The PS returns
    the optimizer state of the rows both steps touch, and the worker replays its update on them
    with the PS's optimizer code (bit-identical, as ``DenseMirror`` does for dense weights). So
    with one worker training stays exactly sequential while the PS works during the worker's
    step instead of between steps. The request is encoded and sent, and the replies merged
    (a lost PS's rows decoded), on a sender thread, so that Python work overlaps TensorFlow's
    step too (TF releases the GIL). A shard is reported
    done once the push of its last batch has landed.
    """

    def __init__(
        self,
        node_id: str,
        model: PSModel,
        optimizer: Optimizer,
        master: MasterClient,
        progress: Progress,
        ps_set_version: int = 0,
        stop: threading.Event | None = None,
        wake: threading.Event | None = None,
    ) -> None:
        self.node_id = node_id
        self.stop = stop or threading.Event()
        self.wake = wake or threading.Event()  # set when the loop should see a new layout
        self.ps_set_version = ps_set_version
        self.model = model
        self.optimizer = optimizer
        self.master = master
        self.progress = progress
        self.mirror = DenseMirror(model, optimizer)
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="push-pull")
        self.current: _Pulled | None = None
        self.pending: Push | None = None  # applied here, not yet pushed
        self.pending_key = NO_KEY  # the batch ``pending`` comes from
        self.pending_shard = NO_SHARD  # a shard whose last gradients are in ``pending``
        self.deferred: list[int] = []  # shards done but for pushes held for a lost PS
        self.carried: set[int] = set()  # older layouts whose shards are still trained (ECRM)
        self.relaunched: master_api.ClusterInfo | None = None  # a lost PS's replacement, announced
        self._watcher: threading.Thread | None = None
        self._watch_error: Exception | None = None

    def feed(self, element: dict[str, Any] | None, layout: int | None = None) -> None:
        """The next element of the input pipeline, or None when there is none to train now
        (the master said wait, or the input ended): then everything pending is pushed.
        ``layout``: the PS layout the master announced with it."""
        if self._watch_error is not None:
            raise self._watch_error
        if self.relaunched is not None:
            if self.relaunched.ps_set_version > self.ps_set_version:
                self._switch_layout(self.relaunched)
            self.relaunched = None  # (or a lease reply had told of it first)
        if layout is not None and layout < self.ps_set_version and not self.trains(layout):
            return  # leased before a lost PS's replacement came: that shard is given back
        if layout is not None and layout > self.ps_set_version:
            self._switch_layout()
        if self.current is None:
            if element is not None:
                self.current = self._pull(element)
            return
        self.current = self._step(self.current, element)
        if self.current is None:
            self._flush()

    def _unique(self, element: dict[str, Any]) -> dict[str, np.ndarray]:
        return {g.name: element[f"unique/{g.name}"].numpy() for g in self.model.groups}

    def _pull(self, element: dict[str, Any]) -> _Pulled:
        """Read an element's rows when nothing is pending (the first step after a pause)."""
        unique = self._unique(element)
        reply = self.model.ps.push_pull_async(None, unique, self.mirror.expected(False)).result()
        self._watch_if_lost()
        self.mirror.after_reply(reply.dense, None)
        return _Pulled(element, unique, reply.rows)

    def _step(self, cur: _Pulled, nxt: dict[str, Any] | None) -> _Pulled | None:
        t0 = time.perf_counter()
        next_unique = self._unique(nxt) if nxt is not None else {}
        both = {  # ids both steps touch: (ids, positions in the next step, in this one)
            g: np.intersect1d(ids, cur.unique[g], assume_unique=True, return_indices=True)
            for g, ids in next_unique.items()
        }
        start = self.model.ps.push_pull_async  # its replies merged on the sender thread too
        call = self._sender.submit(
            lambda *args, **kwargs: start(*args, **kwargs).result(),
            self.pending,
            next_unique,
            self.mirror.expected(pushing=self.pending is not None),
            state_ids={g: common for g, (common, _, _) in both.items()},
            push_key=self.pending_key,
        )
        _, row_grads, dense_grads = self.model.gradients(cur.element, cur.rows, self.mirror.values)
        reply = call.result()
        self._watch_if_lost()
        self._report(self.pending_shard)  # the push that just landed completed it
        self.mirror.after_reply(reply.dense, dense_grads)
        self.pending = (cur.unique, row_grads, dense_grads)
        self.pending_key = int(cur.element["key"])
        self.pending_shard = int(cur.element["shard_id"]) if bool(cur.element["last"]) else NO_SHARD
        self.progress.record(int(cur.element["label"].shape[0]), time.perf_counter() - t0)
        if nxt is None:
            return None
        for g, (_, at_next, at_cur) in both.items():
            rows = reply.rows[g][at_next]
            state = reply.row_state[g]
            self.optimizer.apply(rows, state, row_grads[g][at_cur])
            reply.rows[g][at_next] = rows
        return _Pulled(nxt, next_unique, reply.rows)

    def _watch_if_lost(self) -> None:
        """Once the client has lost a PS (ECRM: it trains on without it), wait in the
        background for the master to announce the replacement; the loop moves to it at its
        next element (``wake`` cuts the input pipeline's wait for one short)."""
        lost = self.model.ps.lost
        if lost is None or self._watcher is not None:
            return
        log.warning(
            "%s: PS %d went away; training on (its rows decoded from parity, its pushes held) "
            "until its replacement is announced",
            self.node_id,
            lost.index,
        )

        def watch() -> None:
            try:
                self.relaunched = _wait_for_relaunch(self.master, self.ps_set_version, self.stop)
            except Exception as exc:  # raised by the training loop (no replacement, no master)
                self._watch_error = exc
            self.wake.set()

        self._watcher = threading.Thread(target=watch, name="relaunch-watch", daemon=True)
        self._watcher.start()

    def trains(self, version: int) -> bool:
        """Whether shards leased under PS layout ``version`` are still this loop's to train."""
        return version == self.ps_set_version or version in self.carried

    def move_to(self, cluster: master_api.ClusterInfo, carry: bool) -> None:
        """Point the model at ``cluster``'s PS and deliver the pushes held for a lost PS to
        its replacement. ``carry``: this worker trains on its shards (an ECRM replacement):
        the shards finished meanwhile are reported now (the master checks each against the
        PS ledgers: the lost PS may have applied a batch it never passed on to its parity
        holders, which the replacement lacks and is trained again). Otherwise the shards are
        given back, and the master resumes each from the ledgers."""
        old = self.model.ps
        lost = old.lost
        if lost is not None and len(cluster.ps) != old.num_ps:
            raise RuntimeError(f"PS {lost.index} was lost and the PS were resized meanwhile")
        self.model.ps = old.reconnect(cluster.ps)
        if lost is not None:
            self.model.ps.deliver(lost, self.mirror.values)
            log.info(
                "%s: %d push(es) held for PS %d delivered to its replacement",
                self.node_id,
                len(lost.held),
                lost.index,
            )
        deferred, self.deferred = self.deferred, []
        if carry:
            for shard_id in deferred:
                self._report(shard_id)
        else:
            self.master.release_shards(self.node_id)

    def _switch_layout(self, cluster: master_api.ClusterInfo | None = None) -> None:
        """The PS changed: push what is pending (a lost PS's part is held and delivered to
        its replacement) and read the new PS list. Under ECRM (a lost PS replaced: the PS
        are never resized) training goes on where it was, on the same shards, the dense
        weights read afresh with the next step. Otherwise (a resize) it starts over against
        the new PS (rows and dense weights read afresh, the shards given back)."""
        self._flush()
        cluster = cluster or self.master.cluster()
        carry = self.model.ps.ecrm is not None
        self.move_to(cluster, carry)
        self.relaunched, self._watcher = None, None
        if carry:
            self.carried.add(self.ps_set_version)
            self.mirror.versions = [-1] * self.model.ps.num_ps  # every PS sends them all
        else:
            self.current = None
            self.mirror = DenseMirror(self.model, self.optimizer)
        log.info(
            "%s: PS layout %d -> %d (%d PS)",
            self.node_id,
            self.ps_set_version,
            cluster.ps_set_version,
            len(cluster.ps),
        )
        self.ps_set_version = cluster.ps_set_version
        self.wake.set()  # the input pipeline may wait on a lease refused to the old layout

    def close(self) -> None:
        self._sender.shutdown(wait=True)

    def _flush(self) -> None:
        if self.pending is not None:
            self.model.ps.push(*self.pending, key=self.pending_key)
            self._watch_if_lost()
            self.mirror.pushed()
            self.pending = None
        self._report(self.pending_shard)
        self.pending_shard = NO_SHARD

    def _report(self, shard_id: int) -> None:
        """The shard's last push landed: done (once a lost PS's replacement has its part:
        ``move_to``)."""
        if shard_id == NO_SHARD:
            return
        if self.model.ps.lost is not None:
            self.deferred.append(shard_id)
        elif not self.master.shard_done(self.node_id, shard_id):
            log.warning("master rejected completion of shard %d", shard_id)


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
