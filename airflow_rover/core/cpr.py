"""CPR partial recovery: PLS accounting, MFU/SSU row selection, save schedule, simulators.

Pure numpy, no Airflow, network or TensorFlow (CPR paper sections 4.1-4.2,
``docs/checkpoint-policies.md``). Who calls what:

* the master keeps one ``PlsTracker`` per job: ``checkpoint(samples)`` when a save cycle
  completes, ``failure(samples)`` when an embedding PS is lost and restored from its own last
  save (the others keep their progress); ``pls`` goes in the job's status and result.
* ``CprSaveSchedule.due(now)`` says when CPR saves (``bench/recovery.py``'s emulated job):
  vanilla every PS in full every ``T_save``; MFU/SSU ``r*N`` rows of each PS every ``r*T_save``.
* each PS selects the rows of an MFU/SSU save: MFU from its 4-byte per-row access counters
  (``top_rows(table.counts[:size], n)`` on the counters the PS already keeps, or an
  ``MfuTracker``), then clears the saved rows' counters; SSU from the same counters at save
  time (``SsuSampler``: what an ``SsuTracker`` fed with every pull's rows would list, drawn
  with no work per pull). A restore replays the partial saves in order
  (``latest_rows``): a row never saved is still its seeded initial value.
* ``simulate_pls`` / ``simulate_overhead`` run the failure process the formulas assume, so a
  unit test can hold the formulas to it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from airflow_rover.core.policies import expected_pls

_U32_MAX = np.uint64(np.iinfo(np.uint32).max)


# ----------------------------------------------------------------------------- PLS


@dataclass(frozen=True)
class PlsEvent:
    """One failure: when (samples), what it lost, the running PLS after it."""

    samples: int
    last_checkpoint: int
    lost_fraction: float
    increment: float
    pls: float


class PlsTracker:
    """Portion of lost samples (CPR eq. 3): each failure of one of N_emb embedding PS adds
    ``(S_i - S_last_ckpt) / (S_total * N_emb)``; a failure losing a share ``f`` of the rows
    (several PS, or the emulation's "clear 25% of the rows") adds ``f * (S_i - S_last)/S_total``.

    For MFU/SSU call ``checkpoint`` at the start of each ``T_save`` cycle
    (``SaveDue.cycle_start``), not at every partial save: CPR compares variants at equal PLS
    (its Figure 12), so the reference point is the vanilla one.
    """

    def __init__(self, total_samples: int, num_emb_ps: int) -> None:
        if total_samples < 1:
            raise ValueError(f"total_samples={total_samples!r}: must be >= 1")
        if num_emb_ps < 1:
            raise ValueError(f"num_emb_ps={num_emb_ps!r}: must be >= 1")
        self.total_samples = total_samples
        self.num_emb_ps = num_emb_ps
        self.last_checkpoint = 0
        self.pls = 0.0
        self.events: list[PlsEvent] = []

    @property
    def failures(self) -> int:
        return len(self.events)

    def checkpoint(self, samples: int) -> None:
        """A save (cycle) completed with ``samples`` processed."""
        if samples < self.last_checkpoint:
            raise ValueError(
                f"checkpoint at {samples} samples is before the last one ({self.last_checkpoint})"
            )
        self.last_checkpoint = samples

    def failure(
        self, samples: int, num_failed: int = 1, lost_fraction: float | None = None
    ) -> float:
        """Record a partial recovery at ``samples`` processed; returns the PLS it added."""
        if samples < self.last_checkpoint:
            raise ValueError(
                f"failure at {samples} samples is before the last checkpoint "
                f"({self.last_checkpoint})"
            )
        if lost_fraction is None:
            if not 1 <= num_failed <= self.num_emb_ps:
                raise ValueError(f"num_failed={num_failed!r}: must be in [1, {self.num_emb_ps}]")
            lost_fraction = num_failed / self.num_emb_ps
        elif not 0 < lost_fraction <= 1:
            raise ValueError(f"lost_fraction={lost_fraction!r}: must be in (0, 1]")
        increment = lost_fraction * (samples - self.last_checkpoint) / self.total_samples
        self.pls += increment
        self.events.append(
            PlsEvent(samples, self.last_checkpoint, lost_fraction, increment, self.pls)
        )
        return increment

    def to_dict(self) -> dict[str, float | int]:
        return {"pls": self.pls, "failures": self.failures, "last_checkpoint": self.last_checkpoint}


# ----------------------------------------------------------------------------- MFU


def top_rows(counts: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` largest counters, ties to the lower index, sorted ascending.

    Rows whose counter is 0 were not accessed since their last save: saving them again would
    write what the checkpoint already has, so they are never picked (fewer than ``n`` may come
    back). O(N): the threshold from a histogram of the counters (``_nth_largest``), the rows
    from one mask, no sort.
    """
    if counts.ndim != 1:
        raise ValueError(f"counts must be 1-D, got shape {counts.shape}")
    nonzero = int(np.count_nonzero(counts))
    n = min(int(n), nonzero)
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    if n == nonzero:
        return np.flatnonzero(counts != 0).astype(np.int64)  # a bool mask: 5x faster
    threshold = _nth_largest(counts, n)
    picked = counts > threshold
    tied = np.flatnonzero(counts == threshold)[: n - int(np.count_nonzero(picked))]
    picked[tied] = True
    return np.flatnonzero(picked).astype(np.int64)


_HISTOGRAM_BINS = 4096  # counters at or above the last bin are ranked by np.partition


def _nth_largest(counts: np.ndarray, n: int) -> int:
    """The ``n``-th largest counter (1 <= n <= counts.size).

    Access counters are small integers with many ties (most rows are touched a few times
    between saves), the case where ``np.partition``'s introselect is slowest (13 ms against
    0.5 ms for a histogram over 214k counters, mostly 1 and 2). The histogram covers the
    counters below ``_HISTOGRAM_BINS - 1``; a threshold above them ranks only the counters
    that large.
    """
    last = _HISTOGRAM_BINS - 1
    hist = np.bincount(np.minimum(counts, last), minlength=_HISTOGRAM_BINS)
    at_least = np.cumsum(hist[::-1])  # at_least[i]: how many counters are >= last - i
    value = last - int(np.searchsorted(at_least, n))
    if value < last:
        return value
    big = counts[counts >= last]
    return int(np.partition(big, big.size - n)[big.size - n])


def _saturating_add(counts: np.ndarray, rows: np.ndarray, inc: np.ndarray) -> None:
    """``counts[rows] += inc`` for unique ``rows``, stopping at 2**32-1 instead of wrapping."""
    total = counts[rows].astype(np.uint64) + inc.astype(np.uint64)
    counts[rows] = np.minimum(total, _U32_MAX).astype(np.uint32)


class MfuTracker:
    """A 4-byte access counter per row (CPR-MFU): the ``r*N`` most-used rows are saved every
    ``r*T_save`` and their counters cleared, so a row is picked by accesses since its last save.
    """

    def __init__(self, num_rows: int = 0, r: float = 0.125) -> None:
        if not 0 < r <= 1:
            raise ValueError(f"r={r!r}: must be in (0, 1]")
        self.r = r
        self._counts = np.zeros(max(num_rows, 0), dtype=np.uint32)
        self._n = max(num_rows, 0)

    @property
    def num_rows(self) -> int:
        return self._n

    @property
    def counts(self) -> np.ndarray:
        """The live counters (a view; do not keep it across ``grow``)."""
        return self._counts[: self._n]

    @property
    def save_size(self) -> int:
        """Rows per save: ``ceil(r*N)``."""
        return math.ceil(self.r * self._n)

    def grow(self, num_rows: int) -> None:
        """Rows are created lazily on the PS; new ones start at 0 accesses."""
        if num_rows <= self._n:
            return
        if num_rows > self._counts.size:
            grown = np.zeros(max(num_rows, 2 * self._counts.size), dtype=np.uint32)
            grown[: self._n] = self._counts[: self._n]
            self._counts = grown
        self._n = num_rows

    def record(self, rows: np.ndarray) -> None:
        """Count one access per element of ``rows`` (row indices, repeats allowed)."""
        rows = np.asarray(rows)
        if rows.size == 0:
            return
        if rows.dtype.kind not in "iu":
            raise ValueError(f"rows must be integers, got {rows.dtype}")
        if rows.min() < 0 or rows.max() >= self._n:
            raise ValueError(f"rows must lie in [0, {self._n}), got [{rows.min()}, {rows.max()}]")
        rows = rows.astype(np.int64, copy=False)
        counts = self._counts[: self._n]
        if rows.size * 4 >= self._n:  # dense batch: one pass over the counters
            inc = np.bincount(rows, minlength=self._n)
            hit = np.flatnonzero(inc)
            _saturating_add(counts, hit, inc[hit])
        else:
            unique, inc = np.unique(rows, return_counts=True)
            _saturating_add(counts, unique, inc)

    def select(self, n: int | None = None) -> np.ndarray:
        """The rows the next save writes: the ``n`` (default ``ceil(r*N)``) most accessed."""
        return top_rows(self.counts, self.save_size if n is None else n)

    def clear(self, rows: np.ndarray) -> None:
        """The rows were saved: their accesses since are what counts now."""
        self._counts[np.asarray(rows, dtype=np.int64)] = 0

    def take(self, n: int | None = None) -> np.ndarray:
        """``select`` then ``clear``: the rows to save now."""
        rows = self.select(n)
        self.clear(rows)
        return rows


# ----------------------------------------------------------------------------- SSU


def check_ssu_options(r: float, sample_period: int) -> None:
    """CPR-SSU's list share ``r`` and sampling period, or a ValueError naming the bad one."""
    if not 0 < r <= 1:
        raise ValueError(f"r={r!r}: must be in (0, 1]")
    if sample_period < 1:
        raise ValueError(f"sample_period={sample_period!r}: must be >= 1")


def ssu_capacity(r: float, num_rows: int) -> int:
    """The most rows an SSU list of share ``r`` holds over ``num_rows`` rows."""
    return max(1, math.ceil(r * num_rows)) if num_rows else 0


class SsuTracker:
    """CPR-SSU: a bounded list of at most ``ceil(r*N)`` distinct rows, fed by a sub-sample of
    the data points (one ``record`` call in ``sample_period`` on average: a call is a batch's
    accesses, so each data point is sampled with probability 1/sample_period, as in CPR, at
    batch granularity); when it overflows, random entries of the whole list are dropped, so
    rows accessed often are likely to be (re)added and stay.

    ``record`` runs on every pull, so it only draws the sample and, for a sampled pull, sets a
    1-byte "sampled" flag per row (one scatter); the list is updated in bulk (``_flush``) once
    a capacity's worth of rows was marked (at least ``FLUSH_ROWS``), or when it is read: one
    pass over the flags finds the marked rows not listed yet, each once, and they are added
    as one batch's rows were (each draws a place among the list and the newcomers). The list
    is unordered (a new row takes an evicted row's place) and a 1-byte "listed" flag per row
    answers "listed already?". Memory: 2 bytes per row plus 8 bytes per listed row (3 bytes
    per row at r = 1/8), below MFU's 4-byte counters. CPR's reference algorithm: the PS, whose
    tables keep those counters anyway, draws the same list at save time (``SsuSampler``).
    """

    FLUSH_ROWS = 4096  # marks before a flush, for lists smaller than that

    def __init__(
        self, num_rows: int = 0, r: float = 0.125, sample_period: int = 2, seed: int = 0
    ) -> None:
        check_ssu_options(r, sample_period)
        self.r = r
        self.sample_period = sample_period
        self._rng = np.random.default_rng(seed)
        self._coin = random.Random(seed)  # one draw per call: Python's is 10x numpy's scalar
        self._n = max(num_rows, 0)
        self._listed = np.zeros(self._n, dtype=np.uint8)  # per row: 1 in the list now
        self._list = np.empty(self.capacity, dtype=np.int64)  # unordered; first _len valid
        self._len = 0
        self._pending = np.zeros(self._n, dtype=np.uint8)  # per row: 1 sampled since a flush
        self._pending_rows = 0  # marks since the last flush (repeats counted)
        self.evicted = 0
        self.flushes = 0

    @property
    def capacity(self) -> int:
        return ssu_capacity(self.r, self._n)

    @property
    def num_rows(self) -> int:
        return self._n

    def __len__(self) -> int:
        self._flush()
        return self._len

    def grow(self, num_rows: int) -> None:
        if num_rows <= self._n:
            return
        self._n = num_rows
        if num_rows > self._listed.size:  # doubling: tables grow a batch at a time
            size = max(num_rows, 2 * self._listed.size)
            listed = np.zeros(size, dtype=np.uint8)
            listed[: self._listed.size] = self._listed
            self._listed = listed
            pending = np.zeros(size, dtype=np.uint8)
            pending[: self._pending.size] = self._pending
            self._pending = pending

    def record(self, rows: np.ndarray, assume_unique: bool = False) -> None:
        """Mark the accesses in ``rows`` (row indices, repeats allowed) for the list if this
        call is sampled: one scatter of a flag per row. ``assume_unique`` is accepted for
        callers that know (the flags make repeats free anyway)."""
        del assume_unique
        rows = np.asarray(rows)
        if rows.size == 0:
            return
        if rows.dtype.kind not in "iu":
            raise ValueError(f"rows must be integers, got {rows.dtype}")
        if self.sample_period > 1 and self._coin.random() * self.sample_period >= 1.0:
            return
        if rows.dtype.kind == "i" and rows.min() < 0:
            raise ValueError(f"rows must lie in [0, {self._n}), got {rows.min()}")
        try:
            self._pending[rows] = 1
        except IndexError:
            raise ValueError(f"rows must lie in [0, {self._n}), got {rows.max()}") from None
        self._pending_rows += rows.size
        if self._pending_rows >= max(self.capacity, self.FLUSH_ROWS):
            self._flush()

    def _flush(self) -> None:
        """Add the marked rows to the list, all at once: one pass over the flags (1 byte a
        row) finds the marked rows not listed yet, each once."""
        if not self._pending_rows:
            return
        self._pending_rows = 0
        self.flushes += 1
        n, pending = self._n, self._pending
        if pending[n:].any():  # past the rows (the flags grow by doubling)
            pending.fill(0)
            raise ValueError(f"rows must lie in [0, {n})")
        fresh = np.flatnonzero(pending[:n] > self._listed[:n])
        pending[:n] = 0
        if fresh.size == 0:
            return
        space = max(self.capacity - self._len, 0)
        if 0 < space < fresh.size:  # which newcomers take the free places: not the lowest
            fresh = self._rng.permutation(fresh)
        if space:
            added = fresh[:space]
            end = self._len + added.size
            if end > self._list.size:
                grown = np.empty(max(end, 2 * self._list.size), dtype=np.int64)
                grown[: self._len] = self._list[: self._len]
                self._list = grown
            self._list[self._len : end] = added
            self._listed[added] = 1
            self._len = end
        if fresh.size > space:
            self._overflow(fresh[space:])

    def _overflow(self, rows: np.ndarray) -> None:
        """The list is full: as many random entries of the list and ``rows`` together as
        ``rows`` has are dropped. Each row draws a place among both, uniformly: a listed row's
        place evicts that row, a newcomer's drops the row itself (of two drawing the same
        place, one wins)."""
        at = self._rng.integers(0, self._len + rows.size, size=rows.size)
        keep = at < self._len
        at = at[keep]
        self._listed[self._list[at]] = 0
        self._list[at] = rows[keep]
        self._listed[self._list[at]] = 1
        self.evicted += rows.size

    def rows(self) -> np.ndarray:
        """The listed rows, ascending (a copy)."""
        self._flush()
        return np.sort(self._list[: self._len])

    def take(self) -> np.ndarray:
        """The rows to save now, ascending; the list starts empty again."""
        out = self.rows()
        self._listed[out] = 0
        self._len = 0
        return out


class SsuSampler:
    """CPR-SSU's list drawn at save time from the access counters the PS keeps for every row
    anyway, instead of a list fed on every pull (``SsuTracker``).

    Each data point is sampled with probability ``1/sample_period``: a row accessed ``c``
    times since the last save was touched by a sampled point with probability
    ``1 - (1 - 1/sample_period)**c``, so each accessed row is drawn with that probability. Of
    the drawn rows at most ``ceil(r*N)`` are kept; as the tracker's full list drops random
    entries and rows accessed often come back, the kept ones are drawn with weights by their
    accesses (Efraimidis-Spirakis keys: one pass, no per-row Python). The counters are the
    caller's to clear after a save.
    """

    def __init__(self, r: float = 0.125, sample_period: int = 2, seed: int = 0) -> None:
        check_ssu_options(r, sample_period)
        self.r = r
        self.sample_period = sample_period
        self._rng = np.random.default_rng(seed)
        # 1 - (1 - 1/sample_period)**c by access count c, up to where it rounds to 1 in float32
        self._chances = _draw_chances(sample_period) if sample_period > 1 else None

    def capacity(self, num_rows: int) -> int:
        return ssu_capacity(self.r, num_rows)

    def take(self, counts: np.ndarray) -> np.ndarray:
        """The rows (ascending) of the list, from each row's accesses since the last save.

        In float32 and without a logarithm per row: the draw's probability by access count
        comes from a table, and the weighted keys are exponential variates over the weights
        (``log(u)/w`` is ``-E/w``: the largest keys are the smallest ``E/w``)."""
        touched = np.flatnonzero(counts != 0)  # 5x faster than on the counters themselves
        if touched.size == 0:
            return touched
        accesses = counts[touched]
        if (chance := self._chances) is not None:
            drawn = self._rng.random(touched.size, dtype=np.float32) < chance.take(
                np.minimum(accesses, chance.size - 1)
            )
            keep = np.flatnonzero(drawn)  # then take: a fifth of boolean indexing's time
            touched, accesses = touched.take(keep), accesses.take(keep)
        cap = self.capacity(counts.size)
        if touched.size > cap:
            keys = self._rng.standard_exponential(touched.size, dtype=np.float32)
            keys /= accesses
            touched = touched[np.argpartition(keys, cap - 1)[:cap]]
        return np.sort(touched)


def _draw_chances(sample_period: int) -> np.ndarray:
    """``1 - (1 - 1/sample_period)**c`` for ``c`` up to where it rounds to 1 in float32."""
    missed = math.log1p(-1.0 / sample_period)  # log of one access unsampled
    top = math.ceil(math.log(2.0**-25) / missed) + 1
    return (-np.expm1(np.arange(top) * missed)).astype(np.float32)


# ----------------------------------------------------------------------------- saves


@dataclass(frozen=True)
class SaveDue:
    """A save the master should take now. ``cycle_start``: a new ``T_save`` cycle begins
    here (call ``PlsTracker.checkpoint``)."""

    kind: Literal["full", "partial"]
    cycle_start: bool
    skipped: int = 0  # saves that fell due while the caller was not looking


class CprSaveSchedule:
    """When CPR saves: vanilla every PS in full every ``T_save``; MFU/SSU ``r*N`` rows of each
    PS every ``r*T_save`` (a cycle is ``ceil(1/r)`` of them). Saves are due on a fixed grid from
    ``start_s``; a late caller gets one save and the missed ones counted, never a burst.
    """

    def __init__(
        self,
        interval_s: float,
        variant: Literal["vanilla", "mfu", "ssu"] = "vanilla",
        r: float = 0.125,
        start_s: float = 0.0,
    ) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"interval_s={interval_s!r}: must be > 0")
        if not 0 < r <= 1:
            raise ValueError(f"r={r!r}: must be in (0, 1]")
        self.variant = variant
        self.partial = variant != "vanilla"
        self.step_s = r * interval_s if self.partial else interval_s
        self.per_cycle = math.ceil(1.0 / r) if self.partial else 1
        self._start = start_s
        self._index = 1  # grid index of the next save

    @property
    def next_due_s(self) -> float:
        return self._start + self._index * self.step_s

    def due(self, now_s: float) -> SaveDue | None:
        if now_s < self.next_due_s:
            return None
        # The last grid point passed. At a grid point itself ``now_s >= next_due_s`` can hold
        # while the floor division rounds down to the point before (293 * 0.00555 s against a
        # 0.32523 s grid): without the max the index stayed put and the next call saved again.
        latest = max(self._index, int((now_s - self._start) // self.step_s))
        skipped = latest - self._index
        crossed = latest // self.per_cycle > (self._index - 1) // self.per_cycle
        self._index = latest + 1
        return SaveDue("partial" if self.partial else "full", crossed, skipped)


def latest_rows(
    saves: Sequence[tuple[np.ndarray, Mapping[str, np.ndarray]]],
    ascending: bool = True,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Merge partial saves (oldest first) into one: each id's fields from its newest save.

    This is what restoring an MFU/SSU checkpoint chain (or compacting it) needs. Saves are
    walked newest first, each giving only the rows no newer save has, and only the result is
    sorted (a chain holds the hot rows many times). Ids hashed into a bounded vocabulary are
    flagged in a 1-byte array per id; raw 64-bit ids (any sign, any range) are ranked by
    ``np.unique`` instead. ``ascending=False`` skips the final sort and its gather (ids newest
    save first) for a restore, which takes rows in any order: they were 45 of the 80 ms of a
    20-save chain's merge, profiled.
    """
    if not saves:
        return np.empty(0, dtype=np.int64), {}
    names = list(saves[0][1])
    for _, fields in saves:
        if list(fields) != names:
            raise ValueError(f"every save must carry the same fields {names}")
    newest_first = [(np.asarray(ids, dtype=np.int64), fields) for ids, fields in reversed(saves)]
    total = sum(ids.size for ids, _ in newest_first)
    low = min((int(ids.min()) for ids, _ in newest_first if ids.size), default=0)
    high = max((int(ids.max()) for ids, _ in newest_first if ids.size), default=-1)
    if low >= 0 and high < _FLAG_IDS_PER_ROW * total + _FLAG_MIN_IDS:
        picks = _fresh_by_flags(newest_first, high + 1)
    else:
        picks = _fresh_by_unique(newest_first)
    # positions, then np.take straight into the output: boolean indexing by a scattered mask
    # is ~5x slower, and taking into parts then concatenating copies every row twice
    keeps = [None if fresh is None else np.flatnonzero(fresh) for fresh in picks]
    sizes = [
        ids.size if keep is None else keep.size
        for (ids, _), keep in zip(newest_first, keeps, strict=True)
    ]
    ends = np.cumsum([0, *sizes])
    ids = _merged([ids for ids, _ in newest_first], keeps, ends)
    fields_out = {
        name: _merged([np.asarray(f[name]) for _, f in newest_first], keeps, ends) for name in names
    }
    if not ascending:
        return ids, fields_out
    order = np.argsort(ids, kind="stable")
    return ids[order], {name: value[order] for name, value in fields_out.items()}


def _merged(
    parts: Sequence[np.ndarray], keeps: Sequence[np.ndarray | None], ends: np.ndarray
) -> np.ndarray:
    """The ``keeps`` rows of each of ``parts`` (all of it where None), one after another."""
    out = np.empty((int(ends[-1]), *parts[0].shape[1:]), dtype=np.result_type(*parts))
    for i, (part, keep) in enumerate(zip(parts, keeps, strict=True)):
        dest = out[ends[i] : ends[i + 1]]
        if keep is None or part.dtype != out.dtype:
            dest[...] = part if keep is None else part.take(keep, axis=0)
        else:
            np.take(part, keep, axis=0, out=dest, mode="clip")  # in range: unbuffered
    return out


# A flag per possible id while the ids span at most this many per row merged (plus a floor):
# beyond, the flags would cost more memory than ``np.unique``'s sort costs time.
_FLAG_IDS_PER_ROW = 64
_FLAG_MIN_IDS = 1 << 20

Saves = Sequence[tuple[np.ndarray, Mapping[str, np.ndarray]]]


def _fresh_by_flags(newest_first: Saves, span: int) -> list[np.ndarray | None]:
    """Per save (newest first), the mask of its ids no newer save has (None: all of them)."""
    seen = np.zeros(span, dtype=bool)
    picks: list[np.ndarray | None] = []
    for ids, _ in newest_first:
        newer = seen[ids]
        seen[ids] = True
        picks.append(None if not newer.any() else ~newer)
    return picks


def _fresh_by_unique(newest_first: Saves) -> list[np.ndarray | None]:
    """``_fresh_by_flags`` for ids of any range: each id's first place in the newest-first
    concatenation is its newest copy."""
    every = np.concatenate([np.asarray(ids, dtype=np.int64) for ids, _ in newest_first])
    fresh = np.zeros(every.size, dtype=bool)
    fresh[np.unique(every, return_index=True)[1]] = True
    picks: list[np.ndarray | None] = []
    start = 0
    for ids, _ in newest_first:
        part = fresh[start : start + len(ids)]
        picks.append(None if part.all() else part)
        start += len(ids)
    return picks


# ----------------------------------------------------------------------------- simulators


@dataclass(frozen=True)
class PlsSimulation:
    expected: float  # CPR eq. 4
    measured: float  # mean over runs
    per_run: np.ndarray = field(repr=False)
    failures: int  # over all runs


def simulate_pls(
    *,
    mtbf_s: float,
    interval_s: float,
    total_s: float,
    num_emb_ps: int,
    runs: int = 1000,
    seed: int = 0,
) -> PlsSimulation:
    """The failure process behind CPR eq. 4, vectorised over ``runs``: exponential times
    between PS failures (mean ``mtbf_s``), saves every ``interval_s`` of training, a constant
    sample rate, each failure losing one PS's updates since the last save."""
    if not all(x > 0 for x in (mtbf_s, interval_s, total_s)) or num_emb_ps < 1 or runs < 1:
        raise ValueError("mtbf_s, interval_s, total_s, num_emb_ps and runs must be > 0")
    rng = np.random.default_rng(seed)
    lam = total_s / mtbf_s
    width = int(lam + 8 * math.sqrt(lam) + 16)
    times = np.cumsum(rng.exponential(mtbf_s, size=(runs, width)), axis=1)
    while (times[:, -1] < total_s).any():  # a run not yet past the end: draw more
        more = np.cumsum(rng.exponential(mtbf_s, size=(runs, width)), axis=1)
        times = np.concatenate([times, times[:, -1:] + more], axis=1)
    inside = times < total_s
    lost = np.where(inside, np.mod(times, interval_s), 0.0)
    per_run = lost.sum(axis=1) / (total_s * num_emb_ps)
    return PlsSimulation(
        expected=expected_pls(interval_s, mtbf_s, num_emb_ps),
        measured=float(per_run.mean()),
        per_run=per_run,
        failures=int(inside.sum()),
    )


@dataclass(frozen=True)
class OverheadSimulation:
    """Wall time spent beyond the failure-free training time, as a share of it, by cause."""

    save: float
    load: float  # load + reschedule pauses
    lost: float  # work redone after a rollback (full recovery only)
    pls: float  # partial recovery only
    failures: int
    saves: int

    @property
    def total(self) -> float:
        return self.save + self.load + self.lost


def simulate_overhead(
    *,
    recovery: Literal["full", "partial"],
    mtbf_s: float,
    interval_s: float,
    total_s: float,
    save_s: float,
    load_s: float,
    reschedule_s: float = 0.0,
    num_emb_ps: int = 1,
    seed: int = 0,
) -> OverheadSimulation:
    """One job, event by event, in wall-clock time: training advances, saves pause it, PS
    failures (exponential in wall time) pause it for load + reschedule, and under full
    recovery roll its progress back to the last save (partial recovery adds PLS instead).
    What CPR eq. 1 and 2 approximate to first order."""
    if recovery not in ("full", "partial"):
        raise ValueError(f"recovery={recovery!r}; accepted: full, partial")
    rng = np.random.default_rng(seed)
    wall = progress = last_save = 0.0
    next_save = interval_s
    next_fail = rng.exponential(mtbf_s)
    save_t = load_t = lost_t = pls = 0.0
    failures = saves = 0
    while progress < total_s:
        step = min(next_save, total_s) - progress
        if next_fail < wall + step:  # a PS fails before the next save (or the end)
            progress += max(next_fail - wall, 0.0)
            wall = max(wall, next_fail)
            failures += 1
            if recovery == "full":
                lost_t += progress - last_save
                progress = last_save
            else:
                pls += (progress - last_save) / (total_s * num_emb_ps)
            wall += load_s + reschedule_s
            load_t += load_s + reschedule_s
            next_fail = wall + rng.exponential(mtbf_s)
            continue
        wall += step
        progress += step
        if progress >= next_save and progress < total_s:
            wall += save_s
            save_t += save_s
            saves += 1
            last_save = progress
            next_save = progress + interval_s
    return OverheadSimulation(
        save=save_t / total_s,
        load=load_t / total_s,
        lost=lost_t / total_s,
        pls=pls,
        failures=failures,
        saves=saves,
    )
