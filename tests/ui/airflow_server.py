"""A real ``airflow api-server`` for browser tests: its own AIRFLOW_HOME and SQLite DB, the simple
auth manager in multi-team mode with known users, two DAG bundles owned by two teams."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

RIG_DAGS = Path(__file__).with_name("rig_dags")
SEED = Path(__file__).with_name("seed_teams.py")
TEAM_A, TEAM_B = "team_a", "team_b"
# Each team owns one DAG bundle: team_a's is the folder a test passes, team_b's a tiny one.
BUNDLES = {TEAM_A: "team_a_dags", TEAM_B: "team_b_dags"}


@dataclass(frozen=True)
class UiUser:
    """A simple-auth-manager user: ``role`` is viewer, user, op or admin; ``team`` limits the
    user to the DAGs of that team's bundle (None: an admin, who sees every team)."""

    name: str
    role: str
    team: str | None
    password: str

    @property
    def config_entry(self) -> str:
        """The user as ``[core] simple_auth_manager_users`` spells it."""
        return f"{self.name}:{self.role}" + (f":{self.team}" if self.team else "")


USERS = {
    user.name: user
    for user in (
        UiUser("admin", "admin", None, "admin-pass"),
        UiUser("ops", "user", TEAM_A, "ops-pass"),  # reads and edits team_a's DAGs
        UiUser("viewer", "viewer", TEAM_A, "viewer-pass"),  # reads team_a's DAGs
        UiUser("outsider", "user", TEAM_B, "outsider-pass"),  # none of team_a's DAGs
    )
}


@dataclass
class AirflowUi:
    """A running api-server: where to reach it, the environment Airflow commands must share
    with it (the same home and DB), and which team owns each DAG it knows."""

    base_url: str
    home: Path
    env: dict[str, str]
    log: Path
    dag_teams: dict[str, str | None] = field(default_factory=dict)
    users: dict[str, UiUser] = field(default_factory=lambda: dict(USERS))

    def token(self, user: str) -> str:
        """A JWT for ``user`` from the auth manager's ``POST /auth/token``."""
        account = self.users[user]
        response = httpx.post(
            f"{self.base_url}/auth/token",
            json={"username": account.name, "password": account.password},
            timeout=30,
        )
        response.raise_for_status()
        token: str = response.json()["access_token"]
        return token


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _bundle(team: str, path: Path) -> dict[str, object]:
    return {
        "name": BUNDLES[team],
        "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
        "kwargs": {"path": str(path), "refresh_interval": 0},
        "team_name": team,
    }


def airflow_env(home: Path, port: int, dags: Path, plugins: Path) -> dict[str, str]:
    """The environment of the api-server and of every Airflow command run beside it."""
    bundles = [_bundle(TEAM_A, dags), _bundle(TEAM_B, RIG_DAGS / TEAM_B)]
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins),
        "AIRFLOW__CORE__MULTI_TEAM": "True",
        "AIRFLOW__CORE__AUTH_MANAGER": (
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
            user.config_entry for user in USERS.values()
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "ROVER_HOME": str(home / "rover"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }


def prepare_home(home: Path, migrated_db: Path) -> None:
    """The DB copied from the migrated template and the users' passwords, as the simple auth
    manager reads them (a JSON object, user name to password)."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated_db, home / "airflow.db")
    passwords = {user.name: user.password for user in USERS.values()}
    (home / "passwords.json").write_text(json.dumps(passwords) + "\n")


def seed(env: dict[str, str]) -> dict[str, str | None]:
    """Create the teams and put both bundles' DAGs in the DB; returns each DAG's team."""
    done = subprocess.run(
        [sys.executable, str(SEED), TEAM_A, TEAM_B],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"seeding Airflow failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    teams: dict[str, str | None] = json.loads(done.stdout.strip().splitlines()[-1])
    return teams


def start_api_server(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``airflow api-server`` in its own process group (so it and its workers stop together)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            ["airflow", "api-server", "--port", env["AIRFLOW__API__PORT"]],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_healthy(
    base_url: str, server: subprocess.Popen[bytes], log: Path, timeout: float = 120
) -> None:
    """Until ``/api/v2/monitor/health`` answers 200; fails with the server's log if it exits
    or does not answer in ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"api-server exited ({server.returncode}):\n{_tail(log)}")
        try:
            if httpx.get(f"{base_url}/api/v2/monitor/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"api-server not healthy after {timeout:.0f} s:\n{_tail(log)}")


def stop_api_server(server: subprocess.Popen[bytes], grace: float = 15) -> None:
    """SIGTERM to the server's process group, then SIGKILL to whatever of the group is left.
    The leader is reaped only at the end, so its group id cannot be reused meanwhile."""
    if server.returncode is not None:  # already reaped: only its workers may be left
        _signal_group(server.pid, signal.SIGKILL)
        return
    _signal_group(server.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not _exited(server.pid):
        time.sleep(0.1)
    _signal_group(server.pid, signal.SIGKILL)
    server.wait(timeout=30)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _exited(pid: int) -> bool:
    """Whether ``pid`` (our child) exited, without reaping it."""
    status = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return status is not None


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-6000:] if log.exists() else "(no log)"
