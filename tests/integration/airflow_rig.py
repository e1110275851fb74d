"""A real Airflow on a real PostgreSQL server, for end-to-end tests: its scheduler (LocalExecutor),
dag-processor, triggerer and api-server, each started as a process of its own, like a
deployment's.

``running_airflow`` creates two databases on a ``PostgresServer`` (``tests/pg_server.py``):
one for Airflow's metadata (``airflow db migrate`` first) and one for the rover history store
(the cluster budget's registry too), given to tasks as the connection ``rover_history``
(``AIRFLOW_CONN_ROVER_HISTORY``). The DAG folder holds the files a test names. Each component
runs in its own process group with its own log; all are stopped on the way out, whatever
happened, and a component that exits early fails the wait with its log's tail.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pg_server import PostgresServer
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = ("scheduler", "dag-processor", "triggerer", "api-server")
HISTORY_CONN_ID = "rover_history"
STOP_GRACE_S = 20.0
T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class AirflowRig:
    """A running Airflow: its home, the environment every Airflow command must share with it,
    where its databases are, and its components' processes and logs."""

    home: Path
    env: dict[str, str]
    metadata_url: str
    history_url: str
    api_url: str
    say: Callable[[str], None] = print
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    began: float = field(default_factory=time.monotonic)
    _engines: dict[str, Engine] = field(default_factory=dict)

    # -- reading its databases ---------------------------------------------------------------
    def engine(self, url: str) -> Engine:
        if url not in self._engines:
            self._engines[url] = create_engine(url, pool_pre_ping=True, pool_size=2)
        return self._engines[url]

    def query(self, sql: str, url: str | None = None, **params: Any) -> list[dict[str, Any]]:
        """The rows of ``sql`` on the metadata database (or ``url``'s), as dicts."""
        with self.engine(url or self.metadata_url).connect() as conn:
            return [dict(row) for row in conn.execute(text(sql), params).mappings()]

    # -- driving it ---------------------------------------------------------------------------
    def airflow(self, *args: str, timeout: float = 180) -> str:
        """Run ``airflow ARGS`` against this Airflow; its stdout (fails with its output)."""
        done = subprocess.run(
            ["airflow", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise AssertionError(
                f"airflow {' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        return done.stdout

    def log(self, component: str) -> Path:
        return self.home / f"{component}.log"

    def tails(self, chars: int = 4000) -> str:
        """The end of each component's log, for a failure's message."""
        parts = []
        for name in COMPONENTS:
            path = self.log(name)
            body = path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"
            parts.append(f"----- {name} -----\n{body}")
        return "\n".join(parts)

    def check_running(self) -> None:
        """Fail, with the logs, when a component has exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"airflow {name} exited ({proc.returncode}):\n{self.tails()}")

    def wait_for(self, what: str, check: Callable[[], T | None], timeout: float) -> T:
        """``check()``'s first true value, polled every half second while every component
        runs; fails after ``timeout`` seconds with the components' logs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_running()
            value = check()
            if value:
                return value
            time.sleep(0.5)
        raise AssertionError(f"{what}: not within {timeout:.0f} s\n{self.tails()}")

    def wait_parsed(self, dag_id: str, timeout: float = 180) -> None:
        """Until the dag-processor has serialized ``dag_id`` and it is active."""
        sql = (
            "select count(*) as n from dag d join serialized_dag s on s.dag_id = d.dag_id "
            "where d.dag_id = :dag_id and not d.is_stale"
        )
        self.wait_for(
            f"{dag_id} parsed", lambda: self.query(sql, dag_id=dag_id)[0]["n"] > 0, timeout
        )
        self.say(f"{dag_id} parsed: {self.elapsed():.1f} s")

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    # -- starting and stopping ----------------------------------------------------------------
    def start(self, component: str) -> None:
        args = ["api-server", "--port", self.env["AIRFLOW__API__PORT"]]
        with self.log(component).open("ab") as out:
            self.procs[component] = subprocess.Popen(
                ["airflow", *(args if component == "api-server" else [component])],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: it and its children stop together
            )

    def wait_ready(self, timeout: float = 180) -> None:
        """Until the api-server answers its health check and the scheduler, the triggerer
        and the dag-processor have each sent a heartbeat."""

        def healthy() -> bool:
            try:
                reply = httpx.get(f"{self.api_url}/api/v2/monitor/health", timeout=2)
            except httpx.TransportError:
                return False
            return reply.status_code == 200

        self.wait_for("the api-server healthy", healthy, timeout)
        jobs = "select distinct job_type from job where state = 'running'"
        wanted = {"SchedulerJob", "TriggererJob", "DagProcessorJob"}
        self.wait_for(
            "the scheduler, triggerer and dag-processor running",
            lambda: wanted <= {row["job_type"] for row in self.query(jobs)},
            timeout,
        )
        self.say(f"Airflow's components ready: {self.elapsed():.1f} s")

    def stop(self) -> None:
        """SIGTERM to every component's group, then SIGKILL to what is left after a grace;
        each leader is reaped only at the end, so its group id is not reused meanwhile."""
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and not all(_exited(p) for p in self.procs.values()):
            time.sleep(0.2)
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        for engine in self._engines.values():
            engine.dispose()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether ``proc`` (our child) exited, without reaping it."""
    if proc.returncode is not None:
        return True
    return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _env(home: Path, dags: Path, metadata_url: str, history_url: str, port: int) -> dict[str, str]:
    history = history_url.replace("postgresql+psycopg2://", "postgresql://", 1)
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",  # the REST API without login
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        # the scheduler signs the tasks' tokens, the api-server checks them: one secret
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        f"AIRFLOW_CONN_{HISTORY_CONN_ID.upper()}": history,
        "ROVER_HOME": str(home / "rover"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }


@contextlib.contextmanager
def running_airflow(
    server: PostgresServer,
    root: Path,
    dag_files: Sequence[Path],
    say: Callable[[str], None] = print,
) -> Iterator[AirflowRig]:
    """A migrated Airflow on ``server`` under ``root`` whose DAG folder holds copies of
    ``dag_files``, its four components started and ready (see the module docstring)."""
    if importlib.util.find_spec("asyncpg") is None:  # Airflow would fail deep in its start-up
        raise RuntimeError(
            "Airflow on PostgreSQL needs asyncpg for its async engine: pip install -e '.[dev]'"
        )
    began = time.monotonic()
    home, dags = root / "airflow", root / "dags"
    dags.mkdir(parents=True)
    home.mkdir()
    for path in dag_files:
        shutil.copy(path, dags)
    suffix = secrets.token_hex(4)
    metadata_url = server.create_database(f"airflow_{suffix}")
    history_url = server.create_database(f"rover_history_{suffix}")
    port = _free_port()
    env = _env(home, dags, metadata_url, history_url, port)
    rig = AirflowRig(
        home, env, metadata_url, history_url, f"http://127.0.0.1:{port}", say, began=began
    )
    rig.airflow("db", "migrate", timeout=300)
    say(f"airflow db migrate on PostgreSQL: {rig.elapsed():.1f} s")
    try:
        for component in COMPONENTS:
            rig.start(component)
        rig.wait_ready()
        yield rig
    finally:
        rig.stop()
