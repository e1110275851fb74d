"""Warm start end to end: the daily DAG's first run records its job in the history store
(``$AIRFLOW_HOME/rover/history.db``) and the second run warm-starts from it.

The second run asks for 2 workers and 2 PS (its cold-start plan), but the history holds one
run of the same task, model, features and data size that started with 1 worker and 1 PS: warm
start picks that run's final plan and the second training job is launched with it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_rover.core.job_dir import JobDir
from airflow_rover.history.records import MEASURED
from airflow_rover.history.store import HistoryStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TINY = {"num_train": 20_000, "num_eval": 5_000, "epochs": 1, "min_auc": 0.55}


@pytest.fixture(scope="module")
def runs(run_dag, airflow_env):  # type: ignore[no-untyped-def]
    first = run_dag("rover_daily_retrain", "2026-11-10", {**TINY, "num_workers": 1, "num_ps": 1})
    db = Path(airflow_env["AIRFLOW_HOME"]) / "rover" / "history.db"
    with HistoryStore(f"sqlite:///{db}") as store:
        after_first = store.list_jobs()
    second = run_dag("rover_daily_retrain", "2026-11-11", {**TINY, "num_workers": 2, "num_ps": 2})
    with HistoryStore(f"sqlite:///{db}") as store:
        after_second = store.list_jobs()
        first_job = store.get_job(first["xcom"]["train:return_value"]["job_id"])
        second_job = store.get_job(second["xcom"]["train:return_value"]["job_id"])
    return first, second, after_first, after_second, first_job, second_job


def test_both_runs_succeed(runs) -> None:  # type: ignore[no-untyped-def]
    first, second, *_ = runs
    for run in (first, second):
        assert run["state"] == "success", run["tasks"]
        assert all(state == "success" for state, _ in run["tasks"].values()), run["tasks"]


def test_the_first_run_cold_starts_and_its_job_lands_in_the_history(runs) -> None:  # type: ignore[no-untyped-def]
    first, _, after_first, _, job, _ = runs
    warm = first["xcom"]["warm_start:return_value"]
    assert warm["source"] == "cold_start" and warm["matches"] == []
    assert "no similar job" in warm["message"]
    metrics = first["xcom"]["train:return_value"]
    assert [j["job_id"] for j in after_first] == [metrics["job_id"]]
    assert job is not None
    assert (job["dag_id"], job["task_id"], job["outcome"]) == (
        "rover_daily_retrain",
        "train",
        "succeeded",
    )
    assert job["model"] == "wide_deep" and job["dataset_samples"] == TINY["num_train"]
    assert job["samples_trained"] == TINY["num_train"] and job["auc"] == metrics["auc"]
    assert (job["initial_plan"]["num_workers"], job["initial_plan"]["num_ps"]) == (1, 1)
    assert job["final_plan"] == metrics["plan"]  # 1 and 1 unless the autoscaler resized it
    assert job["plans"][0]["state"] == "initial"
    assert {n["node_id"] for n in job["nodes"]} >= {"ps-0", "worker-0"}


def test_the_second_run_warm_starts_from_the_first(runs) -> None:  # type: ignore[no-untyped-def]
    first, second, _, after_second, first_job, second_job = runs
    first_id = first["xcom"]["train:return_value"]["job_id"]
    warm = second["xcom"]["warm_start:return_value"]
    assert warm["source"] == "history", warm["message"]
    assert [m["job_id"] for m in warm["matches"]] == [first_id]
    assert warm["matches"][0]["score"] == pytest.approx(1.0)  # same task, model, data shape
    assert warm["plan"] == first_job["final_plan"]  # one match: its final plan, not the cold 2/2
    assert second_job["initial_plan"] == warm["plan"]  # the train task launched with it
    spec = JobDir(Path(second["xcom"]["train:job_dir"])).read_spec()
    prior = spec.autoscale.prior  # the templated XCom prior, as rendered by Airflow
    print(f"first job measured {[first_job[k] for k in MEASURED]}; prior {warm['prior']}")
    assert (prior.model_dump(mode="json") if prior else None) == warm["prior"]
    assert warm["prior"] is None or warm["prior"]["jobs"] == [first_id]
    metrics = second["xcom"]["train:return_value"]
    assert metrics["samples_trained"] == TINY["num_train"]
    assert {j["job_id"] for j in after_second} == {first_id, metrics["job_id"]}


def test_no_secret_reaches_the_history(runs, airflow_env) -> None:  # type: ignore[no-untyped-def]
    first, second, *_ = runs
    db = (Path(airflow_env["AIRFLOW_HOME"]) / "rover" / "history.db").read_bytes()
    for run in (first, second):
        token = (Path(run["xcom"]["train:job_dir"]) / "token").read_text().strip()
        assert token and token.encode() not in db
