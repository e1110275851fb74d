"""The master process: ``python -m airflow_rover.launchers.master_process --job-dir DIR``.

Its keeper (``launchers.keeper``) runs it. The job directory's backend says where the master
listens and gives it the launcher of its nodes; ``master.serve`` does the rest.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from pathlib import Path

from airflow_rover.core.job_dir import JobDir
from airflow_rover.data.offset_index import ENV_INDEX_DIR, job_index_dir
from airflow_rover.launchers.backends import backend_for
from airflow_rover.master.node_launcher import NodeLauncher
from airflow_rover.master.serve import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="airflow_rover.launchers.master_process")
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--linger", type=float, default=30.0, help="serve the final status (s)")
    parser.add_argument("--keeper-pid", type=int, default=None, help="the keeper that runs it")
    parser.add_argument("--restarts", type=int, default=0, help="masters that died before it")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    job_dir = JobDir(args.job_dir.resolve())
    # Where the master and its nodes keep the offset indexes of data that cannot hold them
    os.environ.setdefault(ENV_INDEX_DIR, str(job_index_dir(job_dir.root)))
    backend = backend_for(job_dir)

    def launcher_for(address: str, exited: threading.Event) -> NodeLauncher:
        return backend.node_launcher(job_dir, address, args.restarts, exited)

    serve(
        job_dir,
        backend.master_endpoint(job_dir, args.host),
        launcher_for,
        args.restarts,
        args.keeper_pid,
        args.linger,
    )


if __name__ == "__main__":
    main()
