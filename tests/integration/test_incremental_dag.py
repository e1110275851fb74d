"""Daily runs that continue from yesterday's model, under ``dag.test()``.

The fixture DAG ``rover_incremental_test`` (``tests/fixtures/dags/rover_incremental.py``) trains
with ``init_from="previous"``. Day 1 finds no successful run in the history store and trains
from scratch. Day 2 starts from day 1's model (found through the history store: the run and
the model folder its job recorded); while it trains, the test SIGKILLs a worker once a
checkpoint holds finished shards (``max_node_restarts=0``: the try fails), and the retry
resumes from day 2's own checkpoint, not from day 1's model a second time.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dag_runs import end_dag_test, start_dag_test, tail

from airflow_rover.core.job_dir import JobDir
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.history.store import HistoryStore
from airflow_rover.launchers.local_processes import node_processes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FIXTURE_DAGS = REPO / "tests" / "fixtures" / "dags"
DAG_ID = "rover_incremental_test"
DONE_SHARDS_BEFORE_KILL = 2
DAY1 = 20788  # 2026-12-01, days since 1970-01-01: the day rows trained on day 1 record
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def airflow_env(airflow_env: dict[str, str]) -> dict[str, str]:
    """conftest's isolated Airflow, reading DAGs from the test fixtures' folder."""
    return {**airflow_env, "AIRFLOW__CORE__DAGS_FOLDER": str(FIXTURE_DAGS)}


def run_day(
    env: dict[str, str], root: Path, day: str, seed: int, epochs: int, kill: bool
) -> dict[str, Any]:
    """One day's run: its data, its job directory, ``dag.test()``; with ``kill``, a worker is
    killed once a checkpoint holds ``DONE_SHARDS_BEFORE_KILL`` finished shards."""
    data = generate_dataset(
        root / day / "data", SyntheticConfig(num_train=40_000, num_eval=10_000, seed=seed)
    )
    job_dir = root / day / "job"
    layout = JobDir(job_dir)
    out, log_path = root / day / "outcome.json", root / day / "dag_test.log"
    conf = {
        "train_data": str(data.train_dir),
        "eval_data": str(data.eval_dir),
        "job_dir": str(job_dir),
        "epochs": epochs,
    }
    killed: dict[str, Any] | None = None
    proc = start_dag_test(DAG_ID, day, conf, out, log_path, env)
    t0 = time.monotonic()
    try:
        while proc.poll() is None:
            assert time.monotonic() - t0 < RUN_TIMEOUT_S, f"dag.test hung:\n{tail(log_path)}"
            if kill and killed is None:
                killed = kill_a_worker(layout)
            time.sleep(0.1)
    finally:
        end_dag_test(proc, job_dir)
    log_text = log_path.read_text(errors="replace")
    assert proc.returncode == 0 and out.exists(), f"dag.test failed:\n{log_text[-8000:]}"
    outcome = json.loads(out.read_text())
    result = outcome["xcom"].get("train:return_value") or {}
    print(
        f"\n{day}: {round(time.monotonic() - t0, 1)} s, tasks {outcome['tasks']}, kill {killed}, "
        f"started_from={(result.get('recovery') or {}).get('started_from')}, "
        f"auc={result.get('auc')}"
    )
    ps_log = layout.log_file("ps-0").read_text(errors="replace")
    return {**outcome, "log": log_text, "ps_log": ps_log, "killed": killed, "layout": layout}


def kill_a_worker(layout: JobDir) -> dict[str, Any] | None:
    state = layout.read_json(layout.state_file) or {}
    assert state.get("state") != "succeeded", "day 2 finished before a worker could be killed"
    latest = layout.latest_checkpoint()
    queue = layout.read_json(latest / "queue.json") if latest else None
    workers = {n: p for n, p in node_processes(layout).items() if n.startswith("worker-")}
    done = len((queue or {}).get("done", []))
    if state.get("state") != "running" or done < DONE_SHARDS_BEFORE_KILL or not workers:
        return None
    node = sorted(workers)[0]
    workers[node].send_signal(signal.SIGKILL)
    return {"node": node, "checkpoint": latest.name if latest else None}


def model_arrays(folder: Path) -> dict[str, Any]:
    """The last-seen days of a saved model's rows and its dense variables' names."""
    with np.load(folder / "ps-0.npz") as saved:
        days = sorted({int(d) for k in saved.files if k.endswith("/seen") for d in saved[k]})
        dense = sorted(k for k in saved.files if k.startswith("dense/"))
    return {"days": days, "dense": dense}


@pytest.fixture(scope="module")
def days(airflow_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("incremental")
    day1 = run_day(airflow_env, root, "2026-12-01", seed=7, epochs=1, kill=False)
    day2 = run_day(airflow_env, root, "2026-12-02", seed=8, epochs=3, kill=True)
    db = Path(airflow_env["AIRFLOW_HOME"]) / "rover" / "history.db"
    with HistoryStore(f"sqlite:///{db}") as store:
        jobs = store.list_jobs(dag_id=DAG_ID)
    return {"day1": day1, "day2": day2, "jobs": jobs}


def test_day1_finds_no_previous_run_and_trains_from_scratch(days: dict[str, Any]) -> None:
    day1 = days["day1"]
    assert day1["tasks"]["train"] == ["success", 1]
    assert "init_from='previous': no successful run of rover_incremental_test.train" in day1["log"]
    assert day1["xcom"]["train:init_from"] is None
    result = day1["xcom"]["train:return_value"]
    assert result["recovery"]["started_from"] == "scratch"
    assert Path(result["model_folder"]).parent == day1["layout"].saved_models.resolve()


def test_day2_starts_from_day1s_model_found_through_the_history(days: dict[str, Any]) -> None:
    day1, day2 = days["day1"], days["day2"]
    folder = day1["xcom"]["train:return_value"]["model_folder"]
    source = day2["xcom"]["train:init_from"]
    assert source["location"] == folder and source["evict_after_days"] == 30
    job1 = day1["xcom"]["train:return_value"]["job_id"]
    assert f"of rover_incremental_test.train (job {job1})" in source["origin"]
    started = f"Starting from run {day1['run_id']!r} of {DAG_ID}.train (job {job1}): {folder}"
    assert started in day2["log"], day2["log"][-6000:]
    # The first try's PS loaded day 1's rows, the master said where it started from.
    assert f"ps-0 started from {folder}" in day2["ps_log"]
    master_log = day2["layout"].log_file("master").read_text(errors="replace")
    assert f"No checkpoint of this job yet: starting from {folder}" in master_log
    # Day 2's model holds rows last trained on day 1 (carried over) and on day 2, and the
    # same dense variables as day 1's (the workers trained the loaded ones).
    first, second = (
        model_arrays(Path(d["xcom"]["train:return_value"]["model_folder"])) for d in (day1, day2)
    )
    assert set(second["days"]) == {DAY1, DAY1 + 1}, second["days"]
    assert second["dense"] == first["dense"] and first["dense"]


def test_the_retry_of_day2_resumes_its_own_checkpoint_not_day1s_model(
    days: dict[str, Any],
) -> None:
    day2 = days["day2"]
    assert day2["killed"] is not None, "no worker was killed"
    assert day2["state"] == "success" and day2["tasks"]["train"] == ["success", 2]
    result = day2["xcom"]["train:return_value"]
    assert result["recovery"]["started_from"].startswith("checkpoint ")
    assert result["samples_resumed"] > 0
    assert day2["ps_log"].count("started from") == 1, day2["ps_log"][-4000:]  # try 1 only
    restored = r"ps-0 restored (from shared memory: shared memory holds ckpt-|\S*ckpt-)"
    assert re.search(restored, day2["ps_log"]), day2["ps_log"][-4000:]
    outcomes = [(j["run_id"], j["outcome"]) for j in days["jobs"]]
    assert [o for _, o in outcomes] == ["succeeded", "succeeded"], outcomes
