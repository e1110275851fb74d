"""Row arrays that grow in place (``core.growable``): values kept, no copy while the
reservation lasts, pages of removed rows returned, and a working fallback where address space
is short."""

from __future__ import annotations

import numpy as np
import pytest

from airflow_rover.core import growable
from airflow_rover.core.growable import Growable


def address(array: np.ndarray) -> int:
    return int(array.__array_interface__["data"][0])


def test_growing_keeps_values_and_never_moves_them() -> None:
    g = Growable(np.float32, (16,))
    g.ensure(10)
    g.array[:10] = np.arange(160, dtype=np.float32).reshape(10, 16)
    start = address(g.array)
    for need in (2_000, 50_000, 400_000):
        g.ensure(need)
        assert g.capacity >= need
        assert address(g.array) == start  # the same memory, a longer view
    np.testing.assert_array_equal(g.array[:10].ravel(), np.arange(160))


def test_release_returns_the_pages_past_the_rows_kept() -> None:
    g = Growable(np.int64)
    g.ensure(100_000)
    g.array[:] = 7
    g.release(1_000)
    assert (g.array[:1_000] == 7).all()
    page_rows = growable._PAGE // 8
    first_released = -(-1_000 // page_rows) * page_rows
    assert (g.array[first_released:] == 0).all()  # fresh zero pages: the old ones went back


def test_without_a_large_reservation_it_still_grows_by_moving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(growable, "RESERVE_BYTES", 1 << 62)  # no system maps 4 EiB
    g = Growable(np.uint32)
    g.ensure(5_000)
    g.array[:5_000] = np.arange(5_000)
    assert g._bytes.size < 1 << 20  # the fallback: about what was asked for
    g.ensure(300_000)
    np.testing.assert_array_equal(g.array[:5_000], np.arange(5_000))
    assert g.capacity >= 300_000
