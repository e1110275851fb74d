"""TensorFlow's native log lines, logged through Python's ``logging`` at their own level.

TensorFlow's C++ runtime (and absl under it) writes its log straight to file descriptor 2. In
an Airflow task that descriptor is a pipe the task's supervisor reads and logs at ``error``
level, so TensorFlow's notices ("oneDNN custom operations are on", CPU instruction hints)
showed as errors in the task's log. Where the task process imports TensorFlow or builds a model
(the operator's preflight), ``tensorflow_logs_routed`` catches what is written to descriptor 2
meanwhile and logs each line at the level its prefix carries: glog's ``I``/``W``/``E``/``F``
and absl's ``WARNING:`` (logger ``tensorflow.native``); a line TensorFlow is known to continue
one with keeps that line's level, and any other line is logged as an error (logger
``airflow_rover.stderr``: it may be a real one, a user's own). TensorFlow's Python logger,
which adds its own handler on stderr when the root logger has none yet, is made to propagate
to the process's logging instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator

log = logging.getLogger("tensorflow.native")
other = logging.getLogger("airflow_rover.stderr")  # lines written meanwhile, not TensorFlow's

_GLOG = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ \S+:\d+\] ")
_GLOG_LEVELS = {
    "I": logging.INFO,
    "W": logging.WARNING,
    "E": logging.ERROR,
    "F": logging.CRITICAL,
}
_NAMED = re.compile(r"^(INFO|WARNING|ERROR|FATAL):")
# The unprefixed lines TensorFlow continues a log line with (cpu_feature_guard.cc).
_CONTINUED = re.compile(r"^To enable the following instructions: ")


def line_levels(text: str) -> list[tuple[int, str, bool]]:
    """Each non-empty line of ``text``: the level it is logged at (its prefix's, the line's
    before for a known continuation, else ``ERROR``) and whether it is TensorFlow's."""
    out: list[tuple[int, str, bool]] = []
    last = (logging.ERROR, False)  # the line before's level and origin
    for line in text.splitlines():
        if not line.strip():
            continue
        glog, named = _GLOG.match(line), _NAMED.match(line)
        if glog:
            level, ours = _GLOG_LEVELS[glog.group(1)], True
        elif named:
            level, ours = logging.getLevelName(named.group(1).replace("FATAL", "CRITICAL")), True
        else:
            level, ours = last if _CONTINUED.match(line) else (logging.ERROR, False)
        out.append((level, line, ours))
        last = (level, ours)
    return out


def route_python_logger() -> None:
    """Let TensorFlow's Python logger's records reach the process's handlers, not its own
    stream on stderr (it adds one only when the root logger had none when it was made)."""
    tf_log = logging.getLogger("tensorflow")
    for handler in list(tf_log.handlers):
        if isinstance(handler, logging.StreamHandler) and handler.stream in (
            sys.stderr,
            sys.__stderr__,
        ):
            tf_log.removeHandler(handler)
    tf_log.propagate = True


@contextlib.contextmanager
def tensorflow_logs_routed() -> Iterator[None]:
    """Catch what is written to descriptor 2 meanwhile and log it at its own levels.

    A file, not a pipe: nothing has to read while TensorFlow writes, and the lines are logged
    only once descriptor 2 is back, so a handler writing to stderr cannot feed itself.
    """
    with tempfile.TemporaryFile() as caught:
        _flush_stderr()
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            _flush_stderr()
            os.dup2(saved, 2)
            os.close(saved)
            route_python_logger()
            caught.seek(0)
            for level, line, tensorflows in line_levels(caught.read().decode("utf-8", "replace")):
                (log if tensorflows else other).log(level, "%s", line)


def _flush_stderr() -> None:
    if sys.stderr is not None:
        sys.stderr.flush()
