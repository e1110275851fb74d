"""The training loop: each step's gradients overlapped with the next step's PushPull."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from airflow_rover.core.ledger import NO_KEY
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.rpc import master_api
from airflow_rover.rpc.master_client import MasterClient
from airflow_rover.rpc.ps_client import Push, PushPullReply
from airflow_rover.worker.dense_mirror import DenseMirror
from airflow_rover.worker.progress import Progress
from airflow_rover.worker.ps_model import PSModel
from airflow_rover.worker.relaunch import wait_for_relaunch
from airflow_rover.worker.shard_leases import NO_SHARD

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Common:
    """The ids two consecutive steps both touch, and their positions in each step's ids."""

    ids: np.ndarray
    at_next: np.ndarray
    at_cur: np.ndarray


def _common(next_ids: np.ndarray, cur_ids: np.ndarray) -> _Common:
    return _Common(*np.intersect1d(next_ids, cur_ids, assume_unique=True, return_indices=True))


@dataclass
class _Pulled:
    """An element whose rows are read (and replayed up to date), gradients not yet computed."""

    element: dict[str, Any]
    unique: dict[str, np.ndarray]
    rows: dict[str, np.ndarray]


class TrainLoop:
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
        self.wake = wake or threading.Event()  # set when the loop should see a new PS set
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
        self.carried: set[int] = set()  # older PS sets whose shards are still trained (ECRM)
        self.relaunched: master_api.ClusterInfo | None = None  # a lost PS's replacement, announced
        self._watcher: threading.Thread | None = None
        self._watch_error: Exception | None = None

    def feed(self, element: dict[str, Any] | None, ps_set_version: int | None = None) -> None:
        """The next element of the input pipeline, or None when there is none to train now
        (the master said wait, or the input ended): then everything pending is pushed.
        ``ps_set_version``: that of the PS set the master announced with it."""
        if self._watch_error is not None:
            raise self._watch_error
        if self.relaunched is not None:
            if self.relaunched.ps_set_version > self.ps_set_version:
                self._switch_ps_set(self.relaunched)
            self.relaunched = None  # (or a lease reply had told of it first)
        if (
            ps_set_version is not None
            and ps_set_version < self.ps_set_version
            and not self.trains(ps_set_version)
        ):
            return  # leased before a lost PS's replacement came: that shard is given back
        if ps_set_version is not None and ps_set_version > self.ps_set_version:
            self._switch_ps_set()
        if self.current is None:
            if element is not None:
                self.current = self._pull(element)
            return
        self.current = self._step(self.current, element)
        if self.current is None:
            self._flush()

    def _unique(self, element: dict[str, Any]) -> dict[str, np.ndarray]:
        return {g.name: np.asarray(element[f"unique/{g.name}"]) for g in self.model.groups}

    def _pull(self, element: dict[str, Any]) -> _Pulled:
        """Read an element's rows when nothing is pending (the first step after a pause)."""
        unique = self._unique(element)
        with self.progress.profile.phase("worker/first_pull"):
            expected, dense = self.mirror.request(pushing=False)
            pending = self.model.ps.push_pull_async(None, unique, expected, dense=dense)
            reply = pending.result()
        self._watch_if_lost()
        self.mirror.after_reply(reply.dense, None)
        return _Pulled(element, unique, reply.rows)

    def _step(self, cur: _Pulled, nxt: dict[str, Any] | None) -> _Pulled | None:
        profile = self.progress.profile
        t0 = time.perf_counter_ns()
        next_unique = self._unique(nxt) if nxt is not None else {}
        start = self.model.ps.push_pull_async  # its replies merged on the sender thread too
        pending, key = self.pending, self.pending_key
        expected, dense = self.mirror.request(pushing=pending is not None)

        def push_pull() -> tuple[PushPullReply, dict[str, _Common]]:
            """On the sender thread, during the TF step: the ids both steps touch, then the
            PushPull that reads their optimizer state with the next step's rows."""
            both = {g: _common(ids, cur.unique[g]) for g, ids in next_unique.items()}
            state_ids = {g: common.ids for g, common in both.items()}
            reply = start(
                pending, next_unique, expected, state_ids=state_ids, push_key=key, dense=dense
            )
            return reply.result(), both

        call = self._sender.submit(push_pull)
        t1, cpu = time.perf_counter_ns(), time.thread_time_ns()
        _, row_grads, dense_grads = self.model.gradients(cur.element, cur.rows, self.mirror.values)
        profile.add("worker/tf_step_cpu", time.thread_time_ns() - cpu)
        t2 = time.perf_counter_ns()
        early = self.mirror.apply_early(dense_grads)
        t3 = time.perf_counter_ns()
        reply, both = call.result()
        t4 = time.perf_counter_ns()
        self._watch_if_lost()
        self._report(self.pending_shard)  # the push that just landed completed it
        self.mirror.after_reply(reply.dense, dense_grads, applied=early)
        self.pending = (cur.unique, row_grads, dense_grads)
        self.pending_key = int(cur.element["key"])
        self.pending_shard = int(cur.element["shard_id"]) if bool(cur.element["last"]) else NO_SHARD
        t5 = time.perf_counter_ns()
        if nxt is not None:
            for g, common in both.items():
                rows = reply.rows[g][common.at_next]
                state = reply.row_state[g]
                self.optimizer.apply(rows, state, row_grads[g][common.at_cur])
                reply.rows[g][common.at_next] = rows
        t6 = time.perf_counter_ns()
        samples = int(cur.element["label"].shape[0])
        self.progress.record(samples, (t6 - t0) / 1e9)
        profile.add("worker/ids", t1 - t0)
        profile.add("worker/tf_step", t2 - t1)
        profile.add("worker/dense_mirror", t3 - t2 + t5 - t4)
        profile.add("worker/wait_push_pull", t4 - t3)
        profile.add("worker/replay", t6 - t5)
        profile.step(samples)
        return None if nxt is None else _Pulled(nxt, next_unique, reply.rows)

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
                self.relaunched = wait_for_relaunch(self.master, self.ps_set_version, self.stop)
            except Exception as exc:  # raised by the training loop (no replacement, no master)
                self._watch_error = exc
            self.wake.set()

        self._watcher = threading.Thread(target=watch, name="relaunch-watch", daemon=True)
        self._watcher.start()

    def trains(self, version: int) -> bool:
        """Whether shards leased under PS set ``version`` are still this loop's to train."""
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

    def _switch_ps_set(self, cluster: master_api.ClusterInfo | None = None) -> None:
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
            "%s: PS set %d -> %d (%d PS)",
            self.node_id,
            self.ps_set_version,
            cluster.ps_set_version,
            len(cluster.ps),
        )
        self.ps_set_version = cluster.ps_set_version
        self.wake.set()  # the input pipeline may wait on a lease refused to the old PS set

    def close(self) -> None:
        self._sender.shutdown(wait=True)

    def _flush(self) -> None:
        if self.pending is not None:
            with self.progress.profile.phase("worker/flush"):
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
