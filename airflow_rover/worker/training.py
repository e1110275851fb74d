"""The training loop of a worker: lease shards, read samples, train against the PS.

Per step: unique fused ids per embedding group, the Keras model's loss and gradients
(``tf.gather``'s gradient sums duplicates per unique id), and one round trip per PS
(``PushPull``) that applies the previous step's gradients and reads the next step's rows while
this step's gradients are computed (``TrainLoop``: the worker replays its own update on the
rows read ahead, so it never computes on rows that miss its own last update, and with one
worker training is exactly sequential). Dense weights are mirrored on the worker
(``DenseMirror``) and travel back only when another worker changed them.
An input pipeline leases shards, reads samples and computes ids ahead, on a thread of its own
(``worker.prefetch``).
Training is asynchronous across workers: each pushes on its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.data.reader import SampleReader
from airflow_rover.rpc.master_client import MasterClient
from airflow_rover.worker.input_pipeline import IN_PROCESS, InputConfig, input_pipeline
from airflow_rover.worker.progress import Progress, start_heartbeats
from airflow_rover.worker.ps_model import PSModel
from airflow_rover.worker.relaunch import PS_LOST_CODES, wait_for_relaunch
from airflow_rover.worker.train_loop import TrainLoop

log = logging.getLogger(__name__)


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
    inputs: InputConfig = IN_PROCESS,
) -> Progress:
    """Lease shards until the master says the queue is done. ``ps_set_version``: that of the
    PS list ``model.ps`` was made from; ``report_s``: seconds between progress reports.

    A lost PS does not end the worker. Under ECRM it trains on (``core.ecrm.degraded``: lost rows
    are decoded, its part of each push held) until the master announces the replacement, then
    delivers what it held there and moves on (``TrainLoop._switch_ps_set``). Otherwise its
    training loop stops (what was in flight is dropped; the master requeues those shards from
    the PS ledgers), it waits for the master to announce the relaunched PS (a new PS set
    version) and trains on against it, TensorFlow and the input pipeline warm (elements leased
    before are skipped). Raises ``PSLost`` if that does not happen within
    ``RELAUNCH_WAIT_S``."""
    progress = Progress()
    start_heartbeats(master, node_id, progress, stop, report_s)
    wake = threading.Event()
    loop = TrainLoop(node_id, model, optimizer, master, progress, ps_set_version, stop, wake)
    # The lambda reads ``loop`` when called: the PS set of whichever loop trains now.
    pipeline, progress.ready_fill = input_pipeline(
        node_id,
        model,
        reader,
        master,
        batch_size,
        stop,
        lambda: loop.ps_set_version,
        wake,
        lambda version: loop.trains(version),
        inputs,
    )
    elements = _timed(pipeline, progress)
    while not _trained_to_the_end(loop, elements):
        loop = _loop_on_relaunched_ps(loop)
    master.heartbeat(node_id, progress.heartbeat())
    return progress


def _timed(elements: Iterator[dict[str, Any]], progress: Progress) -> Iterator[dict[str, Any]]:
    """``elements``, the time the trainer waits for each batch added to
    ``progress.input_wait_s``."""
    while True:
        t0 = time.perf_counter()
        try:
            element = next(elements)
        except StopIteration:
            return
        if int(element["label"].shape[0]):  # not the master's "wait": no shard to wait for
            waited = time.perf_counter() - t0
            progress.input_wait_s += waited
            progress.profile.add("worker/input", int(waited * 1e9))
        yield element


def _trained_to_the_end(loop: TrainLoop, elements: Iterator[dict[str, Any]]) -> bool:
    """Train ``elements`` with ``loop``: True once they end, False when a PS went away (what
    was in flight is dropped; the master requeues those shards from the PS ledgers)."""
    try:
        _run_loop(loop, elements)
        return True
    except grpc.RpcError as exc:
        if exc.code() not in PS_LOST_CODES:
            raise
        log.warning("%s: a parameter server went away (%s); waiting for it", loop.node_id, exc)
        return False
    finally:
        loop.close()


def _loop_on_relaunched_ps(lost: TrainLoop) -> TrainLoop:
    """A training loop against the relaunched PS, once the master announces them; the shards
    of ``lost`` (the loop that lost a PS) are given back."""
    cluster = wait_for_relaunch(lost.master, lost.ps_set_version, lost.stop)
    lost.move_to(cluster, carry=False)
    lost.model.offer_initial_weights()  # only what the PS lacks: none unless it lost them all
    loop = TrainLoop(
        lost.node_id,
        lost.model,
        lost.optimizer,
        lost.master,
        lost.progress,
        cluster.ps_set_version,
        lost.stop,
        lost.wake,
    )
    log.info(
        "%s: training on against the relaunched PS (PS set %d)", loop.node_id, loop.ps_set_version
    )
    return loop


def _run_loop(loop: TrainLoop, elements: Iterator[dict[str, Any]]) -> None:
    for element in elements:
        version = int(element["ps_set_version"])
        if version < loop.ps_set_version and not loop.trains(version):
            continue  # leased before a lost PS was relaunched: the master requeued its shard
        loop.feed(element if int(element["label"].shape[0]) else None, version)
    loop.feed(None)
