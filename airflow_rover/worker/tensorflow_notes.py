"""TensorFlow's C++ notes kept out of a task's stderr, which a task log shows as errors.

When TensorFlow is first imported, and when an op fails, it writes notes (oneDNN, CPU
features, a rendezvous aborted) straight to file descriptor 2, past Python's logging.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator

log = logging.getLogger(__name__)

# absl's "I0000 00:00:1795697615.859026    2548 port.cc:153] ...", its preamble, and the line
# that continues TensorFlow's CPU-instructions note.
TENSORFLOW_NOTE = re.compile(
    r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w./-]+:\d+\]"
    r"|WARNING: All log messages before absl::InitializeLog"
    r"|To enable the following instructions: .* rebuild TensorFlow"
)


@contextlib.contextmanager
def tensorflow_stderr_to_debug() -> Iterator[None]:
    """Inside the block, TensorFlow's notes written to file descriptor 2 go to this module's
    debug log; anything else written there is passed on to stderr unchanged, after the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            _pass_on(captured.read().decode(errors="replace"))


def _pass_on(text: str) -> None:
    others = []
    for line in text.splitlines(keepends=True):
        if TENSORFLOW_NOTE.match(line):
            log.debug("tensorflow: %s", line.rstrip())
        elif line.strip():
            others.append(line)
    if others:
        sys.stderr.write("".join(others))
        sys.stderr.flush()
