"""A shard that kills every worker that trains it (NaN features: the PS rejects its gradients and
the worker dies) is quarantined after ``max_shard_failures`` deaths and reported by id and sample
range; the rest of the job trains exactly once and the job's outcome says what was left out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from chaos_driver import wait_for_end

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.spec import JobSpec
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.launchers.local import LocalBackend

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

SHARD = 2048
POISON_SHARD = 3


def test_a_poison_shard_is_quarantined_and_reported(tmp_path: Path) -> None:
    data = generate_dataset(
        tmp_path / "data", SyntheticConfig(num_train=16_384, num_eval=4_000, seed=3)
    )
    dense = np.load(data.train_dir / "dense.npy", mmap_mode="r+")
    dense[POISON_SHARD * SHARD + 100] = np.nan  # one bad row in one shard
    dense.flush()
    del dense
    spec = JobSpec.model_validate(
        {
            "job_id": "poison",
            "train_data": str(data.train_dir),
            "eval_data": str(data.eval_dir),
            "plan": {"num_ps": 1, "num_workers": 2},
            "training": {"shard_size": SHARD, "batch_size": 256, "optimizer": "adagrad"},
            "recovery": {"max_shard_failures": 3, "max_node_restarts": 10},
        }
    )
    layout = JobDir(tmp_path / "job")
    launcher = LocalBackend()
    launcher.launch(layout, spec)
    try:
        status = wait_for_end(layout, 240.0)
    finally:
        launcher.stop_master(layout)
    assert status["state"] == "succeeded", status.get("message")
    assert "quarantined" in status["message"]
    result = status["result"]
    quarantined = result["accounting"]["quarantined"]
    assert quarantined == [
        {
            "shard_id": POISON_SHARD,
            "epoch": 0,
            "start": POISON_SHARD * SHARD,
            "end": (POISON_SHARD + 1) * SHARD,
            "failures": 3,
        }
    ]
    batches = result["accounting"]["batches"]
    assert batches["expected"] == (16_384 - SHARD) // 256
    assert batches["trained_once"] == batches["expected"]
    assert result["accounting"]["done_once"] == 16_384 // SHARD - 1
    assert result["samples_trained"] == 16_384 - SHARD
    assert result["recovery"]["restarts"] == 3
