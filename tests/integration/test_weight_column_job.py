"""The weight column really weights training: on a real local job (one worker, one PS, the
same seed), rows of weight 0 give the same model as the same files without those rows."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_rover.cli import run_job
from airflow_rover.core.spec import JobSpec
from airflow_rover.data.reader import NpyColumnsReader
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.data.synthetic_files import parquet_schema

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS, BATCH, SHARD = 4096, 256, 1024  # shards a whole number of batches


def _write(split: Path, out: Path, keep: np.ndarray, weight: np.ndarray) -> Path:
    reader = NpyColumnsReader(split)
    batch = reader.read(0, reader.num_samples)
    columns: dict[str, Any] = {"label": batch.label, "w": weight}
    columns |= {f"I{j + 1}": batch.dense[:, j] for j in range(batch.dense.shape[1])}
    columns |= {f"C{j + 1}": batch.categorical[:, j] for j in range(batch.categorical.shape[1])}
    out.mkdir(parents=True)
    table = pa.table({name: np.asarray(values)[keep] for name, values in columns.items()})
    pq.write_table(table, out / "part-0.parquet", row_group_size=SHARD)
    return out


def _auc(train: Path, held_out: Path, schema: dict[str, Any], job_dir: Path) -> float:
    spec = JobSpec.model_validate(
        {
            "job_id": f"weights-{job_dir.name}",
            "train_data": str(train),
            "eval_data": str(held_out),
            "data_schema": schema,
            "plan": {"num_workers": 1, "num_ps": 1},
            "training": {
                "optimizer": "adagrad",  # a zero gradient leaves a row as it is
                "shard_size": SHARD,
                "batch_size": BATCH,
                "epochs": 2,
                "seed": 3,
            },
        }
    )
    started = time.perf_counter()
    status = run_job(spec, job_dir, poll_s=0.5, quiet=True)
    print(f"\n{job_dir.name}: {time.perf_counter() - started:.1f} s")
    assert status["state"] == "succeeded", status.get("message")
    return float(status["result"]["auc"])


def test_zero_weights_train_as_the_rows_left_out(tmp_path: Path) -> None:
    """Every fourth batch weighs 0: its rows are read, hashed and their embedding rows pulled,
    but the model is the one trained on the other rows alone (the AUCs equal to the bit).
    The other rows' weights vary, and are the same in both datasets."""
    data = generate_dataset(
        tmp_path / "npy", SyntheticConfig(num_train=ROWS, num_eval=1024, seed=6)
    )
    rng = np.random.default_rng(7)
    weight = (rng.random(ROWS) * 1.5 + 0.25).astype(np.float32)
    zeroed = (np.arange(ROWS) // BATCH) % 4 == 1
    weight[zeroed] = 0.0
    everything = np.ones(ROWS, bool)
    schema = parquet_schema(data.train_dir, string_ids=False).model_dump() | {"weight": "w"}
    held_out = _write(data.eval_dir, tmp_path / "eval", np.ones(1024, bool), np.ones(1024))
    weighted = _write(data.train_dir, tmp_path / "weighted", everything, weight)
    left_out = _write(data.train_dir, tmp_path / "left_out", ~zeroed, weight)
    auc_weighted = _auc(weighted, held_out, schema, tmp_path / "job-weighted")
    auc_left_out = _auc(left_out, held_out, schema, tmp_path / "job-left-out")
    print(f"held-out AUC: zero weights {auc_weighted:.6f}, rows left out {auc_left_out:.6f}")
    assert auc_weighted == auc_left_out
