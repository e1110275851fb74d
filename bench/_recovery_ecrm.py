"""ECRM on the emulated job of ``bench/recovery.py``: parity, degraded reads, chunked rebuild.

Every PS of the ``Cluster`` gets what ``core.ecrm`` describes: a ``ParityStore`` (the parity
it holds, sum codec), a ``DifferencePropagator`` (after each push it applies, the row and
Adagrad-state differences go to the holders) and an ``UpdateBuffer``. Parity messages are
queued under the sending PS's lock and delivered in order after it is released (``flush``),
like an ordered channel.

A lost PS (``fail``): its holders fence the dead incarnation, an empty replacement starts
with a ``RebuildPlan`` of the rows some holder has parity for, every source resets its
channel to it, and a background thread rebuilds it chunk by chunk (lock, drain, read,
decode or re-encode, write, release the held updates) while the trainer goes on: reads of
lost rows not rebuilt yet are decoded (degraded reads), updates to them wait in the
replacement's buffer. What each decode gave is kept and checked against the lost PS's rows
(``verify``).
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from airflow_rover.core.ecrm import (
    DifferencePropagator,
    ParityDelta,
    ParityPlacement,
    ParityStore,
    RebuildPlan,
    RowStatus,
    SumCodec,
    UpdateBuffer,
    plan_decode,
    rows_to_rebuild,
)
from airflow_rover.ps.tables import EmbeddingTable
from bench._recovery_cluster import (
    Cluster,
    Fields,
    PsHooks,
)

DTYPES = {"row": np.dtype(np.float32), "state/accum": np.dtype(np.float32)}


@dataclass
class Rebuild:
    """One lost PS's recovery: when it started and ended, what was decoded, the check."""

    lost: int
    step: int
    started: float
    truth: dict[str, Fields]  # the lost PS's rows ("ids" too) when it was lost
    plan: RebuildPlan
    setup_s: float = 0.0  # the trainer's pause: fence, replacement, plan
    rows_done_at: float = 0.0  # last decode chunk written
    done_at: float = 0.0
    chunks: int = 0
    held: int = 0  # updates held back by locks and applied on release
    decoded: list[tuple[str, np.ndarray, Fields]] = field(default_factory=list)
    error: BaseException | None = None

    @property
    def seconds(self) -> float:
        return self.done_at - self.started

    @property
    def rows_seconds(self) -> float:
        return self.rows_done_at - self.started


@dataclass(frozen=True)
class Verdict:
    """Decoded rows against the lost ones: rows, values bit for bit, largest difference."""

    rows: int
    values: int
    exact: int
    max_err: float
    not_rebuilt_changed: int  # lost rows neither decoded nor at their initial value

    @property
    def ok(self) -> bool:
        return self.not_rebuilt_changed == 0 and self.max_err <= 1e-6


class EcrmHooks(PsHooks):
    """The ECRM side of every PS of ``cluster`` (``k`` rows per parity, ``rows_per_lock``)."""

    def __init__(self, cluster: Cluster, k: int, rows_per_lock: int) -> None:
        self.cluster = cluster
        self.k = k
        self.rows_per_lock = rows_per_lock
        vocab = {g.name: g.vocab_size for g in cluster.layout.groups}
        self.placement = ParityPlacement(cluster.num_ps, k, vocab)
        self.codec = SumCodec()
        self._probe = {name: t for name, t in cluster.ps[0].tables.items()}
        n = cluster.num_ps
        self.epochs = [0] * n
        self.stores = [ParityStore(self.placement, p, self.codec, self._initial) for p in range(n)]
        self.props = [DifferencePropagator(self.placement, p, self.codec) for p in range(n)]
        self.buffers = [UpdateBuffer() for _ in range(n)]
        self.busy_s = [0.0] * n  # parity work per PS (the trainer's steps)
        self.outbox: collections.deque[ParityDelta] = collections.deque()
        self.wire = threading.Lock()
        self.rebuild: Rebuild | None = None
        self.rebuilds: list[Rebuild] = []
        self._thread: threading.Thread | None = None
        self._trainer = threading.get_ident()

    def _initial(self, table: str, ids: np.ndarray) -> Fields:
        return self._probe[table].initial_fields(np.asarray(ids, dtype=np.int64))

    # -- normal operation (under the PS's lock)

    def push(self, ps: int, table: EmbeddingTable, ids: np.ndarray, grads: np.ndarray) -> None:
        now, payload = self.buffers[ps].admit(table.name, ids, {"grad": grads})
        if now.size:
            self._apply(ps, table, now, payload["grad"])

    def _apply(self, ps: int, table: EmbeddingTable, ids: np.ndarray, grads: np.ndarray) -> None:
        t0 = time.perf_counter()
        old = table.fields(ids)
        t1 = time.perf_counter()
        table.apply_gradients(ids, grads)
        t2 = time.perf_counter()
        new = table.fields(ids)
        self.outbox.extend(self.props[ps].deltas({table.name: (ids, old, new)}))
        if threading.get_ident() == self._trainer:
            self._charge(ps, (t1 - t0) + (time.perf_counter() - t2))

    def _charge(self, ps: int, seconds: float) -> None:
        self.cluster.clock.parity += seconds
        self.busy_s[ps] += seconds

    def take_busiest(self) -> float:
        """The parity work of the busiest PS since the last call: in a cluster each PS does
        its own, at the same time as the others."""
        busiest = max(self.busy_s)
        self.busy_s = [0.0] * len(self.busy_s)
        return busiest

    def flush(self) -> None:
        """Deliver queued parity messages in order (each channel's order is the queue's)."""
        if not self.outbox:
            return
        mine = threading.get_ident() == self._trainer
        with self.wire:
            while self.outbox:
                start = time.perf_counter()
                delta = self.outbox.popleft()
                with self.cluster.locks[delta.holder]:
                    self.stores[delta.holder].apply(delta)
                if mine:
                    self._charge(delta.holder, time.perf_counter() - start)

    def pull(self, ps: int, table: EmbeddingTable, ids: np.ndarray) -> np.ndarray:
        rebuild = self.rebuild
        if rebuild is None or ps != rebuild.lost or rebuild.plan.done:
            return table.lookup(ids)
        pending = rebuild.plan.status(table.name, ids) != RowStatus.DONE
        if not pending.any():
            return table.lookup(ids)
        start = time.perf_counter()
        rows = np.empty((ids.size, table.dim), np.float32)
        if not pending.all():
            rows[~pending] = table.lookup(ids[~pending])
        rows[pending] = self.degraded_read(table.name, ids[pending])["row"]
        self.cluster.clock.degraded += time.perf_counter() - start
        return rows

    def degraded_read(self, table: str, ids: np.ndarray) -> Fields:
        """Rows of the lost PS not rebuilt yet: ``parity - sum(other members)``."""
        lost = self.rebuild.lost if self.rebuild else -1
        plan = plan_decode(self.placement, table, lost, ids)
        parity = {}
        for h, (_, slots) in plan.parity.items():
            with self.cluster.locks[h]:
                parity[h] = self.stores[h].read(table, slots)
        members = {
            q: self.cluster.ps[q].tables[table].fields(got) for q, got in plan.member_ids.items()
        }
        return plan.decode(self.codec, parity, members, DTYPES)

    # -- a PS is lost

    def fail(self, lost: int, step: int) -> Rebuild:
        """Lose PS ``lost`` now and start its rebuild in the background; returns at once."""
        self.join()
        self.flush()  # in-flight differences are drained before decoding
        old = self.cluster.ps[lost]
        truth = {}
        for name, table in old.tables.items():
            ids = np.sort(table.created_ids())
            truth[name] = {"ids": ids, **table.fields(ids)}
        started = time.perf_counter()
        c, placement = self.cluster, self.placement
        self.epochs[lost] += 1
        epoch = self.epochs[lost]
        for h in placement.holders_of(lost):
            with c.locks[h]:
                self.stores[h].fence(lost, epoch)
        with c.locks[lost]:
            c.ps[lost] = c.new_ps(lost)  # the replacement: empty
            self.stores[lost] = ParityStore(placement, lost, self.codec, self._initial, epoch)
            self.props[lost] = DifferencePropagator(placement, lost, self.codec, epoch)
            self.buffers[lost] = UpdateBuffer()
        for s in placement.sources_of(lost):
            with c.locks[s]:
                self.props[s].reset_holder(lost, epoch)
        materialised = {
            h: {t: self.stores[h].materialised(t) for t in placement.tables}
            for h in placement.holders_of(lost)
        }
        plan = RebuildPlan(
            placement,
            lost,
            self.rows_per_lock,
            data_ids=rows_to_rebuild(placement, lost, materialised),
            parity_slots=self._slots_to_encode(lost),
        )
        with c.locks[lost]:
            for t in placement.tables:
                self.buffers[lost].lock(t, plan.data_ids(t))
                self.stores[lost].mark_stale(t, plan.parity_slots(t))
        rebuild = Rebuild(lost, step, started, truth, plan)
        rebuild.setup_s = time.perf_counter() - started
        self.rebuild = rebuild
        self.rebuilds.append(rebuild)
        self._thread = threading.Thread(target=self._run, args=(rebuild,), daemon=True)
        self._thread.start()
        return rebuild

    def _slots_to_encode(self, holder: int) -> dict[str, np.ndarray]:
        """The lost holder's parity slots with a member some source PS has created: every
        other slot is the code of initial values, which a ``ParityStore`` computes itself."""
        out = {}
        for t in self.placement.tables:
            created = [
                self.cluster.ps[s].tables[t].created_ids()
                for s in self.placement.sources_of(holder)
            ]
            ids = np.concatenate(created) if created else np.empty(0, np.int64)
            where, slots = self.placement.parity_location(t, ids)
            out[t] = np.unique(slots[where == holder])
        return out

    def _run(self, rebuild: Rebuild) -> None:
        try:
            self._rebuild(rebuild)
        except BaseException as exc:  # reported by join()
            rebuild.error = exc
        finally:
            rebuild.done_at = time.perf_counter()

    def _rebuild(self, rebuild: Rebuild) -> None:
        c, plan, lost = self.cluster, rebuild.plan, rebuild.lost
        while (chunk := plan.next_chunk()) is not None:
            t = chunk.table
            sent = {}
            for q in chunk.lock_ps:
                with c.locks[q]:
                    self.buffers[q].lock(t, chunk.locks[q])
                    sent[q] = self.props[q].sent()
            plan.locks_installed(sent)
            while True:
                applied = {}
                for h in chunk.holders:
                    with c.locks[h]:
                        applied[h] = self.stores[h].applied()
                if plan.drained(applied):
                    break
                self.flush()
                time.sleep(0)
            members = {q: c.ps[q].tables[t].fields(ids) for q, ids in chunk.member_ids.items()}
            if chunk.kind == "decode":
                parity = {}
                for h, (_, slots) in chunk.parity.items():
                    with c.locks[h]:
                        parity[h] = self.stores[h].read(t, slots)
                fields = chunk.decode(self.codec, parity, members, DTYPES)
                with c.locks[lost]:
                    c.ps[lost].tables[t].put_fields(chunk.ids, fields)
                rebuild.decoded.append((t, chunk.ids, fields))
                rebuild.rows_done_at = time.perf_counter()
            else:
                fields = chunk.encode(self.codec, members, DTYPES)
                with c.locks[lost]:
                    self.stores[lost].write(t, chunk.slots, fields)
            plan.chunk_written()
            rebuild.chunks += 1
            for q in chunk.lock_ps:
                with c.locks[q]:
                    table = c.ps[q].tables[t]
                    for ids, payload in self.buffers[q].release(t, chunk.locks[q]):
                        rebuild.held += ids.size
                        self._apply(q, table, ids, payload["grad"])
                self.flush()
            time.sleep(0)  # let the trainer in between chunks
        if not rebuild.rows_done_at:
            rebuild.rows_done_at = time.perf_counter()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.rebuild is not None and self.rebuild.error is not None:
            raise RuntimeError("ECRM rebuild failed") from self.rebuild.error

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- the check

    def verify(self, rebuild: Rebuild) -> Verdict:
        """Each decoded row and Adagrad state against the lost PS's at the failure (rows the
        lost PS never created decode to their initial values); lost rows left out of the
        rebuild must still be at their initial values."""
        rows = values = exact = changed = 0
        max_err = 0.0
        for name, truth in rebuild.truth.items():
            parts = [(ids, f) for t, ids, f in rebuild.decoded if t == name]
            ids = np.concatenate([p[0] for p in parts]) if parts else np.empty(0, np.int64)
            want = self._initial(name, ids)
            have = np.isin(ids, truth["ids"])
            pos = np.searchsorted(truth["ids"], ids[have])
            for key in want:
                want[key][have] = truth[key][pos]
            for key in DTYPES:
                got = (
                    np.concatenate([p[1][key] for p in parts])
                    if parts
                    else np.empty_like(want[key])
                )
                same = got.view(np.uint32) == want[key].view(np.uint32)
                values += same.size
                exact += int(same.sum())
                if got.size:
                    max_err = max(max_err, float(np.abs(got - want[key]).max()))
            rows += ids.size
            rest = truth["ids"][~np.isin(truth["ids"], ids)]
            if rest.size:
                init = self._initial(name, rest)
                sel = np.searchsorted(truth["ids"], rest)
                differs = np.zeros(rest.size, dtype=bool)
                for key in DTYPES:
                    differs |= (truth[key][sel] != init[key]).reshape(rest.size, -1).any(axis=1)
                changed += int(differs.sum())
        return Verdict(rows, values, exact, max_err, changed)
