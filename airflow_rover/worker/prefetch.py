"""Items of an iterator produced ahead, on a thread of their own."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar, cast

T = TypeVar("T")

_ITEM, _ERROR, _END = range(3)
_POLL_S = 0.5  # how often a waiting producer looks at ``stop``, a consumer at the producer


class Prefetched(Iterator[T], Generic[T]):
    """``source``'s items, up to ``depth`` of them made ahead on a daemon thread while the
    consumer works on earlier ones. An exception ``source`` raises is raised by the ``next``
    that reaches it. Once ``stop`` is set the producer stops at its next item, and the
    consumer's items end after those already made."""

    def __init__(self, source: Iterable[T], depth: int, stop: threading.Event, name: str) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._queue: queue.Queue[tuple[int, object]] = queue.Queue(depth)
        self._stop = stop
        self._ended = False
        self._thread = threading.Thread(
            target=self._produce, args=(iter(source),), name=name, daemon=True
        )
        self._thread.start()

    def __next__(self) -> T:
        if self._ended:
            raise StopIteration
        while True:
            try:
                kind, value = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():  # stopped, no end put
                    self._ended = True
                    raise StopIteration from None
        if kind == _ITEM:
            return cast(T, value)
        self._ended = True
        if kind == _ERROR:
            assert isinstance(value, BaseException)
            raise value
        raise StopIteration

    def _produce(self, items: Iterator[T]) -> None:
        try:
            for item in items:
                if not self._put((_ITEM, item)):
                    return
        except Exception as exc:  # raised in the consumer, at the item it did not get
            self._put((_ERROR, exc))
            return
        self._put((_END, None))

    def _put(self, entry: tuple[int, object]) -> bool:
        return put_unless_set(self._queue, entry, self._stop, _POLL_S)


Q = TypeVar("Q")


def put_unless_set(items: queue.Queue[Q], item: Q, cancel: threading.Event, poll_s: float) -> bool:
    """Put ``item`` in the bounded queue ``items`` once there is room; False, with nothing
    put, if ``cancel`` is set first (looked at every ``poll_s`` while the queue is full)."""
    while not cancel.is_set():
        try:
            items.put(item, timeout=poll_s)
            return True
        except queue.Full:
            continue
    return False
