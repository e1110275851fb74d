"""Entry point of the master process: ``python -m airflow_rover.master --job-dir DIR``."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from airflow_rover.core.layout import JobLayout, atomic_write_json
from airflow_rover.core.states import TERMINAL_STATES
from airflow_rover.launchers.local import LocalNodeLauncher
from airflow_rover.master.app import create_app
from airflow_rover.master.service import JobMaster

log = logging.getLogger("airflow_rover.master")
TICK_S = 0.2


class _MasterServer(uvicorn.Server):
    """Stops serving on SIGTERM/SIGINT and returns, without re-raising the signal afterwards
    (uvicorn's default), so the master records the stop and stops its nodes before exiting."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in _STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _supervise(master: JobMaster, server: uvicorn.Server, linger_s: float) -> None:
    """Drive the job until it ends, then stop the nodes and, after ``linger_s``, the API."""
    try:
        while master.state not in TERMINAL_STATES and not server.should_exit:
            master.step()
            time.sleep(TICK_S)
    except Exception as exc:  # the supervisor must never die silently
        log.exception("supervisor crashed")
        master.fail(f"master error: {exc}")
    master.shutdown_nodes()
    deadline = time.time() + linger_s
    while time.time() < deadline and not server.should_exit:
        time.sleep(TICK_S)
    server.should_exit = True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="airflow_rover.master")
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--linger", type=float, default=30.0, help="serve the final status (s)")
    parser.add_argument("--keeper-pid", type=int, default=None, help="the keeper that runs it")
    parser.add_argument("--restarts", type=int, default=0, help="masters that died before it")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    layout = JobLayout(args.job_dir.resolve())
    spec = layout.read_spec()
    token = layout.read_token()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, 0))
    address = f"http://{args.host}:{sock.getsockname()[1]}"

    threads = max(1, int(spec.plan.worker_cpu))
    master = JobMaster(
        layout, spec, LocalNodeLauncher(layout, address, threads), token, args.restarts
    )
    app = create_app(master, token)
    server = _MasterServer(uvicorn.Config(app, log_level="warning", access_log=False))
    master.mirror_state(force=True)
    atomic_write_json(
        layout.master_file,
        {"address": address, "pid": os.getpid(), "keeper_pid": args.keeper_pid},
    )
    log.info("master of job %s listening on %s", spec.job_id, address)

    supervisor = threading.Thread(
        target=_supervise, args=(master, server, args.linger), daemon=True
    )
    supervisor.start()
    server.run(sockets=[sock])  # returns on SIGTERM/SIGINT or when the supervisor is done
    if master.state not in TERMINAL_STATES:
        master.request_stop("master received a stop signal")
    master.shutdown_nodes()
    supervisor.join(timeout=5)


if __name__ == "__main__":
    main()
