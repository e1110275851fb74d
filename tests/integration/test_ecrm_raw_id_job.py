"""A real local job on raw 64-bit ids under ``checkpoint.policy: ecrm``: a PS SIGKILLed while
the workers train is rebuilt from the parity the other PS hold, its raw ids decoded with its
rows, and the job ends with every batch trained once, one row per distinct id, and the
held-out AUC of the same job without the kill."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "chaos"))
from chaos_driver import job_processes, wait_for_end

from airflow_rover.cli import local_job_status, run_job
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.spec import JobSpec
from airflow_rover.core.states import TERMINAL_STATES, JobState
from airflow_rover.data.synthetic_raw_ids import RawIdConfig, write_raw_id_dataset
from airflow_rover.launchers.local import LocalBackend
from airflow_rover.worker.model_folder import read_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONFIG = RawIdConfig(num_train=16_384, num_eval=2048, num_ids=3000, seed=6)
EPOCHS = 4
AUC_TOLERANCE = 0.005


def all_workers_training(status: dict) -> bool:
    """Every worker past its first steps; an ended job fails the test (too late to kill)."""
    assert status.get("state") not in {*TERMINAL_STATES, JobState.EVALUATING}, status["state"]
    workers = [n for n in status.get("nodes", []) if n["role"] == "worker"]
    return (
        status.get("state") == "running"
        and bool(workers)
        and all(n["state"] == "running" and n.get("steps", 0) > 2 for n in workers)
    )


def test_a_killed_ps_of_a_raw_id_job_is_rebuilt_from_parity(tmp_path: Path) -> None:
    data = write_raw_id_dataset(tmp_path / "data", CONFIG)
    spec = JobSpec.model_validate(
        {
            "job_id": "raw-ids-ecrm",
            "train_data": str(data.train_dir),
            "eval_data": str(data.eval_dir),
            "plan": {"num_ps": 3, "num_workers": 2},
            "training": {
                "optimizer": "adagrad",
                "shard_size": 1024,
                "batch_size": 256,
                "epochs": EPOCHS,
                "progress_report_s": 0.2,
            },
            "checkpoint": {"policy": "ecrm", "ecrm": {"k": 2, "rows_per_lock": 512}},
            "recovery": {"standby_ps": True},
        }
    )
    layout = JobDir(tmp_path / "job")
    launcher = LocalBackend()
    launcher.launch(layout, spec)
    try:
        deadline = time.monotonic() + 240
        while not all_workers_training(local_job_status(layout)):
            assert time.monotonic() < deadline, "the workers never trained"
            time.sleep(0.1)
        job_processes(layout)["ps-1"].send_signal(signal.SIGKILL)
        status = wait_for_end(layout, timeout_s=300)
    finally:
        launcher.stop_master(layout)
    assert status["state"] == "succeeded", status.get("message")
    result = status["result"]
    (rebuild,) = result["recovery"]["ecrm_rebuilds"]
    print(f"\nrebuild {rebuild}")
    assert rebuild["node"] == "ps-1" and rebuild["done"] and "error" not in rebuild
    assert rebuild["rows"] > 0
    batches = result["accounting"]["batches"]
    assert batches["trained_once"] == batches["expected"] > 0
    assert batches["never_trained"] == batches["partially_trained"] == 0
    assert result["samples_trained"] == EPOCHS * CONFIG.num_train
    _, groups, _ = read_model((tmp_path / "job" / "model").resolve())
    for group in groups:
        if group.group.index == "ids":  # one row per distinct id, none twice, none lost
            np.testing.assert_array_equal(np.sort(group.ids), data.train_ids)
    unharmed = run_job(spec.model_copy(update={"job_id": "no-kill"}), tmp_path / "no-kill")
    assert unharmed["state"] == "succeeded", unharmed.get("message")
    print(f"AUC {result['auc']:.4f}, without the kill {unharmed['result']['auc']:.4f}")
    assert abs(result["auc"] - unharmed["result"]["auc"]) <= AUC_TOLERANCE
