"""A real local job started with a poor plan (1 worker, 1 PS): from its first observations its
throughput model (the paper's proportions at the measured speed) proposes more workers, the
trigger applies the plan, and the measured throughput rises where the machine has cores for a
second worker: at least 4, which the machine's other processes leave to the job (on 2 cores
one worker and its PS keep both busy, and a second worker can only take cores from the
first)."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_rover.core.spec import JobSpec
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.triggers.elastic_job import ElasticJobTrigger

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench._machine import CpuMonitor

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OTHER_CORES_FOR_A_RISE = 0.5  # more kept busy by other processes: a rise is not asserted
MIN_CORES_FOR_A_RISE = 4  # fewer: one worker and its PS keep the cores busy already


async def first_event(trigger: ElasticJobTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AssertionError("the trigger ended without an event")


def test_the_trigger_applies_the_optimizers_plan_and_throughput_rises(tmp_path: Path) -> None:
    data = generate_dataset(
        tmp_path / "data", SyntheticConfig(num_train=100_000, num_eval=10_000, seed=5)
    )
    spec = JobSpec.model_validate(
        {
            "job_id": "autoscale",
            "train_data": str(data.train_dir),
            "eval_data": str(data.eval_dir),
            "plan": {"num_ps": 1, "num_workers": 1},
            "training": {"shard_size": 4096, "epochs": 16, "optimizer": "adagrad"},  # ~35 s alone
            "autoscale": {
                "interval_s": 2,
                "sampling_s": 6,
                "min_plan_interval_s": 10,
                "max_workers": 2,
                "cpu_budget": 3,
            },
        }
    )
    hook = ElasticJobHook(tmp_path / "job")
    with CpuMonitor(os.getpid()) as cpu:
        hook.launch(spec)
        try:
            event = asyncio.run(first_event(ElasticJobTrigger(str(tmp_path / "job"), 1.0)))
        finally:
            hook.stop_master_process()
    assert event["status"] == "success", event["message"]
    job = event["job"]
    applied = [p for p in job["plans"] if p["state"] == "applied"]
    assert applied, job["plans"]
    assert applied[0]["rule"] == "pareto"
    assert applied[0]["plan"]["num_workers"] == 2
    assert {n["id"] for n in job["nodes"]} >= {"worker-0", "worker-1"}
    rates: dict[int, list[float]] = {}
    for sample in job["profile"]["throughput"]:
        rates.setdefault(sample["plan"]["num_workers"], []).append(sample["samples_per_second"])
    assert rates.get(2), "no throughput sample under the applied plan"
    before, after = statistics.median(rates[1]), statistics.median(rates[2])
    other = cpu.other_cores()
    print(
        f"throughput 1 worker {before:.0f}, 2 workers {after:.0f} samples/s ({rates}); "
        f"other processes kept {other:.2f} cores busy"
    )
    # One worker and its PS now keep most of two cores busy (bench/throughput.py: one worker
    # trains at 1.0-1.1x the single-process loop), so on two cores a second worker takes
    # cores from the first and the rate falls; a rise needs cores the first plan left free.
    if other <= OTHER_CORES_FOR_A_RISE and (os.cpu_count() or 1) >= MIN_CORES_FOR_A_RISE:
        assert after > before
    assert (
        job["result"]["accounting"]["batches"]["trained_once"]
        == (job["result"]["accounting"]["batches"]["expected"])
    )
