"""Run a job's master: its HTTP API and the supervisor that drives the job to its end.

The backend that runs the master (``airflow_rover.launchers``) says where it listens
(``MasterEndpoint``) and gives it the launcher of its nodes; this module does the rest the same
way for every backend.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI

from airflow_rover.core.job_dir import JobDir, atomic_write_json
from airflow_rover.core.job_tls import JobTLS
from airflow_rover.core.spec import JobSpec
from airflow_rover.core.states import TERMINAL_STATES, JobState
from airflow_rover.master.app import create_app
from airflow_rover.master.job import JobMaster
from airflow_rover.master.node_launcher import NodeLauncher
from airflow_rover.rpc.tls import http_scheme
from airflow_rover.storage import ForeignCheckpoint

log = logging.getLogger("airflow_rover.master")
TICK_S = 0.2
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

LauncherFactory = Callable[[str, threading.Event], NodeLauncher]
"""(the master's address, an event set whenever a node process ends) -> the node launcher."""


@dataclass(frozen=True)
class MasterEndpoint:
    """Where the master listens, the address its nodes and Airflow reach it at (default: the
    one it binds), its bearer token, the job's certificate and key if it serves TLS (then its
    PS do too), and what else it announces in ``master.json``."""

    host: str
    token: str
    port: int = 0  # 0: a free port
    advertise: str | None = None
    announce: dict[str, Any] = field(default_factory=dict)
    tls: JobTLS | None = None


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


def supervise(master: JobMaster, server: uvicorn.Server, linger_s: float) -> None:
    """Drive the job until it ends, then stop the nodes and, after ``linger_s``, the API. A
    tick comes every ``TICK_S``, or at once when ``master.wake`` is set: a node process ended
    or a node is ready (a lost PS is relaunched, and the workers resume against it, without
    waiting out a tick)."""
    try:
        while master.state not in TERMINAL_STATES and not server.should_exit:
            master.wake.clear()
            master.step()
            master.wake.wait(TICK_S)
    except Exception as exc:  # the supervisor must never die silently
        log.exception("supervisor crashed")
        master.fail(f"master error: {exc}")
    master.shutdown_nodes()
    deadline = time.time() + linger_s
    while time.time() < deadline and not server.should_exit:
        time.sleep(TICK_S)
    server.should_exit = True


KEEP_ALIVE_S = 65
"""How long the master keeps an idle connection: longer than its clients do (httpx: 5 s), so
a client never sends on a connection the master is closing at that moment."""


def _server_config(app: FastAPI, tls: JobTLS | None) -> uvicorn.Config:
    """The API's server: HTTPS with the job's certificate where it has one."""
    cert = key = None
    if tls is not None:
        cert, key = str(tls.cert_file), str(tls.key_file)
    return uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        ssl_certfile=cert,
        ssl_keyfile=key,
        timeout_keep_alive=KEEP_ALIVE_S,
    )


def _bind(endpoint: MasterEndpoint) -> tuple[socket.socket, str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((endpoint.host, endpoint.port))
    address = f"{http_scheme(endpoint.tls)}://{endpoint.host}:{sock.getsockname()[1]}"
    return sock, endpoint.advertise or address


def refuse(job_dir: JobDir, spec: JobSpec, message: str) -> None:
    """The job cannot start: its final state says why (the keeper does not relaunch it)."""
    now = time.time()
    state = {"job_id": spec.job_id, "state": str(JobState.FAILED), "message": message}
    atomic_write_json(job_dir.state_file, {**state, "started_at": now, "finished_at": now})


def serve(
    job_dir: JobDir,
    endpoint: MasterEndpoint,
    launcher_for: LauncherFactory,
    restarts: int = 0,
    keeper_pid: int | None = None,
    linger_s: float = 30.0,
) -> None:
    """Serve the job in ``job_dir`` until it ends (or a stop signal), then stop its nodes."""
    spec = job_dir.read_spec()
    sock, address = _bind(endpoint)
    wake = threading.Event()  # a node process ended (local nodes only: pods are polled)
    launcher = launcher_for(address, wake)
    try:
        master = JobMaster(job_dir, spec, launcher, endpoint.token, restarts, wake, endpoint.tls)
    except ForeignCheckpoint as exc:  # ends the job: a relaunch would refuse it again
        log.error("job %s refused: %s", spec.job_id, exc)
        refuse(job_dir, spec, str(exc))
        return
    server = _MasterServer(_server_config(create_app(master, endpoint.token), endpoint.tls))
    master.mirror_state(force=True)
    announced = {"address": address, "pid": os.getpid(), "keeper_pid": keeper_pid}
    atomic_write_json(job_dir.master_file, {**announced, **endpoint.announce})
    log.info("master of job %s listening on %s", spec.job_id, address)
    supervisor = threading.Thread(target=supervise, args=(master, server, linger_s), daemon=True)
    supervisor.start()
    server.run(sockets=[sock])  # returns on SIGTERM/SIGINT or when the supervisor is done
    if master.state not in TERMINAL_STATES:
        master.request_stop("master received a stop signal")
    master.shutdown_nodes()
    supervisor.join(timeout=5)
