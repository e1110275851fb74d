"""The parity one PS holds for its sources (ECRM section 3.3), and what it knows of them:
the batches each applied, its latest messages (to take out again), its dense variables."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping

import numpy as np

from airflow_rover.core.ecrm import Fields, ParityCodec, ParityDelta, ParityPlacement, ParityStore
from airflow_rover.core.ecrm.messages import decode_frame, ints, read_text
from airflow_rover.core.ecrm.parity_store import InitialFn
from airflow_rover.core.ledger import NO_KEY

# How long a holder keeps applied messages it may have to take out again (``rollback``), and
# at most how many per source: enough for what one channel can lag another (a linger, a send
# and a retry); a rollback that finds too little fails the rebuild, and the try resumes from
# the last checkpoint.
RECENT_S = 2.0
RECENT_MESSAGES = 1024


class ParityHolder:
    """This PS as a parity holder: its ``ParityStore`` and, per source, the incarnation it
    takes messages from, the batch keys it heard of, its recent messages and its dense
    replica (first holder only). One lock covers them all."""

    def __init__(
        self,
        placement: ParityPlacement,
        index: int,
        codec: ParityCodec,
        initial: InitialFn,
        epochs: list[int],
    ) -> None:
        self.placement = placement
        self.index = index
        self.epoch = epochs[index]
        self.store = ParityStore(placement, index, codec, initial, self.epoch)
        self._parity_lock = threading.Lock()
        self._src_epoch = {s: epochs[s] for s in placement.sources_of(index)}
        self.keys_from: dict[int, set[int]] = {s: set() for s in self._src_epoch}
        # the latest messages applied per source, with their batch keys: a batch only some
        # holders had when its source died is taken out again (``rollback``)
        self.recent: dict[int, collections.deque[tuple[float, int, ParityDelta]]] = {}
        self.replica: dict[int, Fields] = {}  # sources' dense variables (first holder only)

    def read(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``parity_read``: the ``slots`` of one ``table`` (a rebuild's chunk), or the
        ``slots/<table>`` of several (a degraded read: with how far each source's messages
        are applied and in which incarnation)."""
        table = read_text(req["table"]) if "table" in req else ""
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

    def applied(self) -> dict[int, int]:
        """Last message applied from each source (``ParityStore.applied``)."""
        with self._parity_lock:
            return self.store.applied()

    def write(self, table: str, slots: np.ndarray, fields: Mapping[str, np.ndarray]) -> None:
        """Set the parity of ``slots`` (re-encoded)."""
        with self._parity_lock:
            self.store.write(table, slots, fields)

    def mark_stale(self, slots: Mapping[str, np.ndarray]) -> None:
        """These slots per table will be re-encoded (a replacement's rebuild)."""
        with self._parity_lock:
            for table, stale in slots.items():
                self.store.mark_stale(table, stale)

    def receive(self, frame: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
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

    def fence(self, source: int, epoch: int) -> dict[str, np.ndarray]:
        """The dead incarnation of ``source`` is fenced: hand back what this holder knows of
        it (the batches it applied, the replica of its dense variables) and materialised
        parity slots, from which its replacement is rebuilt."""
        with self._parity_lock:
            self.store.fence(source, epoch)
            self._src_epoch[source] = max(self._src_epoch[source], epoch)
            # Every batch this holder knows the partition applied, whichever incarnation sent
            # it: a replacement sends its ledger again, and if it is lost before this holder
            # heard all of it, forgetting here would make old batches look missing here and
            # present at the other holders, with nothing left to take out (``rollback``).
            keys = self.keys_from.get(source, set())
            out = {"batch_keys": np.array(sorted(keys), dtype=np.int64)}
            out.update({f"replica/{k}": v for k, v in self.replica.pop(source, {}).items()})
            for t in self.placement.tables:
                out[f"materialised/{t}"] = self.store.materialised(t)
        return out

    def rollback(self, source: int, keys: set[int]) -> dict[str, np.ndarray]:
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
