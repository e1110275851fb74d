"""How a serving node (a PS, a data worker) hears it should stop."""

from __future__ import annotations

import signal
import threading


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set ``stop``, from a thread of their own. A handler runs on the main
    thread between two bytecodes, possibly while that thread holds ``stop``'s lock (inside
    ``stop.wait()``, or inside the ``set`` of a signal before): setting it there deadlocks for
    good. Seen: a PS signalled twice as its master died hung in nested ``set`` calls, orphaned."""

    def handler(_signum: int, _frame: object) -> None:
        threading.Thread(target=stop.set, name="stop", daemon=True).start()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
