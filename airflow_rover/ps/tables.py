"""The state a parameter server holds: its partition of each embedding group and dense weights.

Rows are created lazily on first touch with a seeded initial value (``core.hashing``), so a row
never touched costs nothing and a re-created row is identical to the lost one. Every row keeps
its optimizer state, a 4-byte access counter (partial-recovery checkpoints rank rows by it) and
the last day it was trained on (``seen``: incremental training evicts rows by it,
``core.incremental``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Literal

import numpy as np

from airflow_rover.core.cpr import SsuSampler, top_rows
from airflow_rover.core.growable import Growable
from airflow_rover.core.hashing import INIT_SCALE, initial_rows
from airflow_rover.core.id_index import IdIndex, RowIndex
from airflow_rover.core.id_probe import META, PROBE
from airflow_rover.core.incremental import UNKNOWN_DAY
from airflow_rover.core.training_optimizers import EPSILON, Optimizer
from airflow_rover.core.vocab_index import VocabIndex

IndexKind = Literal["vocab", "ids"]


class EmbeddingTable:
    """This PS's rows of one (fused) table: an index from id to row position plus row, state
    and counter arrays that grow in place (``core.growable``).

    ``index="vocab"`` (the default) takes ids hashed into ``[0, vocab_size)``, with 4 bytes per
    possible id (``core.vocab_index``); ``index="ids"`` takes any int64 id, each its own row,
    with memory for the rows held only (``core.id_index``; ``vocab_size`` is then nominal).
    """

    def __init__(
        self,
        name: str,
        dim: int,
        vocab_size: int,
        seed: int,
        optimizer: Optimizer,
        index: IndexKind = "vocab",
    ) -> None:
        self.name = name
        self.dim = dim
        self.seed = seed
        self.optimizer = optimizer
        self.index_kind = index
        self._vocab_size = vocab_size
        if index == "vocab":
            self.index: RowIndex = VocabIndex(vocab_size)
        elif index == "ids":
            self.index = IdIndex()
        else:
            raise ValueError(f"table {name!r}: index={index!r}; accepted: vocab, ids")
        fresh = optimizer.init_state((0, dim), rows=True)
        self._store = {
            "rows": Growable(np.float32, (dim,)),
            # access counter (CPR) and last day trained on (core.incremental), one word
            "meta": Growable(META),
            **{f"state/{k}": Growable(v.dtype, v.shape[1:]) for k, v in fresh.items()},
        }
        self._views()
        self.day = UNKNOWN_DAY  # the job's day: what a row touched now records
        self._lock = threading.Lock()
        self.ssu: SsuSampler | None = None  # CPR-SSU: its rows drawn from ``counts``

    def _views(self) -> None:
        """Re-read the arrays' views after they grew (same memory, longer view)."""
        store = self._store
        self.rows = store["rows"].array
        self._meta = store["meta"].array
        self.counts = self._meta["count"]
        self.seen = self._meta["seen"]
        self.state = {k[6:]: v.array for k, v in store.items() if k.startswith("state/")}

    def enable_ssu(self, r: float, sample_period: int, seed: int) -> None:
        """CPR-SSU partial saves: a sub-sample of the rows accessed since the last one."""
        self.ssu = SsuSampler(r, sample_period, seed)

    def partial_rows(self, variant: str, r: float) -> dict[str, np.ndarray]:
        """The rows a CPR partial save writes (``snapshot``'s arrays): ``mfu`` the ``r``
        most-accessed since their last save (their counters are then cleared), ``ssu`` a
        sub-sample of the rows accessed since the last save (every counter is then cleared)."""
        with self._lock:
            n = self.size
            if variant == "mfu":
                slots = top_rows(self.counts[:n], math.ceil(r * n))
            elif variant == "ssu":
                if self.ssu is None:
                    raise ValueError(f"table {self.name!r}: ssu partial save without SSU sampling")
                slots = self.ssu.take(self.counts[:n])
            else:
                raise ValueError(f"partial save: variant={variant!r}; accepted: mfu, ssu")
            # np.take on the 2-D arrays: a third of fancy indexing's time for rows of 16 floats
            out = {"ids": self.index.keys[slots], "rows": np.take(self.rows, slots, axis=0)}
            out["counts"] = self.counts[slots]
            out["seen"] = self.seen[slots]
            out.update({f"state/{k}": np.take(v, slots, axis=0) for k, v in self.state.items()})
            if variant == "mfu":
                self.counts[slots] = 0
            else:
                self.counts[:n] = 0
            return out

    @property
    def size(self) -> int:
        return self.index.size

    def holding(self) -> AbstractContextManager[bool]:
        """The table's lock: no row is created, changed or removed while it is held (a
        snapshot reads ``live_ids`` and the row arrays as views under it)."""
        return self._lock

    @property
    def live_ids(self) -> np.ndarray:
        """The ids of the created rows in slot order: a view of the live array, valid while
        the table is held (``holding``)."""
        return self.index.keys

    def created_ids(self) -> np.ndarray:
        """The ids of the created rows in slot order, a copy (ECRM: which rows a PS has)."""
        with self._lock:
            return self.index.keys.copy()

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def nbytes(self) -> int:
        """Memory the rows held take: rows, optimizer state, counters, the index."""
        per_row = sum(g.row_bytes for g in self._store.values())
        return self.size * per_row + self.index.nbytes()

    def _check_ids(self, ids: np.ndarray) -> np.ndarray:
        """``ids`` as contiguous int64: a 1-D integer array without repeats (a repeat would
        create a row twice), each one this table can hold."""
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(
                f"table {self.name!r}: ids must be a 1-D integer array, got {ids.dtype} {ids.shape}"
            )
        as_int64 = ids.view(np.int64) if ids.dtype == np.uint64 else ids
        as_int64 = np.ascontiguousarray(as_int64, dtype=np.int64)
        increasing = PROBE.increasing(as_int64)  # np.unique's output, the usual request
        if not increasing and np.unique(as_int64).size != ids.size:
            raise ValueError(f"table {self.name!r}: ids must be unique within a request")
        if not ids.size:
            return as_int64
        if increasing:
            lo, hi = int(as_int64[0]), int(as_int64[-1])
        else:
            lo, hi = int(as_int64.min()), int(as_int64.max())
        if (why := self.index.check(lo, hi)) is not None:
            raise ValueError(f"table {self.name!r}: {why}")
        return as_int64

    def _ensure(self, rows: int) -> None:
        if rows > self.rows.shape[0]:
            for array in self._store.values():
                array.ensure(rows)
            self._views()

    def _slots(self, ids: np.ndarray, initialise: bool = True) -> np.ndarray:
        """Row positions of ``ids`` (checked), creating missing rows; caller holds the lock.
        ``initialise=False``: the caller writes every field of them (no seeded values)."""
        start = self.index.size
        slots = self.index.insert(ids)
        need = self.index.size
        if need > start:
            self._ensure(need)
            if initialise:
                created = self.index.keys[start:need]
                self.rows[start:need] = initial_rows(
                    self.name, created, self.dim, self.seed, INIT_SCALE
                )
                fresh = self.optimizer.init_state((need - start, self.dim), rows=True)
                for key, value in fresh.items():
                    self.state[key][start:need] = value
                self.counts[start:need] = 0
                self.seen[start:need] = self.day
        return slots

    def _pulled(self, ids: np.ndarray) -> np.ndarray:
        """The rows of checked ``ids``, created if missing, with an access counted on each
        (caller holds the lock): the counter CPR-MFU ranks by and CPR-SSU samples from, and
        the day eviction reads. Rows held are found, copied and counted in one C call."""
        out = np.empty((ids.size, self.dim), dtype=np.float32)
        rows, absent = self.index.pull(ids, self.rows, out, self._meta, self.day)
        if absent:
            missing = np.flatnonzero(rows < 0)
            created = self._slots(ids[missing])
            got = np.empty((missing.size, self.dim), dtype=np.float32)
            PROBE.gather_count(self.rows, created, got, self._meta, self.day)
            out[missing] = got
        return out

    def lookup(self, ids: np.ndarray, create: bool = True) -> np.ndarray:
        """Rows for unique ``ids``; ``create=False`` (evaluation) reads without inserting."""
        ids = self._check_ids(ids)
        with self._lock:
            if create:
                return self._pulled(ids)
            slots = self.index.lookup(ids)
            out = initial_rows(self.name, ids, self.dim, self.seed, INIT_SCALE)
            known = slots >= 0
            out[known] = self.rows[slots[known]]
            return out

    def lookup_with_state(
        self, ids: np.ndarray, state_ids: np.ndarray
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Rows for unique ``ids`` (created if missing) and, read under the same lock, the
        optimizer state of ``state_ids`` (unique, a subset of ``ids``): a worker that pulls
        ahead of its own push replays that push on these rows exactly as this PS will."""
        ids = self._check_ids(ids)
        state_ids = self._check_ids(state_ids)
        with self._lock:
            rows = self._pulled(ids)
            state_slots = self.index.lookup(state_ids)
            if state_slots.size and state_slots.min() < 0:
                raise ValueError(f"table {self.name!r}: state_ids must be a subset of ids")
            return rows, {k: _take(v, state_slots) for k, v in self.state.items()}

    def check_update(self, ids: np.ndarray, grads: np.ndarray) -> np.ndarray:
        """Reject a malformed update before anything of it is applied; ``ids`` as checked."""
        checked = self._check_ids(ids)
        if grads.shape != (ids.size, self.dim):
            raise ValueError(
                f"table {self.name!r}: gradient shape {grads.shape} != ({ids.size}, {self.dim})"
            )
        if not _all_finite(grads):
            raise ValueError(f"table {self.name!r}: non-finite gradients")
        return checked

    def apply_gradients(self, ids: np.ndarray, grads: np.ndarray) -> None:
        """One optimizer step on the rows of unique ``ids`` (gradients already summed per id):
        Adagrad's in place, in one C pass over the rows; other optimizers on copies."""
        ids = self.check_update(ids, grads)
        with self._lock:
            slots = self._slots(ids)
            in_c = self.optimizer.name == "adagrad"
            if in_c and _rows_in_c(slots, self.rows, self.state["accum"], grads):
                lr = np.float32(self.optimizer.learning_rate)
                PROBE.adagrad(self.rows, self.state["accum"], slots, grads, lr, np.float32(EPSILON))
            else:
                self._apply_at(slots, grads, keep_old=False)

    def apply_with_fields(
        self, ids: np.ndarray, grads: np.ndarray
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``apply_gradients``, returning the rows' ``fields`` before and after the step in one
        pass (an ECRM PS sends their difference to the parity holders)."""
        ids = self.check_update(ids, grads)
        with self._lock:
            old, new = self._apply_at(self._slots(ids), grads, keep_old=True)
        assert old is not None
        return old, new

    def slots_of(self, ids: np.ndarray) -> np.ndarray:
        """Row positions of unique ``ids``, creating missing rows (seeded, no access counted):
        ECRM keys a positional table's rows by position."""
        ids = self._check_ids(ids)
        with self._lock:
            return self._slots(ids).astype(np.int64)

    def apply_at(
        self, slots: np.ndarray, grads: np.ndarray
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``apply_with_fields`` on rows at positions ``slots`` (held, unique)."""
        with self._lock:
            old, new = self._apply_at(np.asarray(slots, dtype=np.int64), grads, keep_old=True)
        assert old is not None
        return old, new

    def ids_at(self, slots: np.ndarray) -> np.ndarray:
        """The ids of rows at positions ``slots`` (held)."""
        with self._lock:
            return self.index.keys[np.asarray(slots, dtype=np.int64)]

    def fields_at(self, slots: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The ids and ``fields`` of rows at positions ``slots`` (held)."""
        slots = np.asarray(slots, dtype=np.int64)
        with self._lock:
            out = {"row": _take(self.rows, slots)}
            out.update({f"state/{k}": _take(v, slots) for k, v in self.state.items()})
            return self.index.keys[slots], out

    def _apply_at(
        self, slots: np.ndarray, grads: np.ndarray, keep_old: bool
    ) -> tuple[dict[str, np.ndarray] | None, dict[str, np.ndarray]]:
        """The optimizer's step on copies of rows ``slots``, written back (caller holds the
        lock): the fields before (``keep_old``) and after."""
        rows = _take(self.rows, slots)
        state = {k: _take(v, slots) for k, v in self.state.items()}
        old = None
        if keep_old:
            old = {"row": rows.copy(), **{f"state/{k}": v.copy() for k, v in state.items()}}
        self.optimizer.apply(rows, state, grads)
        _put(self.rows, slots, rows)
        for key, value in state.items():
            _put(self.state[key], slots, value)
        return old, {"row": rows, **{f"state/{k}": v for k, v in state.items()}}

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """Load a ``snapshot`` (of a PS with the same partitioning) into an empty table."""
        ids = np.asarray(arrays["ids"], dtype=np.int64)
        with self._lock:
            if self.size:
                raise ValueError(f"table {self.name!r}: restore needs an empty table")
            n = ids.size
            self._ensure(n)
            self.rows[:n] = arrays["rows"]
            self.counts[:n] = arrays["counts"]
            self.seen[:n] = arrays.get("seen", self.day)
            for key in self.state:
                self.state[key][:n] = arrays[f"state/{key}"]
            self.index.reset(ids)

    def pop_rows(self, moving: Callable[[np.ndarray], np.ndarray]) -> dict[str, np.ndarray]:
        """Remove the rows whose ids ``moving`` marks (a boolean mask over the ids it gets) and
        return them as ``snapshot`` does: a PS resize hands them to their new owner."""
        with self._lock:
            n = self.size
            keys = self.index.keys
            mask = np.asarray(moving(keys), dtype=bool)
            out: dict[str, np.ndarray] = {
                "ids": keys[mask],
                "rows": self.rows[:n][mask],
                "counts": self.counts[:n][mask],
                "seen": self.seen[:n][mask],
            }
            out.update({f"state/{k}": v[:n][mask] for k, v in self.state.items()})
            keep = np.flatnonzero(~mask)
            self.index.reset(keys[keep])
            for store in self._store.values():
                arr = store.array
                arr[: keep.size] = arr[keep]
                store.release(keep.size)
            return out

    def absorb(self, arrays: dict[str, np.ndarray]) -> None:
        """Take rows another PS hands over (``pop_rows``), replacing any copy held here."""
        ids = self._check_ids(np.asarray(arrays["ids"], dtype=np.int64))
        needed = ["rows", "counts", *(f"state/{k}" for k in self.state)]
        if lacking := [k for k in needed if k not in arrays]:
            raise ValueError(f"table {self.name!r}: absorb needs {needed}; missing {lacking}")
        with self._lock:
            slots = self._slots(ids, initialise=False)  # every field is written below
            self.rows[slots] = arrays["rows"]
            self.counts[slots] = arrays["counts"]
            self.seen[slots] = arrays.get("seen", self.day)
            for key in self.state:
                self.state[key][slots] = arrays[f"state/{key}"]

    def fields(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Row (``row``) and optimizer state (``state/<slot>``) of unique ``ids``, as
        ``core.ecrm`` codes them: read without creating rows or counting an access (a row not
        created yet reads as its seeded initial value and fresh state)."""
        ids = self._check_ids(ids)
        with self._lock:
            slots = self.index.lookup(ids)
            known = slots >= 0
            if known.all():
                out = {"row": self.rows[slots]}
                out.update({f"state/{k}": v[slots] for k, v in self.state.items()})
                return out
            have = slots[known]
            got = {"row": self.rows[have], **{f"state/{k}": v[have] for k, v in self.state.items()}}
        # The rows not created are read as of the same moment, as their initial values,
        # computed after the lock: pushes wait for it, and seeded rows are slow (30 ms for
        # 65,536 on an idle core; an ECRM rebuild reads 65,536 rows at a time).
        initial = self.initial_fields(ids[~known])
        out = {}
        for name, value in got.items():
            out[name] = np.empty((ids.size, *value.shape[1:]), dtype=value.dtype)
            out[name][known] = value
            out[name][~known] = initial[name]
        return out

    def initial_fields(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """What ``fields`` reads for rows never created: seeded rows, fresh optimizer state."""
        out = {"row": initial_rows(self.name, ids, self.dim, self.seed, INIT_SCALE)}
        fresh = self.optimizer.init_state((ids.size, self.dim), rows=True)
        out.update({f"state/{k}": v for k, v in fresh.items()})
        return out

    def put_fields(self, ids: np.ndarray, fields: dict[str, np.ndarray]) -> None:
        """Set rows and optimizer state (``fields``' layout) of unique ``ids``: an ECRM
        rebuild writes the decoded rows of a lost PS this way."""
        arrays = {"ids": ids, "rows": fields["row"], "counts": np.zeros(ids.size, np.uint32)}
        arrays.update({k: v for k, v in fields.items() if k.startswith("state/")})
        self.absorb(arrays)

    def snapshot(self) -> dict[str, np.ndarray]:
        with self._lock:
            n = self.size
            out: dict[str, np.ndarray] = {
                "ids": self.index.keys.copy(),
                "rows": self.rows[:n].copy(),
                "counts": self.counts[:n].copy(),
                "seen": self.seen[:n].copy(),
            }
            out.update({f"state/{k}": v[:n].copy() for k, v in self.state.items()})
            return out


class DenseStore:
    """Dense variables this PS owns; the first worker to initialise a variable wins."""

    def __init__(self, optimizer: Optimizer) -> None:
        self.optimizer = optimizer
        self.values: dict[str, np.ndarray] = {}
        self.state: dict[str, dict[str, np.ndarray]] = {}
        self.version = 0  # updates applied so far: lets a worker skip re-reading its own update
        self._lock = threading.Lock()

    def holding(self) -> AbstractContextManager[bool]:
        """The store's lock: no variable changes while it is held (a snapshot reads them as
        views under it)."""
        return self._lock

    def initialize(self, values: dict[str, np.ndarray]) -> None:
        with self._lock:
            for name, value in values.items():
                if name not in self.values:
                    self.values[name] = np.array(value, dtype=np.float32)
                    self.state[name] = self.optimizer.init_state(value.shape, rows=False)

    def read(self) -> dict[str, np.ndarray]:
        with self._lock:
            return {name: value.copy() for name, value in self.values.items()}

    def snapshot(self) -> dict[str, np.ndarray]:
        """Values, optimizer state and version: everything ``restore`` needs."""
        with self._lock:
            out = {f"dense/{n}": v.copy() for n, v in self.values.items()}
            for name, slots in self.state.items():
                out.update({f"dstate/{name}/{k}": v.copy() for k, v in slots.items()})
            out["dense_version"] = np.array([self.version], dtype=np.int64)
            return out

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        with self._lock:
            for key, value in arrays.items():
                if key.startswith("dense/"):
                    name = key[6:]
                    self.values[name] = np.array(value, dtype=np.float32)
                    self.state[name] = self.optimizer.init_state(value.shape, rows=False)
            for key, value in arrays.items():
                if key.startswith("dstate/"):
                    name, slot = key[7:].rsplit("/", 1)
                    self.state[name][slot] = np.array(value)
            if "dense_version" in arrays:
                self.version = int(arrays["dense_version"][0])

    def pop(self, names: list[str]) -> dict[str, np.ndarray]:
        """Remove the named variables and return them (values and optimizer state) as
        ``snapshot`` does: a PS resize hands them to their new owner."""
        with self._lock:
            out: dict[str, np.ndarray] = {}
            for name in names:
                out[f"dense/{name}"] = self.values.pop(name)
                for slot, value in self.state.pop(name).items():
                    out[f"dstate/{name}/{slot}"] = value
            return out

    def read_versioned(
        self, known_version: int
    ) -> tuple[int, dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
        """(version, values, optimizer state); values and state only if ``known_version`` is
        not the current one (a worker that already holds this version needs nothing)."""
        with self._lock:
            if known_version == self.version:
                return self.version, {}, {}
            values = {name: value.copy() for name, value in self.values.items()}
            state = {n: {k: v.copy() for k, v in s.items()} for n, s in self.state.items()}
            return self.version, values, state

    def check_update(self, grads: dict[str, np.ndarray]) -> None:
        """Reject a malformed update before anything of it is applied."""
        unknown = sorted(set(grads) - set(self.values))
        if unknown:
            raise ValueError(f"dense variables not initialised on this PS: {unknown}")
        for name, grad in grads.items():
            if grad.shape != self.values[name].shape:
                raise ValueError(
                    f"dense {name!r}: gradient shape {grad.shape} != {self.values[name].shape}"
                )
            if not np.isfinite(grad).all():
                raise ValueError(f"dense {name!r}: non-finite gradients")

    def apply_gradients(self, grads: dict[str, np.ndarray]) -> None:
        with self._lock:
            self.check_update(grads)
            for name, grad in grads.items():
                self.optimizer.apply(self.values[name], self.state[name], grad)
            self.version += 1


def _rows_in_c(slots: np.ndarray, *arrays: np.ndarray) -> bool:
    """Whether the C loops can copy these rows (2-D, float32, contiguous; int32 slots)."""
    if slots.dtype != np.int32 or not slots.flags.c_contiguous:
        return False
    return all(a.ndim == 2 and a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)


def _take(array: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """``array[slots]`` for the push (rows of float32 by the C loop, which prefetches)."""
    if not _rows_in_c(slots, array):
        return array[slots]
    out = np.empty((slots.size, array.shape[1]), dtype=np.float32)
    PROBE.gather(array, slots, out)
    return out


def _put(array: np.ndarray, slots: np.ndarray, values: np.ndarray) -> None:
    """``array[slots] = values`` for the push (no 2-D fancy indexing where C can copy)."""
    if _rows_in_c(slots, array, values) and values.shape == (slots.size, array.shape[1]):
        PROBE.scatter(array, slots, values)
    else:
        array[slots] = values


def _all_finite(grads: np.ndarray) -> bool:
    if grads.dtype == np.float32 and grads.flags.c_contiguous:
        return PROBE.all_finite(grads)
    return bool(np.isfinite(grads).all())
