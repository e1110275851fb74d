"""The model Asset on a real scheduler: ``airflow standalone`` (scheduler, dag-processor,
triggerer, api-server; LocalExecutor on SQLite) runs a training DAG, and the Asset event its
task emits on success creates a run of ``dags/score_on_new_model.py`` that scores a batch with
the SavedModel; the event's metadata and the score are read from Airflow's database."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
TRAIN_DAG = "rover_asset_train_test"
SCORE_DAG = "rover_score_on_new_model"
MODEL_URI = "x-rover-model://rover_daily_retrain/train"
DEADLINE_S = 540


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def airflow(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A standalone Airflow whose dags folder holds the training fixture and the scoring DAG."""
    home, dags = tmp_path / "home", tmp_path / "dags"
    dags.mkdir(parents=True)
    for name in ("rover_asset_train.py", "fixture_common.py"):  # the DAG and what it imports
        shutil.copy(REPO / "tests" / "fixtures" / "dags" / name, dags)
    shutil.copy(REPO / "dags" / "score_on_new_model.py", dags)
    port = _free_port()
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "ROVER_HOME": str(home / "rover"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}",
    }
    log = (tmp_path / "standalone.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow", "standalone"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own group: stopped as one below
    )
    try:
        yield {"env": env, "db": home / "airflow.db", "log": tmp_path / "standalone.log"}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _query(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    if not db.exists():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:  # tables not migrated yet, or locked for a moment
        return []


def _wait(what: str, check: Any, started: float, log: Path) -> Any:
    while time.monotonic() - started < DEADLINE_S:
        value = check()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"{what}: not within {DEADLINE_S} s\n{log.read_text()[-8000:]}")


def test_a_successful_training_run_triggers_the_scoring_dag_with_its_metadata(
    airflow: dict[str, Any], tmp_path: Path
) -> None:
    started = time.monotonic()
    data = generate_dataset(
        tmp_path / "data", SyntheticConfig(num_train=4_000, num_eval=2_000, seed=4)
    )
    db, log = airflow["db"], airflow["log"]
    parsed = "select count(*) from dag where dag_id in (?, ?) and is_paused = 0"
    _wait(
        "both DAGs parsed", lambda: _query(db, parsed, TRAIN_DAG, SCORE_DAG) == [(2,)], started, log
    )
    print(f"Airflow up, DAGs parsed: {time.monotonic() - started:.1f} s")
    conf = {
        "train_data": str(data.train_dir),
        "eval_data": str(data.eval_dir),
        "job_dir": str(tmp_path / "job"),
    }
    subprocess.run(
        ["airflow", "dags", "trigger", TRAIN_DAG, "--conf", json.dumps(conf)],
        env=airflow["env"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    runs = "select state from dag_run where dag_id = ? and state in ('success', 'failed')"
    train_state = _wait("the training run ended", lambda: _query(db, runs, TRAIN_DAG), started, log)
    print(f"training run ended: {time.monotonic() - started:.1f} s")
    assert train_state == [("success",)], log.read_text()[-8000:]
    score_state = _wait("the scoring run ended", lambda: _query(db, runs, SCORE_DAG), started, log)
    print(f"scoring run ended: {time.monotonic() - started:.1f} s")
    assert score_state == [("success",)], log.read_text()[-8000:]

    (run_type,) = _query(db, "select run_type from dag_run where dag_id = ?", SCORE_DAG)
    assert run_type == ("asset_triggered",)
    events = _query(
        db,
        "select e.extra, e.source_dag_id from asset_event e join asset a on a.id = e.asset_id "
        "where a.uri = ?",
        MODEL_URI,
    )
    assert len(events) == 1 and events[0][1] == TRAIN_DAG
    extra = json.loads(events[0][0])
    folder = (tmp_path / "job" / "model").resolve()
    assert extra["model_uri"] == folder.as_uri()
    assert extra["saved_model_uri"] == (folder / "saved_model").as_uri()
    assert extra["samples_trained"] == 4_000 and extra["eval_samples"] == 2_000
    assert 0.5 < extra["auc"] <= 1.0
    assert extra["eval_data"] == str(data.eval_dir) and extra["run_id"].startswith("manual__")
    consumed = _query(
        db,
        "select count(*) from dagrun_asset_event d join dag_run r on r.id = d.dag_run_id "
        "where r.dag_id = ?",
        SCORE_DAG,
    )
    assert consumed == [(1,)]  # the scoring run was created by that event
    (xcom,) = _query(
        db, "select value from xcom where dag_id = ? and key = 'return_value'", SCORE_DAG
    )
    score = json.loads(xcom[0])
    assert score["model_uri"] == extra["model_uri"] and score["rows"] == 2_000
    assert 0.0 < score["mean_probability"] < 1.0
    assert abs(score["batch_auc"] - extra["auc"]) < 1e-4  # the same rows: the eval split's
    print(f"event extra: {extra}\nscore: {score}\ntotal: {time.monotonic() - started:.1f} s")
