"""The ECRM side of one PS process: it propagates each applied push's differences to the
parity holders, holds the parity of its sources (``ParityHolder``), serves the ``Ecrm`` RPC's
operations, and decodes the rows a replacement has not rebuilt yet (``Replacement``)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from airflow_rover.core.ecrm import (
    DifferencePropagator,
    Fields,
    ParityPlacement,
    RebuildPlan,
    RowStatus,
    SumCodec,
    UpdateBuffer,
    plan_encode,
    restrict,
)
from airflow_rover.core.ecrm.degraded import (
    apply_updates,
    decode_degraded,
    degraded_requests,
    state_of,
)
from airflow_rover.core.ecrm.messages import ints, read_text, text
from airflow_rover.core.job_tls import JobTLS
from airflow_rover.ps.ecrm.channels import ParityChannel, Peers
from airflow_rover.ps.ecrm.holder import ParityHolder
from airflow_rover.ps.ecrm.positional import PositionalRows
from airflow_rover.ps.partition import Partition
from airflow_rover.ps.tables import EmbeddingTable
from airflow_rover.rpc import frames

DENSE_REPLICA_S = 1.0
# How long a request to a replacement waits for its positional tables to be rebuilt: a
# rebuild decodes about a million rows a second (docs/checkpoint-policies.md).
POSITIONAL_WAIT_S = 600.0

Request = dict[str, np.ndarray]
Op = Callable[[Request], Request]


@dataclass
class RebuildProgress:
    """A replacement PS rebuilding its rows (and the parity it holds) from the others."""

    plan: RebuildPlan
    started: float
    rows_done_at: float | None = None
    done_at: float | None = None
    chunks: int = 0
    held_rows: int = 0  # updates held back by locks, applied on release
    degraded_rows: int = 0  # rows served by decoding before they were rebuilt
    error: str | None = None
    positional_failed: bool = False  # failed before its positional tables were rebuilt

    @property
    def active(self) -> bool:
        return self.done_at is None


def _table(req: Request) -> str:
    return read_text(req["table"]) if "table" in req else ""


class EcrmPeer:
    """The ECRM side of one PS: its propagator, update buffer, channels and parity holder."""

    def __init__(
        self,
        ps: Partition,
        k: int,
        rows_per_lock: int,
        addresses: list[str],
        epochs: list[int],
        token: str,
        tls: JobTLS | None = None,
    ) -> None:
        self.ps = ps
        self.index = ps.index
        self.k = k
        self.rows_per_lock = rows_per_lock
        self.epochs = list(epochs)
        self.epoch = self.epochs[self.index]
        vocab = {name: t.vocab_size for name, t in ps.tables.items()}
        raw = [name for name, t in ps.tables.items() if t.index_kind == "ids"]
        self.placement = ParityPlacement(ps.num_ps, k, vocab, positional=raw)
        self.positional = {
            name: PositionalRows(ps.tables[name], self.placement, self.index) for name in raw
        }
        self.codec = SumCodec()
        self.holder = ParityHolder(
            self.placement, self.index, self.codec, self._initial, self.epochs
        )
        self.propagator = DifferencePropagator(self.placement, self.index, self.codec, self.epoch)
        for h in self.placement.holders_of(self.index):  # its messages carry each holder's
            self.propagator.reset_holder(h, self.epochs[h])  # epoch: a holder drops older ones
        self.buffer = UpdateBuffer()
        self.peers = Peers(addresses, token, tls)
        self.channels = {
            h: ParityChannel(self.peers, self.index, self.epoch, h, self.epochs[h])
            for h in self.placement.holders_of(self.index)
        }
        self.rebuild: RebuildProgress | None = None
        self.positional_ready = threading.Event()  # a replacement clears it until rebuilt
        self.positional_ready.set()
        # RPCs to several PS at once (a rebuild's steps, a degraded read's member and parity
        # reads): one round trip instead of one per PS
        self._pool = ThreadPoolExecutor(4 * ps.num_ps, thread_name_prefix="ecrm-fan")
        self._ops = self._operations()
        self._closed = threading.Event()
        self._replicator = threading.Thread(target=self._replicate, daemon=True)
        self._replicator.start()

    # -- normal operation

    def _initial(self, table: str, ids: np.ndarray) -> Fields:
        rows = self.positional.get(table)
        if rows is not None:  # a position's code starts at zero
            return rows.blank(np.asarray(ids).size)
        return self.ps.tables[table].initial_fields(np.asarray(ids, dtype=np.int64))

    def apply_push(
        self, sparse: list[tuple[EmbeddingTable, np.ndarray, np.ndarray]], key: int
    ) -> None:
        """Apply a push's rows (under the PS's apply lock) and queue their differences: rows
        locked by a rebuild wait in the buffer. Every holder gets the batch key. A positional
        table's rows are held and applied by key (their rows created first)."""
        updates = {}
        for table, ids, grads in sparse:
            rows = self.positional.get(table.name)
            keys = ids if rows is None else rows.keys(ids)
            now, payload = self.buffer.admit(table.name, keys, {"grad": grads})
            if now.size:
                updates[table.name] = self._apply(table, now, payload["grad"])
        self._send(updates, key)

    def _apply(self, table: EmbeddingTable, ids: np.ndarray, grads: np.ndarray) -> Any:
        rows = self.positional.get(table.name)
        if rows is not None:
            return rows.apply(ids, grads)
        return ids, *table.apply_with_fields(ids, grads)

    def _read(self, table: str, ids: np.ndarray) -> Fields:
        """The code of rows ``ids`` (keys, for a positional table) as this PS has them."""
        rows = self.positional.get(table)
        if rows is not None:
            return rows.read(ids)
        return self.ps.tables[table].fields(ids)

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
        first = self.placement.holders_of(self.index)[0]
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

    def wait_ready(self, tables: Iterable[str]) -> None:
        """Until a replacement has rebuilt its positional tables, if ``tables`` has one: their
        rows are found by raw id, and which position holds an id is known once its key is
        decoded, so requests for them wait rather than decode rows one by one."""
        if self.positional_ready.is_set() or not any(t in self.positional for t in tables):
            return
        if not self.positional_ready.wait(POSITIONAL_WAIT_S):
            raise TimeoutError(
                f"PS {self.index}: its tables of raw ids were not rebuilt in {POSITIONAL_WAIT_S} s"
            )
        rebuild = self.rebuild
        if rebuild is not None and rebuild.error and rebuild.positional_failed:
            raise RuntimeError(f"PS {self.index}: rebuild failed: {rebuild.error}")

    def pending(self, table: str, ids: np.ndarray) -> np.ndarray | None:
        """Mask of ``ids`` this replacement has not rebuilt yet; None if there are none (a
        positional table's rows are all rebuilt before it takes requests: ``wait_ready``)."""
        rebuild = self.rebuild
        if rebuild is None or rebuild.plan.done or table in self.positional:
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
        plans, requests = degraded_requests(self.placement, self.index, ids_by_table)
        got: dict[tuple[str, int], Fields] = self._fan(
            {key: functools.partial(self.peers.call, key[1], r) for key, r in requests.items()}
        )
        decoded = decode_degraded(self.placement, self.codec, plans, got, self._dtypes)
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
            return self._read(table, ids)
        return self.peers.call(ps, {"op": text("fields"), "table": text(table), "ids": ids})

    def _dtypes(self, table: str) -> dict[str, np.dtype]:
        return self.holder.store.spec(table)[0]

    # -- the RPC

    def handle(self, req: Request) -> Request:
        """One ``Ecrm`` call: its ``op`` picks the operation."""
        op = read_text(req["op"])
        run = self._ops.get(op)
        if run is None:
            raise ValueError(f"ecrm op {op!r}: unknown")
        return run(req)

    def _operations(self) -> dict[str, Op]:
        holder = self.holder
        return {
            "parity": holder.receive,
            "fields": self._on_fields,
            "parity_read": holder.read,
            "applied": lambda req: ints(holder.applied()),
            "lock": self._on_lock,
            "unlock": self._on_unlock,
            "fence": self._on_fence,
            "rollback": self._on_rollback,
            "reset_holder": self._on_reset_holder,
            "created": lambda req: self._created(),
            "encode": lambda req: self._encode_all(),
            "status": lambda req: self.status(),
        }

    def _on_fields(self, req: Request) -> Request:
        if "degraded" in req:  # a degraded read's member: "ids/<table>" of several
            return self._member_read(req)
        return self._read(_table(req), req["ids"].astype(np.int64))

    def _on_lock(self, req: Request) -> Request:
        """Hold the updates of rows ``ids`` (a rebuild's chunk); with the send counters read
        under the same lock (the chunk's drain watermarks)."""
        table = _table(req)
        with self.ps.applying():
            self.buffer.lock(table, req["ids"])
            sent = ints(self.propagator.sent())
        self._flush_channels()
        return sent

    def _on_unlock(self, req: Request) -> Request:
        """Release rows ``ids``: their held updates are applied; with the send counters after
        the held updates went out."""
        table = _table(req)
        with self.ps.applying():
            held = self._release(table, req["ids"])
            sent = ints(self.propagator.sent())
        self._flush_channels()
        return {"held": np.array([held], dtype=np.int64), **sent}

    def _on_fence(self, req: Request) -> Request:
        return self.holder.fence(int(frames.one(req, "source")), int(frames.one(req, "epoch")))

    def _on_rollback(self, req: Request) -> Request:
        return self.holder.rollback(int(frames.one(req, "source")), {int(k) for k in req["keys"]})

    def _on_reset_holder(self, req: Request) -> Request:
        """A holder of this PS was replaced: its channel goes to the replacement, which is told
        this PS's ledger first; with the rows this PS has (read after the reset: a row created
        later is sent there)."""
        holder, epoch = int(frames.one(req, "holder")), int(frames.one(req, "epoch"))
        self.peers.addresses[holder] = read_text(req["address"])
        with self.ps.applying():
            self.propagator.reset_holder(holder, epoch)
            self.epochs[holder] = epoch
            self.channels[holder].retarget(epoch)
            for key in sorted(self.ps.ledger.applied):  # the new holder knows them too
                self.channels[holder].put(None, key)
        return self._created()

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
                out.update({f"{t}/{n}": v for n, v in self._read(t, ids).items()})
            flying = {h: channel.in_flight() for h, channel in self.channels.items()}
        for h, deltas in flying.items():
            for delta in deltas:
                for part in restrict(delta, wanted):
                    head = f"flight/{h}/{delta.seq}/{part.table}"
                    out[f"{head}/ids"] = part.ids
                    out.update({f"{head}/f/{n}": v for n, v in part.fields.items()})
        return out

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
            plan = plan_encode(self.placement, t, self.index, slots)
            members = {q: self._fields(q, t, ids) for q, ids in plan.member_ids.items()}
            fields = plan.encode(self.codec, members, self._dtypes(t))
            self.holder.write(t, slots, fields)
            slots_done += slots.size
        return {"slots": np.array([slots_done], dtype=np.int64)}

    def _created(self) -> dict[str, np.ndarray]:
        """Every table's ids this PS has rows for (``ids/<table>``; a positional table's keys
        of coded rows)."""
        return {
            f"ids/{name}": rows.coded_keys()
            if (rows := self.positional.get(name))
            else t.created_ids()
            for name, t in self.ps.tables.items()
        }

    def _slots_with_rows(
        self, replies: Mapping[int, Mapping[str, np.ndarray]] | None = None
    ) -> dict[str, np.ndarray]:
        """Per table, this holder's parity slots with a member some source has created; the
        others are the code of initial values, which the store computes by itself. ``replies``:
        each source's ``_created`` (asked for here if not given: one call per source for every
        table)."""
        if replies is None:
            request = {"op": text("created")}
            sources = self.placement.sources_of(self.index)
            replies = self._fan(
                {s: functools.partial(self.peers.call, s, request) for s in sources}
            )
        out = {}
        for t in self.placement.tables:
            created = [reply[f"ids/{t}"] for reply in replies.values()]
            ids = np.concatenate(created) if created else np.empty(0, np.int64)
            where, slots = self.placement.parity_location(t, ids.astype(np.int64))
            mine = slots[where == self.index]
            size = self.placement.num_slots(t, self.index)
            if t in self.placement.positional:  # its slots grow with its rows
                size = int(mine.max()) + 1 if mine.size else 0
            has = np.zeros(size, dtype=bool)
            has[mine] = True  # a mask, not np.unique: no sort
            out[t] = np.flatnonzero(has)
        return out

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
