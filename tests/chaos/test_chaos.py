"""Real local jobs (3 workers, 2 PS) while a chaos driver SIGKILLs workers, PS and the master.

Every run must finish with every batch applied exactly once on every PS (the PS batch ledgers),
every shard done exactly once, and a held-out AUC within 0.005 of a failure-free run.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from chaos_driver import ChaosDriver, job_processes, wait_for_end

from airflow_rover.core.data_autoscaler import WAIT_HIGH
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.spec import JobSpec
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.launchers.local import LocalBackend

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

KILLS = 10
AUC_TOLERANCE = 0.005
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def job_spec(data: Any, job_id: str, **overrides: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "job_id": job_id,
            "train_data": str(data.train_dir),
            "eval_data": str(data.eval_dir),
            "plan": {"num_ps": 2, "num_workers": 3},
            "training": {
                "shard_size": 2048,
                "batch_size": 256,
                "epochs": 4,
                "optimizer": "adagrad",
                "learning_rate": 0.1,
            },
            "recovery": {
                "checkpoint_interval_s": 2.0,
                "max_node_restarts": 100,
                "max_master_restarts": 20,
            },
            **overrides,
        }
    )


def assert_no_nodes_left(layout: JobDir) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not [n for n in job_processes(layout) if n != "master"]:
            return
        time.sleep(0.5)
    raise AssertionError(f"nodes still running: {sorted(job_processes(layout))}")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return generate_dataset(
        tmp_path_factory.mktemp("chaos-data"),
        SyntheticConfig(num_train=60_000, num_eval=10_000, seed=11),
    )


@pytest.fixture(scope="module")
def failure_free(data: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    layout = JobDir(tmp_path_factory.mktemp("chaos-baseline") / "job")
    launcher = LocalBackend()
    launcher.launch(layout, job_spec(data, "chaos-baseline"))
    try:
        status = wait_for_end(layout)
    finally:
        launcher.stop_master(layout)
    assert status["state"] == "succeeded", status.get("message")
    return status["result"]


ECRM_SETTLE_S = 0.5


def ecrm_training(status: dict[str, Any]) -> bool:
    """Every worker training (past its first step), and no PS rebuilt from parity in the last
    ``ECRM_SETTLE_S``: ECRM recovers one lost PS at a time (a second loss during a rebuild
    fails the try, by design), and each kill here is to be a fresh single loss. A worker that
    has not stepped yet may still be offering its initial weights, where a lost PS ends it
    (``EXIT_PS_LOST``, relaunched): ECRM trains through a loss, not through a start-up."""
    rebuilds = status.get("recovery", {}).get("ecrm_rebuilds", [])
    workers = [n for n in status.get("nodes", []) if n["role"] == "worker"]
    settled = all(
        r["done"] and time.time() - r.get("finished_at", 0) >= ECRM_SETTLE_S for r in rebuilds
    )
    return (
        status.get("state") == "running"
        and settled
        and bool(workers)
        and all(n["state"] == "running" and n.get("steps", 0) > 0 for n in workers)
    )


# Random kills of workers, PS and the master, one case per seed: CI runs one (10 kills);
# ROVER_CHAOS_SEEDS=N runs N for a longer soak.
GENERIC_SEEDS = int(os.environ.get("ROVER_CHAOS_SEEDS", "1"))
CASES = {
    **{f"seed-{seed}": (seed, {}, {}) for seed in range(1, GENERIC_SEEDS + 1)},
    # ECRM: the workers train through each lost PS (``core.ecrm.degraded``) while its replacement is
    # rebuilt from parity; PS (replacements too) are killed while every worker trains (workers
    # and the master are killed in the cases above).
    "ecrm-seed-4": (
        4,
        {
            "plan": {"num_ps": 3, "num_workers": 3},
            "checkpoint": {"policy": "ecrm", "ecrm": {"k": 2}},
        },
        {
            "kills": 4,
            "gap_s": (0.3, 0.8),
            "weights": {"ps": 1.0},
            "may_kill": ecrm_training,
        },
    ),
    # GoldMiner's data workers prepare the trainers' batches (a feature cross as costly as a
    # step): data workers and trainers are killed, and the autoscaler adds data workers as the
    # trainers wait. Another feature set, so its AUC is not the failure-free run's.
    "data-workers-seed-5": (
        5,
        {
            "preprocess": "heavy_preprocess:crossed",
            "data_workers": {"mode": "auto", "min": 1, "max": 3, "count": 1, "interval_s": 2},
        },
        {"kills": 6, "weights": {"data": 0.7, "worker": 0.3}},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_job_survives_random_kills_with_every_batch_trained_once(
    case: str, data: Any, failure_free: dict[str, Any], tmp_path: Path
) -> None:
    seed, overrides, options = CASES[case]
    if "preprocess" in overrides:  # the job's processes import it by path
        os.environ["PYTHONPATH"] = f"{FIXTURES}:{os.environ.get('PYTHONPATH', '')}"
    driver = dict(options)
    kills = driver.pop("kills", KILLS)
    layout = JobDir(tmp_path / "job")
    launcher = LocalBackend()
    launcher.launch(layout, job_spec(data, f"chaos-{seed}", **overrides))
    try:
        report = ChaosDriver(layout, seed=seed, kills=kills, **driver).run(timeout_s=400)
        status = report.status
        assert status["state"] == "succeeded", status.get("message")
        assert_no_nodes_left(layout)
    finally:
        launcher.stop_master(layout)
    result = status["result"]
    summary = {
        "seed": seed,
        "kills": [(k.kind, k.node, k.at_s) for k in report.kills],
        "recovery_s": report.recovery_seconds(),
        "batches": result["accounting"]["batches"],
        "auc": result["auc"],
        "auc_failure_free": failure_free["auc"],
        "master_recovery": result["recovery"],
    }
    print("CHAOS", json.dumps(summary))
    assert len(report.kills) >= kills
    batches = result["accounting"]["batches"]
    assert batches["trained_once"] == batches["expected"] > 0
    assert batches["never_trained"] == batches["partially_trained"] == 0
    accounting = result["accounting"]
    assert accounting["done_once"] == accounting["shards"]
    assert accounting["done_more_than_once"] == accounting["never_done"] == 0
    assert accounting["quarantined"] == []
    assert result["samples_trained"] == 4 * 60_000
    assert np.isfinite(result["logloss"])
    if "data_workers" not in overrides:
        assert abs(result["auc"] - failure_free["auc"]) <= AUC_TOLERANCE
        return
    assert result["auc"] > 0.7
    killed = [k.node for k in report.kills if k.kind == "data"]
    decisions = status["data_workers"]["decisions"]
    section = status["data_workers"]
    print("DATA WORKERS", json.dumps({"killed": killed, **section}))
    assert killed, "no data worker was killed"
    # The autoscaler adds a data worker while the trainers wait for input; on a machine whose
    # trainers are slower than one data worker, they never wait and none is to be added.
    if section["input_wait"] >= WAIT_HIGH:
        assert any(d["count"] > d["previous"] for d in decisions), "no data worker was added"
    assert result["data_workers"]["decisions"] == len(decisions)  # in the XCom result too
    served = [n for n in status["nodes"] if n["role"] == "data"]
    assert sum(n["samples"] for n in served) > 0
