"""A process that the local backend takes for a job's master: its command line names the
master's module and the job directory, and ``master.json`` records its identity. It answers
nothing (its address is whatever the test writes) and sleeps until the test ends it."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from airflow_rover.launchers.keeper import MASTER_PROCESS_MODULE
from airflow_rover.launchers.process_identity import ProcessRecord


@contextlib.contextmanager
def standin_master(job_root: Path) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    """The running process and the ``master.json`` fields (pid, identity) that name it."""
    argv = ["-m", MASTER_PROCESS_MODULE, "--job-dir", str(job_root)]
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", *argv])
    try:
        record = ProcessRecord.of(proc.pid)
        deadline = time.monotonic() + 10
        while not record.cmdline and time.monotonic() < deadline:  # read while it still execs
            time.sleep(0.01)
            record = ProcessRecord.of(proc.pid)
        yield proc, {"pid": proc.pid, "identity": record.to_json()}
    finally:
        proc.kill()
        proc.wait()
