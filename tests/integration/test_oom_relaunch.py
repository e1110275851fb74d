"""A worker that outgrows its memory on the local backend: the launcher's memory watch kills
it (``OOMKilled``), the master relaunches it once with twice the memory, the plan history
says so (rule ``oom``) and the job trains every batch."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_rover.cli import run_job
from airflow_rover.core.spec import JobSpec, ResourcePlan, TrainingConfig
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset

pytestmark = [pytest.mark.integration, pytest.mark.slow]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WORKER_MB = 1024  # the worker's size: below the ballast, so its first life dies
BALLAST_MB = 1400  # what the worker grows to; below twice its size, so its second life lives


def test_a_worker_killed_out_of_memory_comes_back_with_twice_the_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = generate_dataset(tmp_path / "data", SyntheticConfig(num_train=2000, num_eval=100))
    monkeypatch.setenv("PYTHONPATH", f"{FIXTURES}:{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setenv("ROVER_TEST_BALLAST_MB", str(BALLAST_MB))
    spec = JobSpec(
        job_id="oom-test",
        train_data=str(data.train_dir),
        preprocess="memory_hog:ballast",
        plan=ResourcePlan(num_workers=1, num_ps=1, worker_memory_mb=WORKER_MB),
        training=TrainingConfig(shard_size=500, batch_size=100),
    )
    status = run_job(spec, tmp_path / "job", poll_s=0.5, quiet=True)
    assert status["state"] == "succeeded", status.get("message")
    oom = [p for p in status["plans"] if p.get("rule") == "oom"]
    assert len(oom) == 1 and oom[0]["state"] == "applied", status["plans"]
    assert (
        "worker-0 was killed out of memory at 1024 MB: relaunched with 2048 MB"
        in (oom[0]["reason"])
    )
    final = ResourcePlan.model_validate(status["plan"])
    assert final.size_of("worker-0") == (1.0, 2 * WORKER_MB)
    assert final.size_of("ps-0") == (1.0, 2048)  # the PS as it was
    assert status["recovery"]["restarts"] == 1
    log = (tmp_path / "job" / "logs" / "worker-0.log").read_text()
    killed = [line for line in log.splitlines() if "killed out of memory (OOMKilled)" in line]
    assert len(killed) == 1, log[-2000:]
    print(killed[0])
    accounting = status["result"]["accounting"]
    assert accounting["done_once"] == accounting["shards"]
