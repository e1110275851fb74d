"""Local nodes end with the master that started them, set up by the node itself.

The launcher starts a node without running Python in the forked child (no ``preexec_fn``), so
``subprocess`` can use ``vfork`` and no at-fork handler of the master runs there: gRPC's
handlers, run in a child forked while the master held channels to the PS, could abort it
before its exec. The launcher names itself in ``ROVER_PARENT_PID`` instead, and the node asks
the kernel for SIGTERM when that parent goes (``PR_SET_PDEATHSIG``), then checks it had not
gone already.
"""

from __future__ import annotations

import ctypes
import os
import signal

ENV_PARENT_PID = "ROVER_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def parent_env() -> dict[str, str]:
    """The environment entry that makes a node started by this process die with it."""
    return {ENV_PARENT_PID: str(os.getpid())}


def die_with_parent() -> None:
    """SIGTERM this node when the process in ``ROVER_PARENT_PID`` goes away (or now, if it
    already has). The kernel means the parent *thread*: the launcher starts every node from
    one thread that lives as long as it does. A node started otherwise (a pod) is left alone."""
    parent = os.environ.pop(ENV_PARENT_PID, None)
    if not parent:
        return
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(parent):  # it died before the prctl: nobody would signal us
        os.kill(os.getpid(), signal.SIGTERM)
