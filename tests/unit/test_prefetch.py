"""An iterator's items made ahead on a thread: order, bound, errors and stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from airflow_rover.worker.prefetch import Prefetched


def test_items_arrive_in_order_then_the_end() -> None:
    items = Prefetched(range(50), depth=2, stop=threading.Event(), name="t")
    assert list(items) == list(range(50))
    with pytest.raises(StopIteration):
        next(items)


def test_the_producer_stays_at_most_depth_items_ahead() -> None:
    made: list[int] = []

    def source() -> Iterator[int]:
        for i in range(10):
            made.append(i)
            yield i

    items = Prefetched(source(), depth=2, stop=threading.Event(), name="t")
    time.sleep(0.3)
    assert len(made) == 3  # two queued, one made and waiting for room
    assert next(items) == 0
    time.sleep(0.3)
    assert len(made) == 4


def test_an_error_of_the_source_is_raised_where_its_item_would_be() -> None:
    def source() -> Iterator[int]:
        yield 1
        raise ValueError("shard 7: column 'price' is not a number")

    items = Prefetched(source(), depth=2, stop=threading.Event(), name="t")
    assert next(items) == 1
    with pytest.raises(ValueError, match="shard 7"):
        next(items)
    with pytest.raises(StopIteration):
        next(items)


def test_stop_ends_the_producer_and_the_items_made_are_still_delivered() -> None:
    stop = threading.Event()

    def endless() -> Iterator[int]:
        i = 0
        while True:
            yield i
            i += 1

    items = Prefetched(endless(), depth=2, stop=stop, name="t")
    assert next(items) == 0
    stop.set()
    rest = list(items)  # ends: no item is made after the stop is seen
    assert rest == list(range(1, 1 + len(rest))) and len(rest) <= 3
    assert not items._thread.is_alive()


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="depth must be >= 1"):
        Prefetched(range(3), depth=0, stop=threading.Event(), name="t")
