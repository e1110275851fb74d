"""The example daily-retraining DAG, run by real Airflow on real training processes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMALL = {"num_train": 100_000, "num_eval": 20_000, "num_workers": 2, "num_ps": 2}


@pytest.fixture(scope="module")
def outcome(run_dag):  # type: ignore[no-untyped-def]
    return run_dag("rover_daily_retrain", "2026-11-20", SMALL)


def test_the_dag_run_succeeds_and_the_training_task_really_deferred(outcome) -> None:
    assert outcome["state"] == "success", outcome["tasks"]
    assert all(state == "success" for state, _ in outcome["tasks"].values()), outcome["tasks"]
    log = outcome["log"]
    assert "Pausing task as DEFERRED" in log and "running trigger in line" in log
    assert "ElasticJobTrigger" in log  # the trigger polled the master


def test_every_shard_was_done_exactly_once(outcome) -> None:
    metrics = outcome["xcom"]["train:return_value"]
    accounting = metrics["accounting"]
    assert accounting["shards"] == -(-SMALL["num_train"] // 8192)
    assert accounting["done_once"] == accounting["shards"]
    assert accounting["done_more_than_once"] == 0
    assert accounting["never_done"] == 0
    assert metrics["samples_trained"] == SMALL["num_train"]


def test_the_model_beats_chance_clearly_and_the_metrics_reach_xcom(outcome) -> None:
    metrics = outcome["xcom"]["train:return_value"]
    assert metrics["auc"] >= 0.70
    assert metrics["eval_samples"] == SMALL["num_eval"]
    assert metrics["samples_per_second"] > 0
    assert metrics["plan"]["num_workers"] == 2 and metrics["plan"]["num_ps"] == 2
    assert set(metrics) >= {"job_id", "samples_trained", "train_seconds", "auc", "model_dir"}
    model_dir = Path(metrics["model_dir"])
    assert sorted(p.name for p in model_dir.glob("ps-*.npz")) == ["ps-0.npz", "ps-1.npz"]
    gate = outcome["xcom"]["quality_gate:return_value"]
    assert gate["auc"] == metrics["auc"]
    published = json.loads(Path(outcome["xcom"]["publish_metrics:return_value"]).read_text())
    assert published["auc"] == metrics["auc"]


def test_no_secret_reaches_xcom(outcome) -> None:
    token = (Path(outcome["xcom"]["train:job_dir"]) / "token").read_text().strip()
    assert token and token not in json.dumps(outcome["xcom"])
    assert token not in outcome["log"]


def test_the_task_log_shows_the_nodes_log_lines(outcome) -> None:
    """While the task was deferred, its trigger passed the master's and the workers' log lines
    into the task's log, prefixed by node, without the HTTP client's request lines."""
    log = outcome["log"]
    streamed = [
        line for line in log.splitlines() if re.search(r"\] \[(master|ps-\d|worker-\d)\] ", line)
    ]
    print(f"{len(streamed)} streamed lines, e.g.:", *streamed[:3], *streamed[-3:], sep="\n")
    for worker in ("worker-0", "worker-1"):  # a worker still in its first step when the
        assert re.search(rf"\] \[{worker}\] ", log), worker  # job ends is stopped, not done
    assert re.search(r"\[(worker-\d)\] .* \1 done: \d+ steps", log)
    assert re.search(r"\[master\] .* started worker-0 ", log)
    assert not [line for line in streamed if "HTTP Request:" in line]


def test_a_backfill_of_three_dates_trains_three_independent_models(run_dags, outcome) -> None:
    """Each logical date has its own data, job and model folder; no run touches another's."""
    tiny = {**SMALL, "num_train": 20_000, "num_eval": 5_000, "num_workers": 1, "num_ps": 1}
    tiny["min_auc"] = 0.5  # 40 steps (0.53-0.69 AUC): the gate checks the wiring, not quality
    others = run_dags([("rover_daily_retrain", ds, tiny) for ds in ("2026-11-18", "2026-11-19")])
    runs = [outcome, *others]
    assert [r["state"] for r in runs] == ["success"] * 3
    metrics = [r["xcom"]["train:return_value"] for r in runs]
    dirs = {m["model_dir"] for m in metrics}
    assert len(dirs) == 3 and len({m["job_id"] for m in metrics}) == 3
    assert sorted(Path(d).parent.name for d in dirs) == ["2026-11-18", "2026-11-19", "2026-11-20"]
    assert [m["samples_trained"] for m in metrics] == [100_000, 20_000, 20_000]
