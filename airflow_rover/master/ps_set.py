"""The set of PS the workers train against, and its version: bumped by every PS relaunch and
resize, so a worker learns from its next lease that it must switch (``docs/elastic-scaling.md``).
"""

from __future__ import annotations

import threading

WAITERS = 16  # requests that may wait for a new PS set at once (each holds a server thread)
MAX_WAIT_S = 5.0


class PsSet:
    """The PS set's version, and requests waiting for it to move past one they know."""

    def __init__(self, lock: threading.RLock) -> None:
        self.version = 0
        self._changed = threading.Condition(lock)
        self._waits = threading.BoundedSemaphore(WAITERS)

    def next(self) -> None:
        """The PS changed (a relaunch or a resize): workers switch when they see the version.
        Call with the lock held."""
        self.version += 1
        self._changed.notify_all()

    def may_wait(self) -> bool:
        """A waiting slot, if one is free (``done_waiting`` gives it back)."""
        return self._waits.acquire(blocking=False)

    def done_waiting(self) -> None:
        self._waits.release()

    def wait_past(self, after: int, wait_s: float) -> None:
        """Wait up to ``wait_s`` for a version past ``after``. Call with the lock held."""
        self._changed.wait_for(lambda: self.version > after, wait_s)
