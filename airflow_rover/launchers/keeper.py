"""The job master's keeper: relaunches a master that died before its job ended.

``python -m airflow_rover.launchers.keeper --job-dir DIR`` runs the master as its child. A master
that exits on its own (code 0, or after a stop request) ends the keeper. A master that dies
(SIGKILL, OOM, crash) while ``state.json`` says the job is not over is relaunched, up to
``recovery.max_master_restarts`` times; the new master resumes from the last checkpoint (its
nodes died with the old one, ``PR_SET_PDEATHSIG``) and the deaths are recorded in
``keeper.json`` for the job's recovery report, beside the keeper's identity (start time and
command line: a stop signals the pid only while they match). SIGTERM to the keeper is passed to
the master, which stops the job and its nodes.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from airflow_rover.core.job_dir import JobDir, atomic_write_json
from airflow_rover.core.states import TERMINAL_STATES, JobState
from airflow_rover.launchers.process_identity import ProcessRecord

log = logging.getLogger("airflow_rover.launchers.keeper")
MASTER_PROCESS_MODULE = "airflow_rover.launchers.master_process"


def _master_cmd(job_dir: Path, restarts: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        MASTER_PROCESS_MODULE,
        "--job-dir",
        str(job_dir),
        "--keeper-pid",
        str(os.getpid()),
        "--restarts",
        str(restarts),
    ]


def keep(job_dir: JobDir) -> int:
    spec = job_dir.read_spec()
    identity = ProcessRecord.current().to_json()
    record: dict[str, Any] = {"pid": os.getpid(), "identity": identity, "master_deaths": []}
    atomic_write_json(job_dir.keeper_file, record)
    stopping = False
    master: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        if master is not None and master.poll() is None:
            master.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    restarts = 0
    while True:
        master = subprocess.Popen(_master_cmd(job_dir.root, restarts), stdin=subprocess.DEVNULL)
        code = master.wait()
        mirrored = job_dir.read_json(job_dir.state_file) or {}
        if stopping or code == 0 or mirrored.get("state") in TERMINAL_STATES:
            return 0 if code == 0 or stopping else code
        died_at = time.time()
        log.error("job master (pid %d) died with code %d", master.pid, code)
        if restarts >= spec.recovery.max_master_restarts:
            atomic_write_json(
                job_dir.state_file,
                {
                    **mirrored,
                    "state": str(JobState.FAILED),
                    "message": (
                        f"job master died {restarts + 1} times (last exit code {code}); "
                        f"recovery.max_master_restarts={spec.recovery.max_master_restarts}; "
                        f"see {job_dir.log_file('master')}"
                    ),
                    "finished_at": died_at,
                },
            )
            return 1
        restarts += 1
        record["master_deaths"].append({"code": code, "died_at": died_at})
        atomic_write_json(job_dir.keeper_file, record)
        log.warning("relaunching the job master (restart %d)", restarts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="airflow_rover.launchers.keeper")
    parser.add_argument("--job-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    sys.exit(keep(JobDir(args.job_dir.resolve())))


if __name__ == "__main__":
    main()
