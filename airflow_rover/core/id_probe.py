"""The hash index's hot loops (``_id_probe.c``), loaded with ctypes, or their numpy twin.

``setup.py`` builds the C file as an optional extension: an install without a compiler still
works, on the numpy twin, which gives the same rows (slower). ``ROVER_REQUIRE_COMPILED=1``
makes a missing build an error (CI sets it, so the compiled path is the one tested).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
from pathlib import Path
from typing import Protocol

import numpy as np

EMPTY = -1
# A row's access record: the counter CPR ranks rows by and the last day it was trained on,
# one 8-byte word (little-endian: ``count`` its low half, as the C loops read it).
META = np.dtype([("count", "<u4"), ("seen", "<i4")])
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)


class Probe(Protocol):
    """The loops ``core.id_index`` and ``ps.tables`` run; arrays are C-contiguous, ids
    int64, rows and slots int32, ``mask`` the slot count minus one (a power of two)."""

    compiled: bool

    def find(
        self, slots: np.ndarray, mask: int, keys: np.ndarray, ids: np.ndarray, out: np.ndarray
    ) -> int:
        """Rows of ``ids`` into ``out`` (-1 where absent); returns how many are absent."""
        ...

    def insert(
        self,
        slots: np.ndarray,
        mask: int,
        keys: np.ndarray,
        ids: np.ndarray,
        out: np.ndarray,
        next_row: int,
    ) -> int:
        """``find``, an absent id taking the next row (in order of first appearance, its id
        written to ``keys``); returns the next free row."""
        ...

    def rebuild(self, slots: np.ndarray, mask: int, keys: np.ndarray) -> None:
        """Empty ``slots`` and index the distinct ``keys`` as rows 0, 1, ..."""
        ...

    def increasing(self, ids: np.ndarray) -> bool:
        """Whether ``ids`` strictly increase (so hold no repeat)."""
        ...

    def pull(
        self,
        slots: np.ndarray,
        mask: int,
        keys: np.ndarray,
        ids: np.ndarray,
        rows: np.ndarray,
        src: np.ndarray,
        out: np.ndarray,
        meta: np.ndarray,
        day: int,
    ) -> int:
        """``find`` into ``rows`` and, for each id found, ``out[i] = src[rows[i]]`` with an
        access counted (``meta``: ``META`` records); returns how many are absent."""
        ...

    def pull_direct(
        self,
        row_of: np.ndarray,
        ids: np.ndarray,
        rows: np.ndarray,
        src: np.ndarray,
        out: np.ndarray,
        meta: np.ndarray,
        day: int,
    ) -> int:
        """``pull`` for ids that index ``row_of`` directly (``rows[i] = row_of[ids[i]]``, -1
        where absent; ids checked in range by the caller); returns how many are absent."""
        ...

    def gather_count(
        self, src: np.ndarray, rows: np.ndarray, out: np.ndarray, meta: np.ndarray, day: int
    ) -> None:
        """``out[i] = src[rows[i]]``, counting an access to each row (its ``count`` + 1, its
        ``seen`` = ``day``); ``rows`` distinct and valid."""
        ...

    def gather(self, src: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        """``out[i] = src[rows[i]]``; ``rows`` valid."""
        ...

    def scatter(self, dst: np.ndarray, rows: np.ndarray, src: np.ndarray) -> None:
        """``dst[rows[i]] = src[i]``; ``rows`` distinct and valid."""
        ...

    def all_finite(self, x: np.ndarray) -> bool:
        """Whether no value of float32 ``x`` is inf or nan."""
        ...

    def adagrad(
        self,
        param: np.ndarray,
        accum: np.ndarray,
        rows: np.ndarray,
        grads: np.ndarray,
        lr: np.float32,
        eps: np.float32,
    ) -> None:
        """Adagrad on rows ``rows`` (distinct, valid) of float32 ``param`` and ``accum`` in
        place, bit for bit as ``training_optimizers.Optimizer.apply``."""
        ...

    def adagrad_flat(
        self,
        param: np.ndarray,
        accum: np.ndarray,
        grads: np.ndarray,
        lr: np.float32,
        eps: np.float32,
    ) -> None:
        """``adagrad`` on whole float32 arrays of one shape (C-contiguous)."""
        ...


def _interface_addr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


# An ndarray's data pointer is the first field after the object header (numpy's C ABI, what
# its PyArray_DATA macro reads). Reading it there costs 0.2 us, where ``__array_interface__``
# builds a dict (1.4 us, 4 us for a record dtype), and the loops take up to 7 arrays a call.
_DATA_AT = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)
_pointer_at = ctypes.c_void_p.from_address


def _header_addr(a: np.ndarray) -> int:
    return _pointer_at(id(a) + _DATA_AT).value or 0


def _header_readable() -> bool:
    """Whether this interpreter lays arrays out as ``_header_addr`` expects (checked on a
    few arrays once, so a different layout falls back rather than reads a wrong address)."""
    base = np.arange(12, dtype=np.int64)
    samples = (base, base[3:], base.reshape(3, 4)[1:], np.zeros(2, dtype=META))
    return all(_header_addr(a) == _interface_addr(a) for a in samples)


_addr = _header_addr if _header_readable() else _interface_addr


class CompiledProbe:
    """The C loops (one pass per call, no temporaries)."""

    compiled = True

    def __init__(self, lib: ctypes.CDLL) -> None:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        u64, i32, f32 = ctypes.c_uint64, ctypes.c_int32, ctypes.c_float
        sig = {
            "rover_find": (i64, [ptr, u64, ptr, ptr, i64, ptr]),
            "rover_insert": (i64, [ptr, u64, ptr, ptr, i64, ptr, i64]),
            "rover_rebuild": (None, [ptr, u64, ptr, i64]),
            "rover_increasing": (i32, [ptr, i64]),
            "rover_pull": (i64, [ptr, u64, ptr, ptr, i64, ptr, ptr, i64, ptr, ptr, i32]),
            "rover_pull_direct": (i64, [ptr, ptr, i64, ptr, ptr, i64, ptr, ptr, i32]),
            "rover_gather_count": (None, [ptr, i64, ptr, i64, ptr, ptr, i32]),
            "rover_gather": (None, [ptr, i64, ptr, i64, ptr]),
            "rover_scatter": (None, [ptr, i64, ptr, i64, ptr]),
            "rover_all_finite": (i32, [ptr, i64]),
            "rover_adagrad": (None, [ptr, ptr, i64, ptr, i64, ptr, f32, f32]),
            "rover_adagrad_flat": (None, [ptr, ptr, ptr, i64, f32, f32]),
        }
        for name, (restype, argtypes) in sig.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        self._lib = lib

    def find(
        self, slots: np.ndarray, mask: int, keys: np.ndarray, ids: np.ndarray, out: np.ndarray
    ) -> int:
        return int(
            self._lib.rover_find(_addr(slots), mask, _addr(keys), _addr(ids), ids.size, _addr(out))
        )

    def insert(
        self,
        slots: np.ndarray,
        mask: int,
        keys: np.ndarray,
        ids: np.ndarray,
        out: np.ndarray,
        next_row: int,
    ) -> int:
        args = (_addr(slots), mask, _addr(keys), _addr(ids), ids.size, _addr(out), next_row)
        return int(self._lib.rover_insert(*args))

    def rebuild(self, slots: np.ndarray, mask: int, keys: np.ndarray) -> None:
        self._lib.rover_rebuild(_addr(slots), mask, _addr(keys), keys.size)

    def increasing(self, ids: np.ndarray) -> bool:
        return bool(self._lib.rover_increasing(_addr(ids), ids.size))

    def pull(
        self,
        slots: np.ndarray,
        mask: int,
        keys: np.ndarray,
        ids: np.ndarray,
        rows: np.ndarray,
        src: np.ndarray,
        out: np.ndarray,
        meta: np.ndarray,
        day: int,
    ) -> int:
        args = (_addr(slots), mask, _addr(keys), _addr(ids), ids.size, _addr(rows))
        return int(
            self._lib.rover_pull(*args, _addr(src), src.shape[1], _addr(out), _addr(meta), day)
        )

    def pull_direct(
        self,
        row_of: np.ndarray,
        ids: np.ndarray,
        rows: np.ndarray,
        src: np.ndarray,
        out: np.ndarray,
        meta: np.ndarray,
        day: int,
    ) -> int:
        args = (_addr(row_of), _addr(ids), ids.size, _addr(rows), _addr(src), src.shape[1])
        return int(self._lib.rover_pull_direct(*args, _addr(out), _addr(meta), day))

    def gather_count(
        self, src: np.ndarray, rows: np.ndarray, out: np.ndarray, meta: np.ndarray, day: int
    ) -> None:
        args = (_addr(src), src.shape[1], _addr(rows), rows.size, _addr(out))
        self._lib.rover_gather_count(*args, _addr(meta), day)

    def gather(self, src: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        self._lib.rover_gather(_addr(src), src.shape[1], _addr(rows), rows.size, _addr(out))

    def scatter(self, dst: np.ndarray, rows: np.ndarray, src: np.ndarray) -> None:
        self._lib.rover_scatter(_addr(dst), dst.shape[1], _addr(rows), rows.size, _addr(src))

    def all_finite(self, x: np.ndarray) -> bool:
        return bool(self._lib.rover_all_finite(_addr(x), x.size))

    def adagrad(
        self,
        param: np.ndarray,
        accum: np.ndarray,
        rows: np.ndarray,
        grads: np.ndarray,
        lr: np.float32,
        eps: np.float32,
    ) -> None:
        args = (_addr(param), _addr(accum), param.shape[1], _addr(rows), rows.size)
        self._lib.rover_adagrad(*args, _addr(grads), float(lr), float(eps))

    def adagrad_flat(
        self,
        param: np.ndarray,
        accum: np.ndarray,
        grads: np.ndarray,
        lr: np.float32,
        eps: np.float32,
    ) -> None:
        args = (_addr(param), _addr(accum), _addr(grads), param.size)
        self._lib.rover_adagrad_flat(*args, float(lr), float(eps))


def mix(ids: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, as the C file computes it (uint64, wrapping)."""
    x = ids.astype(np.int64, copy=False).view(np.uint64)
    x = x ^ (x >> np.uint64(30))
    x *= _C1
    x ^= x >> np.uint64(27)
    x *= _C2
    x ^= x >> np.uint64(31)
    return x


class NumpyProbe:
    """The same loops in numpy: probes advance together, one step per round."""

    compiled = False

    def find(
        self, slots: np.ndarray, mask: int, keys: np.ndarray, ids: np.ndarray, out: np.ndarray
    ) -> int:
        hashes = mix(ids)
        want = tags(hashes, mask)
        pos = (hashes & np.uint64(mask)).astype(np.int64)
        live = np.arange(ids.size)  # ids whose probe goes on
        while live.size:
            got = slots[pos[live]]
            empty = got == EMPTY
            out[live[empty]] = EMPTY
            live, got = live[~empty], got[~empty]
            row = got & np.int32(mask)
            hit = ((got & ~np.int32(mask)) == want[live]) & (keys[row] == ids[live])
            out[live[hit]] = row[hit]
            live = live[~hit]
            pos[live] = (pos[live] + 1) & mask
        return int(np.count_nonzero(out == EMPTY))

    def insert(
        self,
        slots: np.ndarray,
        mask: int,
        keys: np.ndarray,
        ids: np.ndarray,
        out: np.ndarray,
        next_row: int,
    ) -> int:
        if not self.find(slots, mask, keys, ids, out):
            return next_row
        absent = ids[out == EMPTY]
        _, first = np.unique(absent, return_index=True)
        new = absent[np.sort(first)]  # in order of first appearance, as the C loop takes them
        end = next_row + new.size
        keys[next_row:end] = new
        _place(slots, mask, new, next_row)
        self.find(slots, mask, keys, ids, out)
        return end

    def rebuild(self, slots: np.ndarray, mask: int, keys: np.ndarray) -> None:
        slots.fill(EMPTY)
        _place(slots, mask, keys, 0)

    def increasing(self, ids: np.ndarray) -> bool:
        return bool(np.all(ids[1:] > ids[:-1]))

    def pull(
        self,
        slots: np.ndarray,
        mask: int,
        keys: np.ndarray,
        ids: np.ndarray,
        rows: np.ndarray,
        src: np.ndarray,
        out: np.ndarray,
        meta: np.ndarray,
        day: int,
    ) -> int:
        absent = self.find(slots, mask, keys, ids, rows)
        self._copy_found(src, rows, out, meta, day)
        return absent

    def pull_direct(
        self,
        row_of: np.ndarray,
        ids: np.ndarray,
        rows: np.ndarray,
        src: np.ndarray,
        out: np.ndarray,
        meta: np.ndarray,
        day: int,
    ) -> int:
        np.take(row_of, ids, out=rows)
        return int(ids.size - self._copy_found(src, rows, out, meta, day))

    def _copy_found(
        self, src: np.ndarray, rows: np.ndarray, out: np.ndarray, meta: np.ndarray, day: int
    ) -> int:
        """``out[i] = src[rows[i]]``, counted, where ``rows[i]`` is a row; returns how many."""
        found = np.flatnonzero(rows != EMPTY)
        got = np.empty((found.size, src.shape[1]), dtype=src.dtype)
        self.gather_count(src, rows[found], got, meta, day)
        out[found] = got
        return int(found.size)

    def gather_count(
        self, src: np.ndarray, rows: np.ndarray, out: np.ndarray, meta: np.ndarray, day: int
    ) -> None:
        np.take(src, rows, axis=0, out=out)
        meta["count"][rows] += np.uint32(1)
        meta["seen"][rows] = day

    def gather(self, src: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
        np.take(src, rows, axis=0, out=out)

    def scatter(self, dst: np.ndarray, rows: np.ndarray, src: np.ndarray) -> None:
        dst[rows] = src

    def all_finite(self, x: np.ndarray) -> bool:
        return bool(np.isfinite(x).all())

    def adagrad(
        self,
        param: np.ndarray,
        accum: np.ndarray,
        rows: np.ndarray,
        grads: np.ndarray,
        lr: np.float32,
        eps: np.float32,
    ) -> None:
        values, state = param[rows], accum[rows]
        self.adagrad_flat(values, state, grads, lr, eps)
        param[rows], accum[rows] = values, state

    def adagrad_flat(
        self,
        param: np.ndarray,
        accum: np.ndarray,
        grads: np.ndarray,
        lr: np.float32,
        eps: np.float32,
    ) -> None:
        tmp = np.multiply(grads, grads)  # two temporaries, the operations in the same order
        accum += tmp
        np.sqrt(np.add(accum, eps, out=tmp), out=tmp)
        update = np.multiply(lr, grads)
        update /= tmp
        param -= update


def tags(hashes: np.ndarray, mask: int) -> np.ndarray:
    """The tag bits of ids with these hashes in a slot (int32), as the C file computes them:
    the hash's top bits above the low log2(mask + 1) bits that hold the row."""
    bits = mask.bit_length()
    if bits >= 31:
        return np.zeros(hashes.size, dtype=np.int32)
    return ((hashes >> np.uint64(33 + bits)) << np.uint64(bits)).astype(np.int32)


def _place(slots: np.ndarray, mask: int, ids: np.ndarray, first_row: int) -> None:
    """Put distinct ``ids`` (absent from ``slots``) in as rows ``first_row``, ...: each takes
    the first empty slot from its hash on; where several reach one slot, the earliest wins."""
    hashes = mix(ids)
    tag = tags(hashes, mask)
    pos = (hashes & np.uint64(mask)).astype(np.int64)
    pending = np.arange(ids.size)
    while pending.size:
        at = pos[pending]
        free = slots[at] == EMPTY
        _, win = np.unique(at[free], return_index=True)
        winners = pending[free][win]
        slots[pos[winners]] = tag[winners] | (first_row + winners).astype(np.int32)
        pending = pending[np.isin(pending, winners, assume_unique=True, invert=True)]
        pos[pending] = (pos[pending] + 1) & mask


def _library_path() -> Path | None:
    here = Path(__file__).resolve().parent
    for suffix in (*importlib.machinery.EXTENSION_SUFFIXES, ".so"):
        path = here / f"_id_probe{suffix}"
        if path.is_file():
            return path
    return None


def load() -> Probe:
    """The compiled loops if built, else the numpy twin (an error under
    ``ROVER_REQUIRE_COMPILED=1``)."""
    path = _library_path()
    error = "not built (pip install -e . builds it with a C compiler)"
    if path is not None:
        try:
            return CompiledProbe(ctypes.CDLL(str(path)))
        except OSError as exc:
            error = f"{path} does not load: {exc}"
    if os.environ.get("ROVER_REQUIRE_COMPILED") == "1":
        raise RuntimeError(f"ROVER_REQUIRE_COMPILED=1 but the id probe is {error}")
    return NumpyProbe()


PROBE: Probe = load()
