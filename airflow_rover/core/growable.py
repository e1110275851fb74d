"""Row arrays that grow without copying: a table's memory follows the rows it holds.

Each array lives in its own reservation of address space (an anonymous, private, unreserved
mapping): growing only lengthens the view, so no second copy exists while a table grows, and
the memory used is the pages written, not the capacity. Pages of removed rows go back to the
system (``release``). If the reservation is ever outgrown (or none can be had), a larger one
takes a copy: the one moment two copies of that array exist.
"""

from __future__ import annotations

import contextlib
import mmap
import sys

import numpy as np

GROWTH = 1.125  # capacity steps: views are free, this only bounds how often they are rebuilt
MIN_ROWS = 1024
RESERVE_BYTES = 1 << 32  # address space per array (not memory): 4 GiB, 67M rows of dim 16
# Python 3.11's mmap lacks the constant; Linux's value. Without it an unused reservation would
# still count against the kernel's overcommit estimate (not against memory).
_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)
_PAGE = mmap.PAGESIZE
# Past this many bytes an array asks for 2 MB pages: random row reads then miss the TLB far
# less (numpy's own large arrays do the same), while a small table, whose memory a 2 MB page
# would round up by much, keeps 4 KB pages.
HUGE_FROM_BYTES = 16 << 20


class Growable:
    """A (capacity, *tail) array of ``dtype`` whose ``array`` view grows in place."""

    def __init__(self, dtype: np.dtype | type, tail: tuple[int, ...] = ()) -> None:
        self.dtype = np.dtype(dtype)
        self.tail = tail
        self.row_bytes = self.dtype.itemsize * int(np.prod(tail, dtype=np.int64))
        self._map: mmap.mmap | None = None
        self._bytes = np.empty(0, dtype=np.uint8)
        self.array = np.empty((0, *tail), dtype=self.dtype)

    @property
    def capacity(self) -> int:
        return int(self.array.shape[0])

    def ensure(self, need: int) -> None:
        """Room for ``need`` rows; rows already held keep their values (``array`` is a new
        view, so callers re-read it)."""
        if need <= self.capacity:
            return
        cap = max(need, int(self.capacity * GROWTH), MIN_ROWS)
        if cap * self.row_bytes > self._bytes.size:
            self._move(cap)
        self.array = self._view(cap)

    def release(self, keep: int) -> None:
        """Give back the pages wholly beyond the first ``keep`` rows (their values are lost)."""
        if self._map is None:
            return
        start = -(-keep * self.row_bytes // _PAGE) * _PAGE
        end = min(-(-self.capacity * self.row_bytes // _PAGE) * _PAGE, len(self._map))
        if end > start and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)

    def _view(self, rows: int) -> np.ndarray:
        return self._bytes[: rows * self.row_bytes].view(self.dtype).reshape(rows, *self.tail)

    def _move(self, cap: int) -> None:
        """A new reservation holding ``cap`` rows, with the rows held so far copied in."""
        need = cap * self.row_bytes
        new_map: mmap.mmap | None = None
        for size in (max(RESERVE_BYTES, 2 * need), need):
            try:
                flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _NORESERVE
                new_map = mmap.mmap(-1, max(size, 1), flags=flags)
                break
            except (OSError, ValueError):  # address space limited (ulimit -v, strict overcommit)
                continue
        if new_map is None:
            raise MemoryError(f"cannot map {need} bytes for a table array")
        _huge_pages_beyond(new_map, HUGE_FROM_BYTES)
        new_bytes = np.frombuffer(new_map, dtype=np.uint8)
        held = self.capacity * self.row_bytes
        new_bytes[:held] = self._bytes[:held]
        self._map, self._bytes = new_map, new_bytes


def _huge_pages_beyond(mapped: mmap.mmap, offset: int) -> None:
    """Advise 2 MB pages for ``mapped`` past ``offset`` bytes, where the system has them."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or len(mapped) <= offset:
        return
    with contextlib.suppress(OSError):  # no transparent huge pages: 4 KB pages then
        mapped.madvise(advice, offset, len(mapped) - offset)
