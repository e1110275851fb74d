"""A running job shrunk for a heavier waiting one, on a real local job: the arbiter orders the
light job (weight 0.5, 3 workers) down to its minimum when a job of weight 2 cannot start;
its trigger asks its master for one worker and applies it; the heavy job is then admitted,
and the light job still trains every batch exactly once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_rover.core.cluster_budget import waiting_row
from airflow_rover.core.spec import ClusterBudget, JobSpec, ResourcePlan
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.history.registry import RunningJobRegistry
from airflow_rover.history.store import HistoryStore
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.hooks.history_store import default_history_url
from airflow_rover.triggers.elastic_job import ElasticJobTrigger

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BUDGET = ClusterBudget(name="shrink-test", cpu=5)  # light holds 3 + 1 cores: 1 is left
HEAVY_PLAN = ResourcePlan(num_workers=2, num_ps=1)  # 3 cores


def light_spec(data: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "job_id": "light",
            "train_data": str(data.train_dir),
            "eval_data": str(data.eval_dir),
            "plan": {"num_ps": 1, "num_workers": 3},
            "training": {"shard_size": 2048, "epochs": 8, "seed": 5},
            "autoscale": {"enabled": False, "weight": 0.5, "min_workers": 1},
        }
    )


async def _running_with(hook: ElasticJobHook, workers: int, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = await hook.async_get_status()
        trained = status.get("progress", {}).get("samples_done", 0)
        running = status.get("state") == "running" and trained > 0
        if running and status["plan"]["num_workers"] == workers:
            return
        assert status.get("state") not in ("succeeded", "failed", "stopped"), status
        await asyncio.sleep(0.2)
    raise AssertionError(f"the job did not run with {workers} workers")


def _admit_heavy() -> Any:
    now = time.time()
    heavy = waiting_row("heavy", BUDGET, HEAVY_PLAN, now, waiting_since=now, weight=2.0, ttl_s=600)
    with RunningJobRegistry(HistoryStore(default_history_url())) as registry:
        return registry.admit(heavy, BUDGET, now)


async def scenario(job_dir: Path) -> tuple[Any, Any, dict[str, Any]]:
    hook = ElasticJobHook(job_dir)
    trigger = ElasticJobTrigger(
        str(job_dir), 0.3, cluster_budget=BUDGET.model_dump(mode="json"), stop_on_kill=True
    )

    async def first_event() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("the trigger ended without an event")

    ending = asyncio.ensure_future(first_event())
    await _running_with(hook, 3)
    await asyncio.sleep(1.0)  # the trigger has registered the light job
    waiting = await asyncio.to_thread(_admit_heavy)
    await _running_with(hook, 1)
    # The heavy job asks again on each poll, as its admission trigger does: the light job's
    # trigger holds its smaller plan in the registry just after its master applied it.
    deadline = time.monotonic() + 30
    admitted = await asyncio.to_thread(_admit_heavy)
    while admitted.admitted_plan("heavy") is None and time.monotonic() < deadline:
        await asyncio.sleep(0.3)
        admitted = await asyncio.to_thread(_admit_heavy)
    return waiting, admitted, await ending


def test_a_lighter_job_shrinks_for_a_heavier_waiting_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    data = generate_dataset(
        tmp_path / "data", SyntheticConfig(num_train=30_000, num_eval=4_000, seed=5)
    )
    job_dir = tmp_path / "light"
    hook = ElasticJobHook(job_dir)
    hook.launch(light_spec(data))
    try:
        waiting, admitted, event = asyncio.run(scenario(job_dir))
    finally:
        hook.stop_master_process()

    assert waiting.admitted_plan("heavy") is None
    assert "shrinking light to make room" in waiting.admissions["heavy"].reason
    assert waiting.shrinks["light"].plan.num_workers == 1
    assert admitted.admitted_plan("heavy") == HEAVY_PLAN
    assert event["status"] == "success", event["message"]
    job = event["job"]
    shrunk = [p for p in job["plans"] if p["state"] == "applied"]
    assert [p["plan"]["num_workers"] for p in shrunk] == [1]
    assert "for waiting job 'heavy' of weight 2" in shrunk[0]["reason"]
    batches = job["result"]["accounting"]["batches"]
    assert batches["trained_once"] == batches["expected"], batches
    assert batches["never_trained"] == 0 and batches["partially_trained"] == 0, batches
    with RunningJobRegistry(HistoryStore(default_history_url())) as registry:
        actions = [(d["job_id"], d["action"]) for d in registry.decisions(BUDGET.name)]
    assert ("light", "shrink") in actions
    assert actions[-1] == ("heavy", "admit"), actions
    print(f"decisions: {actions}")
