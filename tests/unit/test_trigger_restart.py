"""A triggerer restart in the middle of a REAL job: the job is neither stopped nor launched again,
and the re-created trigger reports its success once it has trained every shard exactly once.

The triggerer runs a trigger as a task iterating ``trigger.run()``; a restart cancels that task
(with no "user action" message, so ``on_kill`` is not called), runs ``cleanup()``, and a triggerer
later re-creates the trigger from ``serialize()`` (classpath + JSON kwargs) in a new event loop.
This test does exactly that against a master with real parameter-server and worker processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import re
import time
from collections import Counter
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any, cast

import psutil
import pytest
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_rover.core.spec import JobSpec, ResourcePlan, TrainingConfig
from airflow_rover.data.synthetic import GeneratedDataset, SyntheticConfig, generate_dataset
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.launchers.local_processes import job_processes
from airflow_rover.triggers.elastic_job import ElasticJobTrigger

pytestmark = pytest.mark.slow

NUM_TRAIN = 6000
SHARD_SIZE = 500
BATCH_SIZE = 100
EPOCHS = 6  # long enough to still be training when the triggerer restarts
NUM_WORKERS = 2
JOB_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> GeneratedDataset:
    config = SyntheticConfig(num_train=NUM_TRAIN, num_eval=1000, seed=3)
    return generate_dataset(tmp_path_factory.mktemp("data"), config)


@pytest.fixture
def hook(tmp_path: Path, dataset: GeneratedDataset) -> Iterator[ElasticJobHook]:
    """A real job launched once; teardown stops it and kills whatever of it is left."""
    hook = ElasticJobHook(tmp_path / "job")
    hook.launch(
        JobSpec(
            job_id="trigger-restart",
            train_data=str(dataset.train_dir),
            eval_data=str(dataset.eval_dir),
            plan=ResourcePlan(num_workers=NUM_WORKERS, num_ps=1),
            training=TrainingConfig(shard_size=SHARD_SIZE, batch_size=BATCH_SIZE, epochs=EPOCHS),
        )
    )
    yield hook
    try:
        hook.stop("test cleanup")
    finally:
        for proc in job_processes(hook.job_dir.root):
            with contextlib.suppress(psutil.Error):
                proc.kill()


def master_log(hook: ElasticJobHook) -> str:
    path = hook.job_dir.log_file("master")
    return path.read_text(errors="replace") if path.exists() else "(no master log)"


async def run_like_the_triggerer(trigger: BaseTrigger, events: list[TriggerEvent]) -> None:
    """What the triggerer's ``run_trigger`` does: iterate ``run()``, collect events, and
    always ``cleanup()`` on the way out (cancellation included)."""
    try:
        async for event in trigger.run():
            events.append(event)
    finally:
        with contextlib.suppress(Exception):
            await trigger.cleanup()


def recreate(serialized: tuple[str, dict[str, Any]]) -> BaseTrigger:
    """A new triggerer's view: the classpath imported afresh, kwargs read back from JSON."""
    classpath, kwargs = serialized
    module_name, class_name = classpath.rsplit(".", 1)
    cls = getattr(importlib.import_module(module_name), class_name)
    trigger: BaseTrigger = cls(**json.loads(json.dumps(kwargs)))
    return trigger


async def first_event(trigger: BaseTrigger, timeout: float) -> TriggerEvent:
    """Run the trigger to its first event (the triggerer hands that one to the task)."""
    events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
    try:
        return await asyncio.wait_for(anext(events), timeout)
    finally:
        await events.aclose()
        await trigger.cleanup()


def test_a_trigger_recreated_after_a_triggerer_restart_sees_the_job_complete_once(
    hook: ElasticJobHook, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cancelled mid-job (plus ``cleanup()``) and re-created from ``serialize()``, the trigger
    neither stops nor relaunches the job, and its successor reports one clean success; the
    job's log lines reach the log through both, each line at most once per trigger."""
    started = time.monotonic()
    job_dir = str(hook.job_dir.root)
    launched = hook.job_dir.master_info()
    assert launched.get("keeper_pid") and launched.get("pid"), launched

    # -- the first triggerer: runs the trigger until the job trains, then restarts ------------
    trigger = ElasticJobTrigger(
        job_dir=job_dir, poll_interval=0.2, stop_on_kill=True, stream_logs=True
    )
    serialized = trigger.serialize()
    before_restart: list[TriggerEvent] = []

    async def first_triggerer() -> dict[str, Any]:
        task = asyncio.create_task(run_like_the_triggerer(trigger, before_restart))
        deadline = time.monotonic() + 120
        while True:
            status = await hook.async_get_status()
            if status["state"] == "running" and status["progress"]["samples_done"] > 0:
                break
            assert status["state"] in {"pending", "running", "unreachable"}, status
            assert not task.done(), before_restart
            assert time.monotonic() < deadline, f"never trained:\n{master_log(hook)[-3000:]}"
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)  # the trigger polls a few more times mid-job
        task.cancel()  # a triggerer shutting down: no "user action" message, no on_kill
        with pytest.raises(asyncio.CancelledError):
            await task
        status = await hook.async_get_status()
        return status

    at_restart = asyncio.run(first_triggerer())
    restart_s = time.monotonic() - started
    assert before_restart == [], "the job ended before the triggerer restarted: make it longer"
    # Neither the cancellation nor cleanup() touched the job: same master, still training.
    assert at_restart["state"] == "running", at_restart
    assert hook.job_dir.master_info() == launched
    assert hook.master_alive()
    samples_at_restart = at_restart["progress"]["samples_done"]
    assert 0 < samples_at_restart < NUM_TRAIN * EPOCHS

    # -- a new triggerer re-creates the trigger from its serialized form ----------------------
    time.sleep(0.5)  # the triggerer is down for a moment; the job trains on
    recreated = recreate(serialized)
    assert isinstance(recreated, ElasticJobTrigger) and recreated is not trigger
    assert recreated.serialize() == serialized
    event = asyncio.run(first_event(recreated, timeout=JOB_TIMEOUT_S)).payload
    total_s = time.monotonic() - started
    print(
        f"\ntrigger restart: restarted at {restart_s:.1f} s ({samples_at_restart} samples "
        f"done), success event at {total_s:.1f} s"
    )

    assert event["status"] == "success", f"{event}\n{master_log(hook)[-3000:]}"
    job = event["job"]
    assert job["state"] == "succeeded" and job["job_id"] == "trigger-restart"

    # -- launched exactly once: one keeper, one master, one start of each node ----------------
    assert hook.job_dir.master_info() == launched
    keeper = hook.job_dir.read_json(hook.job_dir.keeper_file)
    assert keeper is not None
    assert (keeper["pid"], keeper["master_deaths"]) == (launched["keeper_pid"], [])
    log = master_log(hook)
    assert log.count("master of job trigger-restart listening on") == 1, log[-3000:]
    for node in ["ps-0", *(f"worker-{i}" for i in range(NUM_WORKERS))]:
        assert log.count(f"started {node} ") == 1, (node, log[-3000:])

    # -- trained exactly once: every shard once, every batch applied once on the PS -----------
    result = job["result"]
    assert result["samples_trained"] == NUM_TRAIN * EPOCHS
    assert result["samples_resumed"] == 0
    assert result["samples_trained_this_run"] == NUM_TRAIN * EPOCHS
    accounting = result["accounting"]
    batches = accounting.pop("batches")
    shards = EPOCHS * -(-NUM_TRAIN // SHARD_SIZE)
    assert accounting == {
        "shards": shards,
        "done_once": shards,
        "done_more_than_once": 0,
        "never_done": 0,
        "requeued": 0,
        "quarantined": [],
    }
    assert batches == {
        "expected": EPOCHS * (NUM_TRAIN // BATCH_SIZE),
        "trained_once": EPOCHS * (NUM_TRAIN // BATCH_SIZE),
        "never_trained": 0,
        "partially_trained": 0,
        "retried_pushes_turned_away": 0,
    }
    recovery = result["recovery"]
    assert (recovery["restarts"], recovery["master_restarts"], recovery["recoveries"]) == (0, 0, 0)
    assert result["eval_samples"] == 1000

    # -- the job's log lines, streamed by both triggers (structlog writes them to stdout) -----
    out = capsys.readouterr().out
    assert out.count("Passing the new lines of the job's logs") == 2
    streamed = re.findall(
        r"\] (\[(?:master|ps-\d|worker-\d|evaluator)\] .*?) +\[airflow_rover", out
    )
    # each worker's lines were passed on (every worker logs when it is ready); a worker still
    # in its first step when the job ends is stopped before it logs "done", so one "done"
    # line is what is certain
    for worker in (f"worker-{i}" for i in range(NUM_WORKERS)):
        assert any(f"[{worker}] " in line and f" {worker} ready:" in line for line in streamed), (
            worker
        )
    assert any(re.match(r"\[(worker-\d)\] .*\1 done:", line) for line in streamed)
    assert not [line for line in streamed if "HTTP Request:" in line]
    repeated = {line: n for line, n in Counter(streamed).items() if n > 2}
    assert repeated == {}, repeated
    print(f"{len(streamed)} streamed lines, {len(set(streamed))} distinct")
