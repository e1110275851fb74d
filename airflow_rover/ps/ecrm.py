"""ECRM on a running PS process (ECRM section 3): parity of the other PS's rows, difference
propagation after each applied push, and the rebuild of a lost PS while training goes on.

``core.ecrm`` has the coding (placement, codecs, propagation, decode plans, the chunked
rebuild state machine); this module runs it over gRPC between PS processes. Every call is one
``Ecrm`` RPC whose ``op`` picks the operation (``EcrmPeer.handle``):

- ``setup`` (master, every PS, before training): the layout (``k``), the PS addresses and
  incarnations. Each PS then sends its batch ledger to its parity holders, so a holder knows
  every batch a source has applied (a replacement's ledger is what its holders know).
- ``encode`` (master, every PS, after a restore): re-encode the parity this PS holds from the
  restored rows of its sources, before any worker trains.
- ``rebuild`` (master, a replacement PS started empty): fence the dead incarnation at the
  holders (they hand back its ledger and the last replica of its dense variables) while its
  sources re-point their channels at it and say which rows they have (one round trip), and
  rebuild it chunk by chunk in a thread (``_Rebuild``).
- ``parity`` (a source, in order per holder), ``parity_read``, ``applied``, ``fence``,
  ``reset_holder``, ``created``, ``fields``, ``lock``, ``unlock``, ``status``.

Threads: the PS's apply lock covers a push, its propagation and the update buffer (so a
lock's ``sent()`` watermark is exact); ``_parity_lock`` covers the ``ParityStore``. A sender
thread per holder delivers the messages in order and retries until the holder (or its
replacement, which re-points the channel) takes them. Dense variables are small and updated
by every push, so instead of coding them each PS copies them to its first holder every
``DENSE_REPLICA_S`` (the paper recovers them from a worker; a replica up to that old is a state
asynchronous training could have reached).
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from airflow_rover.core.ecrm import (
    DifferencePropagator,
    Fields,
    ParityDelta,
    ParityPlacement,
    ParityStore,
    RebuildPlan,
    RowStatus,
    SumCodec,
    UpdateBuffer,
    plan_encode,
    restrict,
    rows_to_rebuild,
)
from airflow_rover.core.ecrm.degraded import (
    apply_updates,
    decode_degraded,
    degraded_requests,
    state_of,
)
from airflow_rover.core.ecrm.messages import (
    decode_frame,
    encode_frame,
    ints,
    read_ints,
    read_text,
    text,
)
from airflow_rover.core.ledger import NO_KEY
from airflow_rover.ps.partition import Partition
from airflow_rover.ps.tables import EmbeddingTable
from airflow_rover.rpc import frames, ps_service

log = logging.getLogger(__name__)

DENSE_REPLICA_S = 1.0
MAX_FRAME_ENTRIES = 256  # messages per parity RPC: a backlog goes in several
LINGER_S = 0.1  # how long a channel lets messages gather: one RPC per frame, not per push
RETRY_S = 0.2
DRAIN_POLL_S = 0.002
# How long a holder keeps applied messages it may have to take out again (``_rollback``), and
# at most how many per source: enough for what one channel can lag another (a linger, a send
# and a retry); a rollback that finds too little fails the rebuild, and the try resumes from
# the last checkpoint.
RECENT_S = 2.0
RECENT_MESSAGES = 1024


class Peers:
    """gRPC channels to the other PS of the job, by index (addresses change on replacement)."""

    def __init__(self, addresses: list[str], token: str) -> None:
        self.addresses = list(addresses)
        self._token = token
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def call(self, index: int, arrays: dict[str, np.ndarray], timeout: float = 60) -> Fields:
        address = self.addresses[index]
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = grpc.insecure_channel(address, options=ps_service.CHANNEL_OPTIONS)
                self._channels[address] = channel
        stub = channel.unary_unary(ps_service.method_path("Ecrm"))
        reply = stub(
            frames.encode(arrays), metadata=ps_service.auth_metadata(self._token), timeout=timeout
        )
        return frames.decode(reply)

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()


@dataclass
class _Entry:
    holder_epoch: int
    delta: ParityDelta | None
    key: int | None


class _Channel:
    """The ordered channel from this PS to one parity holder: a thread sends whatever is queued
    in one RPC and drops it only once the holder took it; a failed send is retried (the
    holder's replacement re-points the channel, and messages to the dead one are dropped)."""

    def __init__(self, peer: EcrmPeer, holder: int, holder_epoch: int) -> None:
        self.peer = peer
        self.holder = holder
        self.holder_epoch = holder_epoch
        self._queue: list[_Entry] = []
        self._dense: Fields | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._urgent = False  # a rebuild waits for what is queued: send it without lingering
        self._thread = threading.Thread(
            target=self._run, name=f"parity-to-ps-{holder}", daemon=True
        )
        self._thread.start()

    def put(self, delta: ParityDelta | None, key: int | None) -> None:
        with self._cond:
            self._queue.append(_Entry(self.holder_epoch, delta, key))
            # Wake the sender only when it waits for work or a frame is full: while it lingers
            # or sends it sees the queue anyway, and a wake-up per push costs the pushing
            # thread a GIL hand-off (py-spy: a quarter of a PS's push time under ECRM).
            if len(self._queue) == 1 or len(self._queue) >= MAX_FRAME_ENTRIES:
                self._cond.notify()

    def put_dense(self, dense: Fields) -> None:
        with self._cond:
            self._dense = dense
            self._cond.notify()

    def retarget(self, holder_epoch: int) -> None:
        """The holder was replaced: what was queued for the dead one is dropped."""
        with self._cond:
            self.holder_epoch = holder_epoch
            self._queue = [e for e in self._queue if e.holder_epoch >= holder_epoch]
            self._cond.notify()

    def flush(self) -> None:
        """Send what is queued now (a rebuild is draining it)."""
        with self._cond:
            self._urgent = True
            self._cond.notify()

    def backlog(self) -> int:
        with self._cond:
            return len(self._queue)

    def in_flight(self) -> list[ParityDelta]:
        """Messages to the live holder not acknowledged yet (it may have applied some)."""
        with self._cond:
            return [
                e.delta
                for e in self._queue
                if e.delta is not None and e.holder_epoch == self.holder_epoch
            ]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and self._dense is None and not self._closed:
                    self._cond.wait()
                # Let a few pushes' messages gather: one RPC per frame, not per push.
                self._cond.wait_for(
                    lambda: self._closed or self._urgent or len(self._queue) >= MAX_FRAME_ENTRIES,
                    LINGER_S,
                )
                self._urgent = False
                if self._closed:
                    return
                entries = self._queue[:MAX_FRAME_ENTRIES]
                dense = self._dense
                self._dense = None
                epoch = self.holder_epoch
            entries = [e for e in entries if e.holder_epoch == epoch]
            frame = encode_frame(
                self.peer.index, self.peer.epoch, [(e.delta, e.key) for e in entries], dense
            )
            frame["holder_epoch"] = np.array([epoch], dtype=np.int64)
            try:
                self.peer.peers.call(self.holder, frame)
            except grpc.RpcError as exc:
                with self._cond:
                    if dense is not None and self._dense is None:
                        self._dense = dense
                    if self._closed:
                        return
                log.debug("parity to PS %d not delivered (%s); retrying", self.holder, exc.code())
                time.sleep(RETRY_S)
                continue
            with self._cond:
                sent = {id(e) for e in entries}
                self._queue = [e for e in self._queue if id(e) not in sent]


# ----------------------------------------------------------------------------- rebuild


@dataclass
class _Rebuild:
    """A replacement PS rebuilding its rows (and the parity it holds) from the others."""

    plan: RebuildPlan
    started: float
    rows_done_at: float | None = None
    done_at: float | None = None
    chunks: int = 0
    held_rows: int = 0  # updates held back by locks, applied on release
    degraded_rows: int = 0  # rows served by decoding before they were rebuilt
    error: str | None = None

    @property
    def active(self) -> bool:
        return self.done_at is None


class EcrmPeer:
    """The ECRM side of one PS: its parity store, propagator, update buffer and channels."""

    def __init__(
        self,
        ps: Partition,
        k: int,
        rows_per_lock: int,
        addresses: list[str],
        epochs: list[int],
        token: str,
    ) -> None:
        self.ps = ps
        self.index = ps.index
        self.k = k
        self.rows_per_lock = rows_per_lock
        self.epochs = list(epochs)
        self.epoch = self.epochs[self.index]
        vocab = {name: t.vocab_size for name, t in ps.tables.items()}
        self.layout = ParityPlacement(ps.num_ps, k, vocab)
        self.codec = SumCodec()
        self.store = ParityStore(self.layout, self.index, self.codec, self._initial, self.epoch)
        self.propagator = DifferencePropagator(self.layout, self.index, self.codec, self.epoch)
        for h in self.layout.holders_of(self.index):  # its messages carry each holder's epoch:
            self.propagator.reset_holder(h, self.epochs[h])  # a holder drops older ones
        self.buffer = UpdateBuffer()
        self.peers = Peers(addresses, token)
        self._parity_lock = threading.Lock()
        self._src_epoch = {s: self.epochs[s] for s in self.layout.sources_of(self.index)}
        self.keys_from: dict[int, set[int]] = {s: set() for s in self._src_epoch}
        # the latest messages applied per source, with their batch keys: a batch only some
        # holders had when its source died is taken out again (``_rollback``)
        self.recent: dict[int, collections.deque[tuple[float, int, ParityDelta]]] = {}
        self.replica: dict[int, Fields] = {}  # sources' dense variables (first holder only)
        self.channels = {
            h: _Channel(self, h, self.epochs[h]) for h in self.layout.holders_of(self.index)
        }
        self.rebuild: _Rebuild | None = None
        # RPCs to several PS at once (a rebuild's steps, a degraded read's member and parity
        # reads): one round trip instead of one per PS
        self._pool = ThreadPoolExecutor(4 * ps.num_ps, thread_name_prefix="ecrm-fan")
        self._closed = threading.Event()
        self._replicator = threading.Thread(target=self._replicate, daemon=True)
        self._replicator.start()

    # -- normal operation

    def _initial(self, table: str, ids: np.ndarray) -> Fields:
        return self.ps.tables[table].initial_fields(np.asarray(ids, dtype=np.int64))

    def apply_push(
        self, sparse: list[tuple[EmbeddingTable, np.ndarray, np.ndarray]], key: int
    ) -> None:
        """Apply a push's rows (under the PS's apply lock) and queue their differences: rows
        locked by a rebuild wait in the buffer. Every holder gets the batch key."""
        updates = {}
        for table, ids, grads in sparse:
            now, payload = self.buffer.admit(table.name, ids, {"grad": grads})
            if now.size:
                updates[table.name] = self._apply(table, now, payload["grad"])
        self._send(updates, key)

    def _apply(self, table: EmbeddingTable, ids: np.ndarray, grads: np.ndarray) -> Any:
        return ids, *table.apply_with_fields(ids, grads)

    def _send(self, updates: Mapping[str, Any], key: int | None) -> None:
        by_holder = {d.holder: d for d in self.propagator.deltas(updates)}
        for holder, channel in self.channels.items():
            delta = by_holder.get(holder)
            if delta is not None or key is not None:
                channel.put(delta, key)

    def send_ledger(self) -> None:
        """Tell every holder the batches this PS has applied so far (after setup)."""
        with self.ps.applying():
            for key in sorted(self.ps.ledger.applied):
                for channel in self.channels.values():
                    channel.put(None, key)

    def _replicate(self) -> None:
        first = self.layout.holders_of(self.index)[0]
        version = -1
        while not self._closed.wait(DENSE_REPLICA_S):
            if self.ps.dense.version != version and self.ps.dense.values:
                version = self.ps.dense.version
                self.channels[first].put_dense(self.ps.dense.snapshot())

    @property
    def pending_rebuild(self) -> bool:
        """Whether this PS is a replacement still rebuilding (its state is incomplete)."""
        return self.rebuild is not None and self.rebuild.active

    # -- pulls (a replacement serves rows not rebuilt yet by decoding them)

    def pending(self, table: str, ids: np.ndarray) -> np.ndarray | None:
        """Mask of ``ids`` this replacement has not rebuilt yet; None if there are none."""
        rebuild = self.rebuild
        if rebuild is None or rebuild.plan.done:
            return None
        mask = rebuild.plan.status(table, ids) != RowStatus.DONE
        return mask if mask.any() else None

    def degraded_reads(self, ids_by_table: Mapping[str, np.ndarray]) -> dict[str, Fields]:
        """Lost rows not rebuilt yet, of every table a pull touches: their parity minus the
        group's other members, with the updates held for them applied (ECRM section 3.4).
        One round trip whatever the number of tables: every member PS and every holder is read
        once (all tables), all at once.

        A member answers with its rows and the part for them of its messages to the holders
        not acknowledged yet; a holder with its parity and how many messages of each source it
        had applied. The parity is brought up to the members' reads with the messages it
        lacked (``catch_up``), so a difference in flight costs no wait. Without locks a member
        updated after its read, whose message reached the holder before the parity was read,
        still makes the row off by that one update: the read is the input of one step, as
        stale as asynchronous training allows, and its optimizer state is put back in range;
        what the rebuild writes is exact (it locks)."""
        plans, requests = degraded_requests(self.layout, self.index, ids_by_table)
        got: dict[tuple[str, int], Fields] = self._fan(
            {key: functools.partial(self.peers.call, key[1], r) for key, r in requests.items()}
        )
        decoded = decode_degraded(self.layout, self.codec, plans, got, self._dtypes)
        out = {}
        for t, fields in decoded.items():
            self.ps.tables[t].optimizer.clamp_state(state_of(fields))
            with self.ps.applying():
                held = [(got, p["grad"]) for got, p in self.buffer.peek(t)]
            out[t] = apply_updates(self.ps.tables[t].optimizer, plans[t].ids, fields, held)
        if self.rebuild is not None:
            self.rebuild.degraded_rows += sum(plan.ids.size for plan in plans.values())
        return out

    def _fields(self, ps: int, table: str, ids: np.ndarray) -> Fields:
        if ps == self.index:
            return self.ps.tables[table].fields(ids)
        return self.peers.call(ps, {"op": text("fields"), "table": text(table), "ids": ids})

    def _dtypes(self, table: str) -> dict[str, np.dtype]:
        return self.store.spec(table)[0]

    # -- the RPC

    def handle(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        op = read_text(req["op"])
        table = read_text(req["table"]) if "table" in req else ""
        if op == "parity":
            return self._receive(req)
        if op == "fields":
            if "degraded" in req:  # a degraded read's member: "ids/<table>" of several
                return self._member_read(req)
            return self.ps.tables[table].fields(req["ids"].astype(np.int64))
        if op == "parity_read":  # "slots" of one table (a rebuild's chunk), or "slots/<table>"
            # of several (a degraded read: with how far each source's messages are applied)
            wanted = (
                {table: req["slots"]}
                if table
                else {k[6:]: v for k, v in req.items() if k.startswith("slots/")}
            )
            out = {}
            with self._parity_lock:  # the initial values' code is computed after it
                stored = {t: self.store.read_stored(t, slots) for t, slots in wanted.items()}
                if not table:
                    out.update({f"applied/{k}": v for k, v in ints(self.store.applied()).items()})
                    epochs = ints(self.store.source_epochs())
                    out.update({f"epochs/{k}": v for k, v in epochs.items()})
            for t, (got, initial) in stored.items():
                self.store.fill_initial(t, wanted[t], got, initial)
                out.update(got if table else {f"{t}/{n}": v for n, v in got.items()})
            return out
        if op == "applied":
            with self._parity_lock:
                return ints(self.store.applied())
        if op == "lock":
            with self.ps.applying():
                self.buffer.lock(table, req["ids"])
                sent = ints(self.propagator.sent())
            self._flush_channels()
            return sent
        if op == "unlock":  # with the send counters after the held updates went out
            with self.ps.applying():
                held = self._release(table, req["ids"])
                sent = ints(self.propagator.sent())
            self._flush_channels()
            return {"held": np.array([held], dtype=np.int64), **sent}
        if op == "fence":
            return self._fence(int(req["source"][0]), int(req["epoch"][0]))
        if op == "rollback":
            return self._rollback(int(req["source"][0]), {int(k) for k in req["keys"]})
        if op == "reset_holder":
            holder, epoch = int(req["holder"][0]), int(req["epoch"][0])
            self.peers.addresses[holder] = read_text(req["address"])
            with self.ps.applying():
                self.propagator.reset_holder(holder, epoch)
                self.epochs[holder] = epoch
                self.channels[holder].retarget(epoch)
                for key in sorted(self.ps.ledger.applied):  # the new holder knows them too
                    self.channels[holder].put(None, key)
            return self._created()  # read after the reset: a row created later is sent there
        if op == "created":
            return self._created()
        if op == "encode":
            return self._encode_all()
        if op == "status":
            return self.status()
        raise ValueError(f"ecrm op {op!r}: unknown")

    def _flush_channels(self) -> None:
        for channel in self.channels.values():
            channel.flush()

    def _member_read(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A degraded read's member: the rows asked for (``ids/<table>``, sorted unique), and
        the part for those rows of every message to a holder not acknowledged yet
        (``flight/<holder>/<seq>/<table>/...``), read atomically under the apply lock."""
        wanted = {k[4:]: v.astype(np.int64) for k, v in req.items() if k.startswith("ids/")}
        out = {"epoch": np.array([self.epoch], dtype=np.int64)}
        with self.ps.applying():
            for t, ids in wanted.items():
                out.update({f"{t}/{n}": v for n, v in self.ps.tables[t].fields(ids).items()})
            flying = {h: channel.in_flight() for h, channel in self.channels.items()}
        for h, deltas in flying.items():
            for delta in deltas:
                for part in restrict(delta, wanted):
                    head = f"flight/{h}/{delta.seq}/{part.table}"
                    out[f"{head}/ids"] = part.ids
                    out.update({f"{head}/f/{n}": v for n, v in part.fields.items()})
        return out

    def _receive(self, frame: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        source, epoch = (int(x) for x in frame["source"])
        if int(frame["holder_epoch"][0]) != self.epoch:
            return {"fenced": np.ones(1, dtype=np.uint8)}
        with self._parity_lock:
            if epoch < self._src_epoch.get(source, 0):
                return {"fenced": np.ones(1, dtype=np.uint8)}
            if epoch > self._src_epoch[source]:  # a new incarnation speaks first
                self._src_epoch[source] = epoch
            recent = self.recent.setdefault(source, collections.deque(maxlen=RECENT_MESSAGES))
            now = time.monotonic()
            for delta, key in zip(decode_frame(frame), frame["delta_keys"], strict=True):
                if self.store.apply(delta) == "applied" and key != NO_KEY:
                    recent.append((now, int(key), delta))
            while recent and recent[0][0] < now - RECENT_S:
                recent.popleft()
            self.keys_from[source].update(int(k) for k in frame["batch_keys"])
            dense = {k[8:]: v for k, v in frame.items() if k.startswith("replica/")}
            if dense:
                self.replica[source] = dense
        return {}

    def _fence(self, source: int, epoch: int) -> dict[str, np.ndarray]:
        """The dead incarnation of ``source`` is fenced: hand back what this holder knows of
        it (the batches it applied, the replica of its dense variables) and materialised
        parity slots, from which its replacement is rebuilt."""
        with self._parity_lock:
            self.store.fence(source, epoch)
            self._src_epoch[source] = max(self._src_epoch[source], epoch)
            # Every batch this holder knows the partition applied, whichever incarnation sent
            # it: a replacement sends its ledger again, and if it is lost before this holder
            # heard all of it, forgetting here would make old batches look missing here and
            # present at the other holders, with nothing left to take out (``_rollback``).
            keys = self.keys_from.get(source, set())
            out = {"batch_keys": np.array(sorted(keys), dtype=np.int64)}
            out.update({f"replica/{k}": v for k, v in self.replica.pop(source, {}).items()})
            for t in self.layout.tables:
                out[f"materialised/{t}"] = self.store.materialised(t)
        return out

    def _rollback(self, source: int, keys: set[int]) -> dict[str, np.ndarray]:
        """Take out the messages of batches ``keys`` of (fenced) ``source``: the other holders
        never got them, so the batches are trained again (by its replacement, with the same
        keys: only the fenced incarnation's messages are taken out). Keys not found are
        returned."""
        with self._parity_lock:
            found = set()
            live = self._src_epoch[source]
            recent = self.recent.get(source, collections.deque())
            for _, key, delta in recent:
                if key in keys and delta.epoch < live:
                    self.store.revert(delta)
                    found.add(key)
            self.recent[source] = collections.deque(
                (e for e in recent if e[2].epoch >= live), maxlen=RECENT_MESSAGES
            )
            self.keys_from[source] -= found  # to be trained again
        return {"missing": np.array(sorted(keys - found), dtype=np.int64)}

    def _release(self, table: str, ids: np.ndarray) -> int:
        """Unlock rows (caller holds the apply lock) and apply their held updates in order."""
        held = 0
        t = self.ps.tables[table]
        for got, payload in self.buffer.release(table, ids):
            held += got.size
            self._send({table: self._apply(t, got, payload["grad"])}, None)
        return held

    def _encode_all(self) -> dict[str, np.ndarray]:
        """Re-encode this holder's parity from its sources' rows (after a restore, before
        training: nothing changes meanwhile)."""
        slots_done = 0
        for t, slots in self._slots_with_rows().items():
            if slots.size == 0:
                continue
            plan = plan_encode(self.layout, t, self.index, slots)
            members = {q: self._fields(q, t, ids) for q, ids in plan.member_ids.items()}
            fields = plan.encode(self.codec, members, self._dtypes(t))
            with self._parity_lock:
                self.store.write(t, slots, fields)
            slots_done += slots.size
        return {"slots": np.array([slots_done], dtype=np.int64)}

    def _created(self) -> dict[str, np.ndarray]:
        """Every table's ids this PS has rows for (``ids/<table>``)."""
        return {f"ids/{name}": t.created_ids() for name, t in self.ps.tables.items()}

    def _slots_with_rows(
        self, replies: Mapping[int, Mapping[str, np.ndarray]] | None = None
    ) -> dict[str, np.ndarray]:
        """Per table, this holder's parity slots with a member some source has created; the
        others are the code of initial values, which the store computes by itself. ``replies``:
        each source's ``_created`` (asked for here if not given: one call per source for every
        table)."""
        if replies is None:
            request = {"op": text("created")}
            sources = self.layout.sources_of(self.index)
            replies = self._fan(
                {s: functools.partial(self.peers.call, s, request) for s in sources}
            )
        out = {}
        for t in self.layout.tables:
            created = [reply[f"ids/{t}"] for reply in replies.values()]
            ids = np.concatenate(created) if created else np.empty(0, np.int64)
            where, slots = self.layout.parity_location(t, ids.astype(np.int64))
            has = np.zeros(self.layout.num_slots(t, self.index), dtype=bool)
            has[slots[where == self.index]] = True  # a mask, not np.unique: no sort
            out[t] = np.flatnonzero(has)
        return out

    # -- rebuilding a lost PS (on its replacement)

    def start_rebuild(self) -> dict[str, np.ndarray]:
        """This PS replaces a lost one (started empty): adopt what the holders knew of it, take
        over its sources' channels, and rebuild its rows and parity in the background."""
        started = time.perf_counter()
        holders = self.layout.holders_of(self.index)
        seen: dict[int, set[int]] = {}
        dense: Fields = {}
        materialised: dict[int, dict[str, np.ndarray]] = {}
        fence = {
            "op": text("fence"),
            "source": np.array([self.index], dtype=np.int64),
            "epoch": np.array([self.epoch], dtype=np.int64),
        }
        reset = {
            "op": text("reset_holder"),
            "holder": np.array([self.index], dtype=np.int64),
            "epoch": np.array([self.epoch], dtype=np.int64),
            "address": text(self.peers.addresses[self.index]),
        }
        # One round trip: the holders fence the dead incarnation while the sources re-point
        # their channels here and say which rows they have (read after the re-pointing).
        sources = self.layout.sources_of(self.index)
        replies = self._fan(
            {("fence", h): functools.partial(self.peers.call, h, fence) for h in holders}
            | {("reset", s): functools.partial(self.peers.call, s, reset) for s in sources}
        )
        for h in holders:  # in holder order: the first one's dense replica
            reply = replies["fence", h]
            seen[h] = {int(k) for k in reply["batch_keys"]}
            dense = dense or {k[8:]: v for k, v in reply.items() if k.startswith("replica/")}
            materialised[h] = {t: reply[f"materialised/{t}"] for t in self.layout.tables}
        try:
            keys = self._agree(seen)
        except RuntimeError as exc:  # reported by status(); the master gives up on the PS
            log.error("PS %d: %s", self.index, exc)
            nothing = {t: np.empty(0, np.int64) for t in self.layout.tables}
            plan = RebuildPlan(self.layout, self.index, self.rows_per_lock, nothing, nothing)
            self.rebuild = _Rebuild(plan, started, done_at=time.perf_counter(), error=str(exc))
            return self.status()
        plan = RebuildPlan(
            self.layout,
            self.index,
            self.rows_per_lock,
            data_ids=rows_to_rebuild(self.layout, self.index, materialised),
            parity_slots=self._slots_with_rows({s: replies["reset", s] for s in sources}),
        )
        with self.ps.applying():
            self.ps.ledger.applied.update(keys)
            if dense:
                self.ps.dense.restore(dense)
            for t in self.layout.tables:
                self.buffer.lock(t, plan.data_ids(t))
            with self._parity_lock:
                for t in self.layout.tables:
                    self.store.mark_stale(t, plan.parity_slots(t))
            rebuild = _Rebuild(plan, started)
            self.rebuild = rebuild
        self.send_ledger()  # so a later loss of this PS finds its holders knowing it
        threading.Thread(target=self._run_rebuild, args=(rebuild,), daemon=True).start()
        log.info(
            "PS %d (incarnation %d): rebuilding %d rows and %d parity slots from %d holders "
            "(%d batches applied, dense replica: %s; set up in %.0f ms)",
            self.index,
            self.epoch,
            sum(plan.data_ids(t).size for t in self.layout.tables),
            sum(plan.parity_slots(t).size for t in self.layout.tables),
            len(holders),
            len(keys),
            "yes" if dense else "none",
            1000 * (time.perf_counter() - started),
        )
        return self.status()

    def _agree(self, seen: dict[int, set[int]]) -> set[int]:
        """The batches this PS had applied as far as every holder knows: the dead incarnation
        sent each batch to its holders on separate channels, so at its death some holders may
        have had the last few and others not. Those are taken out where they were applied and
        left out of the ledger (the master has them trained again): every parity then reflects
        the same batches, and no row is rebuilt with an update the others lack."""
        agreed = set.intersection(*seen.values()) if seen else set()
        for h, keys in seen.items():
            extra = keys - agreed
            if not extra:
                continue
            request = {
                "op": text("rollback"),
                "source": np.array([self.index], dtype=np.int64),
                "keys": np.array(sorted(extra), dtype=np.int64),
            }
            missing = self.peers.call(h, request)["missing"]
            if missing.size:
                raise RuntimeError(
                    f"PS {h} no longer holds the differences of batches {missing[:5].tolist()} "
                    f"of PS {self.index}, which its other holders never got: the parity cannot "
                    "be made to agree (a retry resumes from the last checkpoint)"
                )
            log.info(
                "PS %d: %d batch(es) only PS %d had received taken out of its parity, to be "
                "trained again",
                self.index,
                len(extra),
                h,
            )
        return agreed

    def _run_rebuild(self, rebuild: _Rebuild) -> None:
        try:
            self._rebuild(rebuild)
        except Exception as exc:  # reported by status(); the master gives up on the PS
            log.exception("PS %d: rebuild failed", self.index)
            rebuild.error = f"{type(exc).__name__}: {exc}"
        finally:
            rebuild.done_at = time.perf_counter()
            if rebuild.rows_done_at is None:
                rebuild.rows_done_at = rebuild.done_at

    def _rebuild(self, rebuild: _Rebuild) -> None:
        """Chunk by chunk; the calls of a step go to the other PS at once (one round trip, not
        one per PS: a chunk costs about five round trips, whatever k is)."""
        plan = rebuild.plan

        def on(q: int, op: str, **arrays: np.ndarray) -> Callable[[], Fields]:
            request = {"op": text(op), "table": text(t), **arrays}
            return lambda: self.peers.call(q, request)

        released: dict[int, dict[int, int]] = {}  # each PS's send counters after its unlock
        while (chunk := plan.next_chunk()) is not None:
            t = chunk.table
            others = [q for q in chunk.lock_ps if q != self.index]
            if self.index in chunk.locks:
                with self.ps.applying():
                    self.buffer.lock(t, chunk.locks[self.index])
            locked = self._fan({q: on(q, "lock", ids=chunk.locks[q]) for q in others})
            sent = {q: read_ints(reply) for q, reply in locked.items()}
            if self.index in chunk.locks:
                sent[self.index] = {}  # what this replacement sent is not drained
            plan.locks_installed(sent)
            while not plan.drained(
                self._fan({h: functools.partial(self._applied, h) for h in chunk.holders})
            ):
                time.sleep(DRAIN_POLL_S)
            reads = {
                q: functools.partial(self._fields, q, t, ids) for q, ids in chunk.member_ids.items()
            }
            if chunk.kind == "decode":
                parity_at = {h: slots for h, (_, slots) in chunk.parity.items()}
                got = self._fan(
                    {("parity", h): on(h, "parity_read", slots=s) for h, s in parity_at.items()}
                    | {("member", q): read for q, read in reads.items()}
                )
                parity = {h: got["parity", h] for h in parity_at}
                members = {q: got["member", q] for q in reads}
                fields = chunk.decode(self.codec, parity, members, self._dtypes(t))
                with self.ps.applying():
                    self.ps.tables[t].put_fields(chunk.ids, fields)
                    plan.chunk_written()
                    rebuild.held_rows += self._release(t, chunk.locks[self.index])
                    released[self.index] = self.propagator.sent()
                self._flush_channels()
                rebuild.rows_done_at = time.perf_counter()
            else:
                fields = chunk.encode(self.codec, self._fan(reads), self._dtypes(t))
                with self._parity_lock:
                    self.store.write(t, chunk.slots, fields)
                plan.chunk_written()
            unlocked = self._fan({q: on(q, "unlock", ids=chunk.locks[q]) for q in others})
            rebuild.held_rows += sum(int(reply["held"][0]) for reply in unlocked.values())
            released.update({q: read_ints(reply) for q, reply in unlocked.items()})
            rebuild.chunks += 1
        self._wait_delivered(released)

    def _wait_delivered(self, sent: Mapping[int, Mapping[int, int]]) -> None:
        """Until every holder has applied what each PS had sent when it released its held
        updates. Those went out without a batch key of their own: were one PS lost later with
        them at one of its holders only, the holders would agree on its batches and the rows
        of the other holder's groups would be rebuilt without them. So a rebuild is done only
        once they are everywhere (and a loss during a rebuild fails the try)."""
        marks = {
            (q, h): n
            for q, counts in sent.items()
            for h, n in counts.items()
            if h in self.layout.holders_of(q)
        }
        holders = sorted({h for _, h in marks})
        while True:
            applied = self._fan({h: functools.partial(self._applied, h) for h in holders})
            if all(applied[h].get(q, 0) >= n for (q, h), n in marks.items()):
                return
            time.sleep(DRAIN_POLL_S)

    def _applied(self, holder: int) -> dict[int, int]:
        if holder == self.index:
            with self._parity_lock:
                return self.store.applied()
        return read_ints(self.peers.call(holder, {"op": text("applied")}))

    def status(self) -> dict[str, np.ndarray]:
        """How a rebuild stands (``rebuilding`` 0 when none runs or it ended)."""
        r = self.rebuild
        now = time.perf_counter()
        out = {
            "rebuilding": np.array([int(r is not None and r.active)], dtype=np.int64),
            "backlog": np.array([sum(c.backlog() for c in self.channels.values())], np.int64),
        }
        if r is not None:
            plan = r.plan
            out["rows_total"] = np.array([plan.rows_total], dtype=np.int64)
            out["rows_done"] = np.array([plan.rows_done], dtype=np.int64)
            out["chunks"] = np.array([r.chunks], dtype=np.int64)
            out["held_rows"] = np.array([r.held_rows], dtype=np.int64)
            out["degraded_rows"] = np.array([r.degraded_rows], dtype=np.int64)
            out["seconds"] = np.array([(r.done_at or now) - r.started], dtype=np.float64)
            out["rows_seconds"] = np.array([(r.rows_done_at or now) - r.started], dtype=np.float64)
            if r.done_at is not None:  # on the wall clock: when this PS was whole again
                out["done_unix"] = np.array([time.time() - (now - r.done_at)], dtype=np.float64)
            if r.error:
                out["error"] = text(r.error)
        return out

    def _fan(self, calls: Mapping[Any, Callable[[], Any]]) -> dict[Any, Any]:
        """Run ``calls`` at once; their results by key."""
        futures = {key: self._pool.submit(call) for key, call in calls.items()}
        return {key: future.result() for key, future in futures.items()}

    def close(self) -> None:
        self._closed.set()
        for channel in self.channels.values():
            channel.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.peers.close()
