"""A replacement PS rebuilding the lost one it replaces (ECRM section 3.4), while training
goes on: it adopts what the holders knew of the lost PS, takes over its sources' channels and
rebuilds its rows and the parity it held chunk by chunk in a thread (``core.ecrm.RebuildPlan``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from airflow_rover.core.ecrm import Fields, RebuildPlan, rows_to_rebuild
from airflow_rover.core.ecrm.messages import read_ints, text
from airflow_rover.core.ecrm.row_keys import KEY_FIELD, decode_keys
from airflow_rover.ps.ecrm.peer import EcrmPeer, RebuildProgress, Request
from airflow_rover.ps.ecrm.positional import PositionalRows

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.002

Replies = dict[tuple[str, int], Request]


class Replacement(EcrmPeer):
    """The ECRM side of a PS that replaces a lost one, started empty: an ``EcrmPeer`` that
    first rebuilds what the lost PS held (``start_rebuild``). Its positional tables are
    rebuilt first, before they take requests (``wait_ready``); their rows are placed one
    after the other (``PositionalRows.place``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._positional_chunks = 0  # the rebuild's first chunks: its positional tables' rows
        if self.positional:
            self.positional_ready.clear()

    def start_rebuild(self) -> Request:
        """Adopt what the holders knew of the lost PS, take over its sources' channels, and
        rebuild its rows and parity in the background."""
        started = time.perf_counter()
        holders = self.placement.holders_of(self.index)
        sources = self.placement.sources_of(self.index)
        replies = self._take_over(holders, sources)
        seen: dict[int, set[int]] = {}
        dense: Fields = {}
        materialised: dict[int, dict[str, np.ndarray]] = {}
        for h in holders:  # in holder order: the first one's dense replica
            reply = replies["fence", h]
            seen[h] = {int(k) for k in reply["batch_keys"]}
            dense = dense or {k[8:]: v for k, v in reply.items() if k.startswith("replica/")}
            materialised[h] = {t: reply[f"materialised/{t}"] for t in self.placement.tables}
        try:
            keys = self._agree(seen)
        except RuntimeError as exc:  # reported by status(); the master gives up on the PS
            return self._give_up(exc, started)
        targets = rows_to_rebuild(self.placement, self.index, materialised)
        first = sorted(targets, key=lambda t: t not in self.positional)  # positional first
        plan = RebuildPlan(
            self.placement,
            self.index,
            self.rows_per_lock,
            data_ids={t: targets[t] for t in first},
            parity_slots=self._slots_with_rows({s: replies["reset", s] for s in sources}),
        )
        self._positional_chunks = sum(
            -(-targets[t].size // self.rows_per_lock) for t in self.positional
        )
        rebuild = self._adopt(plan, keys, dense, started)
        self.send_ledger()  # so a later loss of this PS finds its holders knowing it
        threading.Thread(target=self._run_rebuild, args=(rebuild,), daemon=True).start()
        self._log_start(plan, len(holders), len(keys), bool(dense), started)
        return self.status()

    def _take_over(self, holders: tuple[int, ...], sources: tuple[int, ...]) -> Replies:
        """One round trip: the holders fence the dead incarnation (and say what they knew of
        it) while the sources re-point their channels here and say which rows they have (read
        after the re-pointing)."""
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
        return self._fan(
            {("fence", h): functools.partial(self.peers.call, h, fence) for h in holders}
            | {("reset", s): functools.partial(self.peers.call, s, reset) for s in sources}
        )

    def _give_up(self, exc: RuntimeError, started: float) -> Request:
        """The holders' parity cannot be made to agree: a rebuild of nothing, failed."""
        log.error("PS %d: %s", self.index, exc)
        nothing = {t: np.empty(0, np.int64) for t in self.placement.tables}
        plan = RebuildPlan(self.placement, self.index, self.rows_per_lock, nothing, nothing)
        self.rebuild = RebuildProgress(
            plan, started, done_at=time.perf_counter(), error=str(exc), positional_failed=True
        )
        self.positional_ready.set()
        return self.status()

    def _adopt(
        self, plan: RebuildPlan, keys: set[int], dense: Fields, started: float
    ) -> RebuildProgress:
        """Take the agreed ledger and the dense replica, lock every row to rebuild and mark
        the parity to re-encode stale, under the apply lock: no push lands in between."""
        with self.ps.applying():
            self.ps.ledger.applied.update(keys)
            if dense:
                self.ps.dense.restore(dense)
            for t in self.placement.tables:
                self.buffer.lock(t, plan.data_ids(t))
            self.holder.mark_stale({t: plan.parity_slots(t) for t in self.placement.tables})
            rebuild = RebuildProgress(plan, started)
            self.rebuild = rebuild
        return rebuild

    def _log_start(
        self, plan: RebuildPlan, holders: int, keys: int, dense: bool, started: float
    ) -> None:
        log.info(
            "PS %d (incarnation %d): rebuilding %d rows and %d parity slots from %d holders "
            "(%d batches applied, dense replica: %s; set up in %.0f ms)",
            self.index,
            self.epoch,
            sum(plan.data_ids(t).size for t in self.placement.tables),
            sum(plan.parity_slots(t).size for t in self.placement.tables),
            holders,
            keys,
            "yes" if dense else "none",
            1000 * (time.perf_counter() - started),
        )

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

    def _run_rebuild(self, rebuild: RebuildProgress) -> None:
        try:
            self._rebuild(rebuild)
        except Exception as exc:  # reported by status(); the master gives up on the PS
            log.exception("PS %d: rebuild failed", self.index)
            rebuild.error = f"{type(exc).__name__}: {exc}"
            rebuild.positional_failed = not self.positional_ready.is_set()
        finally:
            rebuild.done_at = time.perf_counter()
            if rebuild.rows_done_at is None:
                rebuild.rows_done_at = rebuild.done_at
            self.positional_ready.set()

    def _rebuild(self, rebuild: RebuildProgress) -> None:
        """Chunk by chunk; the calls of a step go to the other PS at once (one round trip, not
        one per PS: a chunk costs about five round trips, whatever k is)."""
        plan = rebuild.plan

        def on(q: int, op: str, **arrays: np.ndarray) -> Callable[[], Fields]:
            request = {"op": text(op), "table": text(t), **arrays}
            return lambda: self.peers.call(q, request)

        released: dict[int, dict[int, int]] = {}  # each PS's send counters after its unlock
        while True:
            if rebuild.chunks >= self._positional_chunks:
                self.positional_ready.set()
            chunk = plan.next_chunk()
            if chunk is None:
                break
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
                    rows = self.positional.get(t)
                    if rows is None:
                        self.ps.tables[t].put_fields(chunk.ids, fields)
                    else:
                        self._place(rows, chunk.ids, fields)
                    plan.chunk_written()
                    rebuild.held_rows += self._release(t, chunk.locks[self.index])
                    released[self.index] = self.propagator.sent()
                self._flush_channels()
                rebuild.rows_done_at = time.perf_counter()
            else:
                fields = chunk.encode(self.codec, self._fan(reads), self._dtypes(t))
                self.holder.write(t, chunk.slots, fields)
                plan.chunk_written()
            unlocked = self._fan({q: on(q, "unlock", ids=chunk.locks[q]) for q in others})
            rebuild.held_rows += sum(int(reply["held"][0]) for reply in unlocked.values())
            released.update({q: read_ints(reply) for q, reply in unlocked.items()})
            rebuild.chunks += 1
        self._wait_delivered(released)

    def _place(self, rows: PositionalRows, keys: np.ndarray, fields: Fields) -> None:
        """Decoded positions of a positional table: the rows they held placed here (under
        the apply lock), their code moved where a row lands at another position."""
        table = rows.table.name
        present, ids = decode_keys(table, fields[KEY_FIELD])
        if not present.any():
            return
        moved, before, after = rows.place(
            keys[present], ids, {n: v[present] for n, v in fields.items()}
        )
        if moved.size:
            self._send({table: (moved, before, after)}, None)

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
            if h in self.placement.holders_of(q)
        }
        holders = sorted({h for _, h in marks})
        while True:
            applied = self._fan({h: functools.partial(self._applied, h) for h in holders})
            if all(applied[h].get(q, 0) >= n for (q, h), n in marks.items()):
                return
            time.sleep(DRAIN_POLL_S)

    def _applied(self, holder: int) -> dict[int, int]:
        if holder == self.index:
            return self.holder.applied()
        return read_ints(self.peers.call(holder, {"op": text("applied")}))
