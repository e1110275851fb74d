"""An isolated Airflow (own AIRFLOW_HOME, SQLite metadata DB) for each integration test module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN_DAG = Path(__file__).with_name("run_dag.py")


def _airflow_env(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "ROVER_HOME": str(home / "rover"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }


@pytest.fixture(scope="session")
def migrated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty metadata DB at Airflow's schema, migrated once and copied into each module's
    home (a migration costs seconds per module)."""
    home = tmp_path_factory.mktemp("airflow_template")
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        env=_airflow_env(home),
        check=True,
        capture_output=True,
        timeout=300,
    )
    return home / "airflow.db"


@pytest.fixture(scope="module")
def airflow_env(migrated_db: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("airflow_home")
    shutil.copyfile(migrated_db, home / "airflow.db")
    return _airflow_env(home)


@pytest.fixture(scope="module")
def run_dag(
    airflow_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., dict[str, Any]]:
    """Run a DAG with ``dag.test()`` in a subprocess; returns states and XComs."""

    def run(
        dag_id: str, logical_date: str, conf: dict[str, Any], timeout: int = 600
    ) -> dict[str, Any]:
        out = tmp_path_factory.mktemp("run") / "outcome.json"
        proc = subprocess.run(
            [
                sys.executable,
                str(RUN_DAG),
                dag_id,
                logical_date,
                "--conf",
                json.dumps(conf),
                "--out",
                str(out),
            ],
            env=airflow_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0 or not out.exists():
            raise AssertionError(
                f"dag.test failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n"
                f"{proc.stderr[-6000:]}"
            )
        outcome = json.loads(out.read_text())
        outcome["log"] = proc.stdout + proc.stderr
        return outcome

    return run
