"""A local job resized several times while it trains (PS 1 -> 2 -> 3 -> 1 -> 2, workers 1 -> 2 ->
1 -> 2) through plans the trigger applies: every batch is trained exactly once, the held-out AUC
stays within 0.005 of the same job unscaled, and no PS change stops training for long."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_rover.core.spec import JobSpec
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.triggers.elastic_job import ElasticJobTrigger

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS = ({"num_ps": 2, "num_workers": 2}, {"num_ps": 3}, {"num_ps": 1, "num_workers": 1},
         {"num_ps": 2, "num_workers": 2})  # fmt: skip


def spec_for(data: Any, job_id: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "job_id": job_id,
            "train_data": str(data.train_dir),
            "eval_data": str(data.eval_dir),
            "plan": {"num_ps": 1, "num_workers": 1},
            "training": {"shard_size": 2048, "epochs": 10, "optimizer": "adagrad", "seed": 3},
            "autoscale": {"enabled": False},
            "recovery": {"checkpoint_interval_s": 3},
        }
    )


async def run_job(job_dir: Path, resize: bool) -> dict[str, Any]:
    """The trigger polls the job to its end; meanwhile (``resize``) each step is requested once
    the previous one is applied and the job has trained on under it."""
    trigger = asyncio.ensure_future(_first_event(ElasticJobTrigger(str(job_dir), 0.5)))
    hook = ElasticJobHook(job_dir)
    if resize:
        for step in STEPS:
            await _trained_more(hook, 8192)
            record = await asyncio.to_thread(hook.request_plan, reason=f"test: {step}", **step)
            await _applied(hook, record.id)
    return await trigger


async def _first_event(trigger: ElasticJobTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AssertionError("the trigger ended without an event")


async def _trained_more(hook: ElasticJobHook, samples: int, timeout_s: float = 300) -> None:
    start: int | None = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = await hook.async_get_status()
        done = sum(n["samples"] for n in status.get("nodes", []) if n["role"] == "worker")
        if status.get("state") == "running":
            start = done if start is None else start
            if done - start >= samples:
                return
        await asyncio.sleep(0.3)
    raise AssertionError("the job did not train on")


async def _applied(hook: ElasticJobHook, plan_id: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = await hook.async_get_status()
        record = next(p for p in status["plans"] if p["id"] == plan_id)
        if record["state"] == "applied":
            return
        assert record["state"] in ("proposed", "applying"), record
        await asyncio.sleep(0.2)
    raise AssertionError(f"plan {plan_id} was not applied")


def test_a_job_resized_up_and_down_trains_every_batch_once(tmp_path: Path) -> None:
    data = generate_dataset(
        tmp_path / "data", SyntheticConfig(num_train=60_000, num_eval=20_000, seed=11)
    )
    results = {}
    for name, resize in (("unscaled", False), ("resized", True)):
        job_dir = tmp_path / name
        hook = ElasticJobHook(job_dir)
        hook.launch(spec_for(data, name))
        try:
            event = asyncio.run(run_job(job_dir, resize))
        finally:
            hook.stop_master_process()
        assert event["status"] == "success", event["message"]
        results[name] = event["job"]

    job = results["resized"]
    applied = [p for p in job["plans"] if p["state"] == "applied"]
    assert [p["plan"]["num_ps"] for p in applied] == [2, 3, 1, 2]
    assert job["plan"]["num_ps"] == 2 and job["plan"]["num_workers"] == 2
    batches = job["result"]["accounting"]["batches"]
    assert batches["trained_once"] == batches["expected"], batches
    assert batches["never_trained"] == 0 and batches["partially_trained"] == 0, batches
    pauses = [p["pause_s"] for p in applied if "pause_s" in p]
    moved = [p["moved_rows"] for p in applied if "moved_rows" in p]
    auc, base = job["result"]["auc"], results["unscaled"]["result"]["auc"]
    print(f"AUC resized {auc:.5f} vs unscaled {base:.5f}; PS pauses {pauses} s; moved {moved}")
    assert abs(auc - base) <= 0.005
    assert len(pauses) == 4 and all(m > 0 for m in moved)
