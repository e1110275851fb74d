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


@pytest.fixture(scope="module")
def airflow_env(migrated_db: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("airflow_home")
    shutil.copyfile(migrated_db, home / "airflow.db")
    return _airflow_env(home)


def _dag_test(
    env: dict[str, str], out: Path, runs: list[tuple[str, str, dict[str, Any]]], timeout: int
) -> Any:
    """``run_dag.py`` for ``runs`` (the first, then each as ``--then``): the outcome JSON it
    wrote and its log."""
    (dag_id, logical_date, conf), *more = runs
    then = [a for d, date, c in more for a in ("--then", d, date, json.dumps(c))]
    command = [sys.executable, str(RUN_DAG), dag_id, logical_date, "--conf", json.dumps(conf)]
    proc = subprocess.run(
        [*command, *then, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    log = proc.stdout + proc.stderr
    out.with_name("dag_test.log").write_text(log)  # kept with the outcome, to read afterwards
    if proc.returncode != 0 or not out.exists():
        raise AssertionError(
            f"dag.test failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
        )
    return {"outcome": json.loads(out.read_text()), "log": log}


@pytest.fixture(scope="module")
def run_dag(
    airflow_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., dict[str, Any]]:
    """Run a DAG with ``dag.test()`` in a subprocess; returns states and XComs."""

    def run(
        dag_id: str, logical_date: str, conf: dict[str, Any], timeout: int = 600
    ) -> dict[str, Any]:
        out = tmp_path_factory.mktemp("run") / "outcome.json"
        done = _dag_test(airflow_env, out, [(dag_id, logical_date, conf)], timeout)
        outcome: dict[str, Any] = done["outcome"]
        outcome["log"] = done["log"]
        return outcome

    return run


@pytest.fixture(scope="module")
def run_dags(
    airflow_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., list[dict[str, Any]]]:
    """Run several DAG runs, ``[(dag_id, logical_date, conf), ...]``, in order in one
    ``dag.test()`` process (Airflow and TensorFlow are imported once); returns an outcome per
    run, each with the whole process's log under ``log``."""

    def run(
        runs: list[tuple[str, str, dict[str, Any]]], timeout: int = 900
    ) -> list[dict[str, Any]]:
        out = tmp_path_factory.mktemp("runs") / "outcomes.json"
        done = _dag_test(airflow_env, out, runs, timeout)
        outcomes = done["outcome"] if len(runs) > 1 else [done["outcome"]]
        return [{**outcome, "log": done["log"]} for outcome in outcomes]

    return run
