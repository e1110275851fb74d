"""The rig for browser tests: a real api-server (``airflow_ui``) and headless Chromium
(``browser``), one each per test module.

A module chooses what the server loads by overriding two fixtures: ``ui_dags_folder`` (team_a's
DAG bundle; default: ``rig_dags/team_a``) and ``ui_plugins_folder`` (``[core] plugins_folder``;
default: an empty folder). Users and passwords: ``airflow_server.USERS``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow_server import (
    RIG_DAGS,
    TEAM_A,
    AirflowUi,
    airflow_env,
    free_port,
    prepare_home,
    seed,
    start_api_server,
    stop_api_server,
    wait_healthy,
)
from headless_chromium import ensure_chromium, start_browser
from selenium import webdriver

RUN_DAG = Path(__file__).parents[1] / "integration" / "run_dag.py"


@pytest.fixture(scope="module")
def ui_dags_folder() -> Path:
    """team_a's DAG bundle (override in a module to serve other DAGs)."""
    return RIG_DAGS / TEAM_A


@pytest.fixture(scope="module")
def ui_plugins_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``[core] plugins_folder`` (override in a module to load a plugin)."""
    return tmp_path_factory.mktemp("plugins")


@pytest.fixture(scope="module")
def airflow_ui(
    migrated_db: Path,
    ui_dags_folder: Path,
    ui_plugins_folder: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[AirflowUi]:
    """A running ``airflow api-server`` (simple auth manager, multi-team, SQLite) whose DB
    holds the teams and both bundles' DAGs; stopped, with its process group, at the end."""
    home = tmp_path_factory.mktemp("airflow_ui_home")
    port = free_port()
    env = airflow_env(home, port, ui_dags_folder, ui_plugins_folder)
    started = time.monotonic()
    prepare_home(home, migrated_db)
    dag_teams = seed(env)
    seeded = time.monotonic()
    log = home / "api-server.log"
    server = start_api_server(env, log)
    try:
        ui = AirflowUi(env["AIRFLOW__API__BASE_URL"], home, env, log, dag_teams)
        wait_healthy(ui.base_url, server, log)
        up = time.monotonic()
        print(
            f"\nairflow_ui: seeded (teams, DAGs) in {seeded - started:.1f} s, "
            f"api-server up in {up - seeded:.1f} s at {ui.base_url}"
        )
        yield ui
    finally:
        stop_api_server(server)


@pytest.fixture(scope="module")
def ui_run_dag(
    airflow_ui: AirflowUi, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., dict[str, Any]]:
    """Run a DAG with ``dag.test()`` (``tests/integration/run_dag.py``) in a subprocess on the
    api-server's DB, so the UI shows the run; returns its outcome (state, run_id, tasks, xcom)."""

    def run(
        dag_id: str, logical_date: str, conf: dict[str, Any] | None = None, timeout: int = 600
    ) -> dict[str, Any]:
        out = tmp_path_factory.mktemp("ui_run") / "outcome.json"
        command = [sys.executable, str(RUN_DAG), dag_id, logical_date]
        started = time.monotonic()
        done = subprocess.run(
            [*command, "--conf", json.dumps(conf or {}), "--out", str(out)],
            env=airflow_ui.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0 or not out.exists():
            raise AssertionError(
                f"dag.test of {dag_id} failed ({done.returncode}):\n"
                f"{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
            )
        print(f"\nui_run_dag: {dag_id} ran in {time.monotonic() - started:.1f} s")
        outcome: dict[str, Any] = json.loads(out.read_text())
        return outcome

    return run


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    """Paths of Debian's ``chromium`` and ``chromedriver`` (installed as root if missing)."""
    return ensure_chromium()


@pytest.fixture(scope="module")
def browser(chromium: tuple[str, str]) -> Iterator[webdriver.Chrome]:
    """Headless Chromium for the module's tests; each logs in as whom it needs."""
    started = time.monotonic()
    driver = start_browser(*chromium)
    print(f"\nbrowser: Chromium started in {time.monotonic() - started:.1f} s")
    try:
        yield driver
    finally:
        driver.quit()
