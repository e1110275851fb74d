"""A PS stops on SIGTERM however the signals land: twice in a row, or while the main thread
holds the stop event's lock (it does inside ``stop.wait()``). Setting the event from the
handler itself deadlocked the main thread there, and the PS was left running, orphaned."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading
    from airflow_rover.core.stop_signals import stop_on_signals

    stop = threading.Event()
    stop_on_signals(stop)
    with stop._cond:  # the main thread holds the event's lock, as inside stop.wait()
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # and a second signal while the first is handled
        for _ in range(1000):  # bytecodes: the handlers run here, on this thread
            pass
    sys.exit(0 if stop.wait(10) else 3)
    """
)


def test_sigterm_stops_a_ps_while_its_main_thread_holds_the_stop_lock() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], timeout=60, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
