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

from airflow_rover.core.job_dir import ENV_TOKEN_FILE, JobDir, atomic_write_json
from airflow_rover.core.states import TERMINAL_STATES
from airflow_rover.launchers.base import NodeLauncher
from airflow_rover.launchers.kubernetes.config import (
    ENV_LAUNCHER,
    ENV_MASTER_ADVERTISE,
    ENV_MASTER_HOST,
    ENV_MASTER_PORT,
    ENV_NAMESPACE,
    ENV_POD_NAME,
    ENV_POD_UID,
    KubernetesJob,
)
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


def kubernetes_node_launcher(layout: JobDir, restarts: int) -> NodeLauncher:
    """The node launcher of a master running in its pod: in-cluster credentials (the master's
    service account), the job's settings from ``kubernetes.json``, its own pod as the owner of
    the node pods, and its restart count as the incarnation."""
    from kubernetes import client, config

    from airflow_rover.launchers.kubernetes.manifests import JobNames
    from airflow_rover.launchers.kubernetes.nodes import KubernetesNodeLauncher

    job = KubernetesJob.read(layout)
    if job is None:
        raise SystemExit(f"{ENV_LAUNCHER}=kubernetes but {layout.root} has no kubernetes.json")
    missing = [v for v in (ENV_POD_NAME, ENV_POD_UID, ENV_NAMESPACE) if not os.environ.get(v)]
    if missing:
        raise SystemExit(f"the master pod's environment lacks {missing}")
    config.load_incluster_config()
    names = JobNames(layout.read_spec().job_id, os.environ[ENV_NAMESPACE])
    if names.master_pod != os.environ[ENV_POD_NAME]:
        raise SystemExit(f"pod {os.environ[ENV_POD_NAME]} is not {names.master_pod}")
    return KubernetesNodeLauncher(
        client.CoreV1Api(), job.config, names, layout, os.environ[ENV_POD_UID], restarts
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="airflow_rover.master")
    parser.add_argument("--job-dir", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--linger", type=float, default=30.0, help="serve the final status (s)")
    parser.add_argument("--keeper-pid", type=int, default=None, help="the keeper that runs it")
    parser.add_argument("--restarts", type=int, default=0, help="masters that died before it")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    layout = JobDir(args.job_dir.resolve())
    spec = layout.read_spec()
    on_kubernetes = os.environ.get(ENV_LAUNCHER) == "kubernetes"
    token_file = os.environ.get(ENV_TOKEN_FILE) if on_kubernetes else None  # mounted Secret
    token = Path(token_file).read_text().strip() if token_file else layout.read_token()
    host = os.environ.get(ENV_MASTER_HOST, args.host) if on_kubernetes else args.host
    port = int(os.environ.get(ENV_MASTER_PORT, "0")) if on_kubernetes else 0
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    address = f"http://{host}:{sock.getsockname()[1]}"
    if on_kubernetes:  # reached through its Service, not on loopback
        address = os.environ.get(ENV_MASTER_ADVERTISE, address)

    wake = threading.Event()  # a node process ended (local nodes only: pods are polled)
    launcher = (
        kubernetes_node_launcher(layout, args.restarts)
        if on_kubernetes
        else LocalNodeLauncher(layout, address, max(1, int(spec.plan.worker_cpu)), wake)
    )
    master = JobMaster(layout, spec, launcher, token, args.restarts, wake)
    app = create_app(master, token)
    server = _MasterServer(uvicorn.Config(app, log_level="warning", access_log=False))
    master.mirror_state(force=True)
    announced = {"address": address, "pid": os.getpid(), "keeper_pid": args.keeper_pid}
    if on_kubernetes:
        announced["pod"] = os.environ.get(ENV_POD_NAME)
    atomic_write_json(layout.master_file, announced)
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
