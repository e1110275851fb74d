"""Airflow runs a training task whose batches data workers prepare: ``dag.test()`` on the
fixture DAG ``rover_data_workers_test``, a real local job (two trainers, one PS, data workers
in auto mode from one, a feature cross as the preprocessing). The task succeeds with every
batch trained once, the data workers served batches, and the task's result, the job's status
and the model's card say so."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DAG_ID = "rover_data_workers_test"


@pytest.fixture(scope="module")
def airflow_env(airflow_env: dict[str, str]) -> dict[str, str]:
    """conftest's isolated Airflow, reading DAGs from the fixtures' folder, which also holds
    the preprocessing the job's processes import (``heavy_preprocess.py``)."""
    path = os.pathsep.join(p for p in (str(FIXTURES), airflow_env.get("PYTHONPATH")) if p)
    return {**airflow_env, "AIRFLOW__CORE__DAGS_FOLDER": str(FIXTURES / "dags"), "PYTHONPATH": path}


@pytest.fixture(scope="module")
def outcome(run_dag: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("data-workers")
    data = generate_dataset(root / "data", SyntheticConfig(num_train=8192, num_eval=1024, seed=8))
    conf = {
        "train_data": str(data.train_dir),
        "eval_data": str(data.eval_dir),
        "job_dir": str(root / "job"),
    }
    result: dict[str, Any] = run_dag(DAG_ID, "2026-12-02", conf, timeout=400)
    result["job_dir"] = root / "job"
    return result


def test_the_task_succeeds_with_every_batch_trained_once(outcome: dict[str, Any]) -> None:
    assert outcome["state"] == "success", outcome["log"][-4000:]
    result = outcome["xcom"]["train:return_value"]
    batches = result["accounting"]["batches"]
    assert batches["trained_once"] == batches["expected"] > 0
    assert batches["never_trained"] == batches["partially_trained"] == 0
    assert result["samples_trained"] == 2 * 8192
    assert result["data_workers"]["mode"] == "auto"
    assert 1 <= result["data_workers"]["count"] <= 2
    print(f"\nresult: auc {result['auc']:.4f}, data workers {result['data_workers']}")


def test_the_data_workers_served_the_batches(outcome: dict[str, Any]) -> None:
    status = json.loads((outcome["job_dir"] / "state.json").read_text())
    served = {n["id"]: n["samples"] for n in status["nodes"] if n["role"] == "data"}
    # the trainers prepare batches themselves only until the first data worker is ready
    assert sum(served.values()) >= 2 * 8192 // 2, status["nodes"]
    section = status["data_workers"]
    assert (section["mode"], section["min"], section["max"]) == ("auto", 1, 2)
    print(f"served by data workers: {served}; decisions: {section['decisions']}")


def test_the_model_card_names_the_preprocessing(outcome: dict[str, Any]) -> None:
    card = json.loads((outcome["job_dir"] / "model" / "model.json").read_text())
    assert card["preprocess"] == "heavy_preprocess:crossed"
