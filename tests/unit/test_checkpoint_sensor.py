"""``CheckpointSensor`` and ``CheckpointTrigger``: wait for a durable checkpoint at or past N
samples, in a job's own directory (written on disk as the master commits checkpoints) or in S3
(moto's server on loopback, one process per module). No Airflow database: the sensor is driven
through ``execute`` (``TaskDeferred``), the trigger through ``run()`` as the triggerer drives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowSensorTimeout,
    AirflowSkipException,
    TaskDeferred,
)
from airflow.triggers.base import TriggerEvent
from moto_server import (
    SECRET_KEY,
    commit_checkpoint,
    connection_env,
    moto_server,
    new_bucket,
    trained_ps,
)
from standin_master import standin_master

from airflow_rover.core.checkpoint_files import read_manifest
from airflow_rover.core.job_dir import JobDir, atomic_write_json
from airflow_rover.hooks.checkpoint_store import CheckpointStoreHook
from airflow_rover.ps.server import ParameterServer
from airflow_rover.sensors.checkpoint import CheckpointSensor
from airflow_rover.storage import LocalStore, upload_checkpoint
from airflow_rover.triggers.checkpoint import CheckpointTrigger, check_checkpoint

EVENT_KEYS = {"status", "job_id", "message", "checkpoint"}
XCOM_KEYS = {
    "name",
    "number",
    "uri",
    "samples",
    "samples_total",
    "checksums",
    "bytes",
    "manifest_sha256",
    "job_id",
}


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture(scope="module")
def pss() -> list[ParameterServer]:
    return [trained_ps(i, 2) for i in range(2)]


@pytest.fixture(scope="module")
def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


RunningJob = Callable[[Path], JobDir]


@pytest.fixture
def running_job() -> Iterator[RunningJob]:
    """Makes a job whose master process lives (a stand-in) and mirrors 'running'."""
    with contextlib.ExitStack() as masters:

        def make(root: Path) -> JobDir:
            layout = JobDir(root)
            layout.ensure_token()
            _, named = masters.enter_context(standin_master(root))
            atomic_write_json(layout.master_file, named)
            atomic_write_json(layout.state_file, job_state("running"))
            return layout

        yield make


def job_state(state: str, **extra: Any) -> dict[str, Any]:
    return {"job_id": "rover-job-7", "state": state, "message": f"job {state}", **extra}


def end_job(layout: JobDir, state: str, dead_pid: int, finished_at: float) -> None:
    atomic_write_json(layout.master_file, {"pid": dead_pid})
    atomic_write_json(layout.state_file, job_state(state, finished_at=finished_at))


def first_event(trigger: CheckpointTrigger, timeout: float = 20.0, during: Any = None) -> Any:
    """Run the trigger as the triggerer does until its first event (running ``during``, an
    async callable, beside it); returns the payload, checked to be plain JSON."""

    async def go() -> Any:
        events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
        side = asyncio.create_task(during()) if during is not None else None
        try:
            return await asyncio.wait_for(anext(events), timeout)
        finally:
            await events.aclose()
            if side is not None:
                await side

    payload: dict[str, Any] = asyncio.run(go()).payload
    assert set(payload) == EVENT_KEYS
    assert json.loads(json.dumps(payload)) == payload
    return payload


def recreated(trigger: CheckpointTrigger) -> CheckpointTrigger:
    """The trigger as a triggerer re-creates it after a restart: classpath + JSON kwargs."""
    classpath, kwargs = trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    again: CheckpointTrigger = cls(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)
    return again


# -- the trigger -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_samples": 0, "job_dir": "/jobs/a"},
        {"min_samples": 5000, "checkpoint_uri": "s3://b/p", "aws_conn_id": "aws_default"},
        {"min_samples": 1, "job_dir": "/j", "checkpoint_uri": "file:///c", "deadline": 1e9},
    ],
    ids=["job-dir", "s3", "both"],
)
def test_serialize_recreates_an_equal_trigger(kwargs: dict[str, Any]) -> None:
    trigger = CheckpointTrigger(poll_interval=2.5, **kwargs)
    _, serialized = trigger.serialize()
    assert {k: v for k, v in serialized.items() if v is not None} == {
        "poll_interval": 2.5,
        **kwargs,
    }
    recreated(trigger)


def test_waits_in_the_job_dir_until_a_checkpoint_holds_enough_samples(
    tmp_path: Path, pss: list[ParameterServer], running_job: RunningJob
) -> None:
    """A running job's first checkpoint is short of ``min_samples``; the trigger polls until
    the next one (committed while it waits) reaches it, and names it with its checksums."""
    layout = running_job(tmp_path / "job")
    commit_checkpoint(layout, 1, done_shards=2, pss=pss)  # 1000 samples

    async def train_on() -> None:
        await asyncio.sleep(0.4)
        await asyncio.to_thread(commit_checkpoint, layout, 2, 9, pss)  # 4500 samples

    trigger = recreated(CheckpointTrigger(4000, job_dir=str(layout.root), poll_interval=0.05))
    started = time.monotonic()
    event = first_event(trigger, during=train_on)
    assert time.monotonic() - started >= 0.4
    assert event["status"] == "success"
    assert event["job_id"] == "rover-job-7"
    directory = layout.checkpoint_dir(2)
    manifest = read_manifest(directory)
    checkpoint = event["checkpoint"]
    assert checkpoint["name"] == "ckpt-000002"
    assert checkpoint["uri"] == directory.as_uri()
    assert (checkpoint["samples"], checkpoint["samples_total"]) == (4500, 10_000)
    assert checkpoint["checksums"] == {n: d.sha256 for n, d in manifest.items()}


def test_a_job_that_ended_short_fails_the_wait(
    tmp_path: Path, pss: list[ParameterServer], dead_pid: int, running_job: RunningJob
) -> None:
    layout = running_job(tmp_path / "job")
    commit_checkpoint(layout, 1, done_shards=3, pss=pss)
    end_job(layout, "failed", dead_pid, finished_at=time.time())
    event = first_event(CheckpointTrigger(9000, job_dir=str(layout.root), poll_interval=0.05))
    assert event["status"] == "failed"
    assert event["checkpoint"] is None
    assert event["message"].startswith("job rover-job-7 ended (failed: job failed) without ")
    assert "at or past 9000 samples" in event["message"]
    assert "newest ckpt-000001 with 1500 samples" in event["message"]


def test_a_succeeded_job_whose_last_checkpoint_is_enough_succeeds(
    tmp_path: Path, pss: list[ParameterServer], dead_pid: int, running_job: RunningJob
) -> None:
    """The end-of-training checkpoint is committed before the job's terminal state."""
    layout = running_job(tmp_path / "job")
    commit_checkpoint(layout, 4, done_shards=20, pss=pss)
    end_job(layout, "succeeded", dead_pid, finished_at=time.time())
    event = first_event(CheckpointTrigger(10_000, job_dir=str(layout.root), poll_interval=0.05))
    assert (event["status"], event["checkpoint"]["name"]) == ("success", "ckpt-000004")


def test_the_deadline_times_the_wait_out(tmp_path: Path, running_job: RunningJob) -> None:
    layout = running_job(tmp_path / "job")  # no checkpoint yet
    trigger = CheckpointTrigger(1, job_dir=str(layout.root), deadline=time.time() + 0.3)
    started = time.monotonic()
    event = first_event(recreated(trigger))
    assert 0.25 <= time.monotonic() - started < 5
    assert event["status"] == "timeout"
    assert "no checkpoint at or past 1 samples" in event["message"]


def test_a_remote_store_gets_a_grace_period_for_the_last_upload(
    tmp_path: Path, pss: list[ParameterServer]
) -> None:
    """A job just ended may still be uploading its last checkpoint: wait ``grace_s`` after
    its ``finished_at`` before calling the wait failed."""
    store = LocalStore(tmp_path / "durable")
    ended = job_state("succeeded", finished_at=1000.0)
    assert check_checkpoint(store, 1, ended, grace_s=120, now=1100.0) is None
    failed = check_checkpoint(store, 1, ended, grace_s=120, now=1121.0)
    assert failed is not None and failed["status"] == "failed"
    assert "(no checkpoint)" in failed["message"]


def test_an_unreadable_store_is_an_error_event(s3_endpoint: str, monkeypatch: Any) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_ROVER_S3", connection_env(s3_endpoint))
    trigger = CheckpointTrigger(
        1, checkpoint_uri="s3://rover-missing-bucket/x", aws_conn_id="rover_s3"
    )
    event = first_event(trigger)
    assert event["status"] == "error"
    assert event["message"].startswith("StorageError: s3://rover-missing-bucket/")
    assert "NoSuchBucket" in event["message"]


def test_waits_for_a_checkpoint_in_s3(
    s3_endpoint: str, monkeypatch: Any, tmp_path: Path, pss: list[ParameterServer], caplog: Any
) -> None:
    """The S3 case end to end: uploaded by ``upload_checkpoint``, found by the trigger with
    the connection's credentials, none of which reach the event or the logs."""
    monkeypatch.setenv("AIRFLOW_CONN_ROVER_S3", connection_env(s3_endpoint))
    bucket = new_bucket(s3_endpoint)
    uri = f"s3://{bucket}/jobs/7"
    store = CheckpointStoreHook("rover_s3").get_store(uri)
    layout = JobDir(tmp_path / "job")
    upload_checkpoint(commit_checkpoint(layout, 1, 2, pss), store)

    async def upload_later() -> None:
        await asyncio.sleep(0.3)
        directory = await asyncio.to_thread(commit_checkpoint, layout, 2, 6, pss)
        await asyncio.to_thread(upload_checkpoint, directory, store)

    trigger = CheckpointTrigger(
        3000, checkpoint_uri=uri, aws_conn_id="rover_s3", poll_interval=0.05
    )
    event = first_event(recreated(trigger), during=upload_later)
    assert event["status"] == "success"
    assert event["checkpoint"]["uri"] == f"{uri}/ckpt-000002"
    assert event["checkpoint"]["samples"] == 3000
    assert event["job_id"] is None
    assert SECRET_KEY not in json.dumps(event) + json.dumps(trigger.serialize()) + caplog.text


# -- the sensor --------------------------------------------------------------------------------
def sensor(**kwargs: Any) -> CheckpointSensor:
    return CheckpointSensor(task_id="wait_ckpt", poke_interval=0.05, timeout=60, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_samples": 1}, "give job_dir (the job's own checkpoints) or checkpoint_uri"),
        (
            {"min_samples": 1, "checkpoint_uri": "ftp://x"},
            "checkpoint_uri='ftp://x': unsupported scheme 'ftp'; accepted: file:///path (or a "
            "plain path), s3://bucket/prefix",
        ),
        ({"min_samples": -1, "job_dir": "/j"}, "min_samples=-1: accepted: an integer >= 0"),
        ({"min_samples": "many", "job_dir": "/j"}, "min_samples='many': accepted: an integer"),
        ({"min_samples": 1, "job_dir": ""}, "job_dir='': accepted: a non-empty string"),
    ],
)
def test_bad_arguments_fail_at_parse_time(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        sensor(**kwargs)
    assert str(info.value).startswith("CheckpointSensor(task_id='wait_ckpt'): ")
    assert message in str(info.value)


def test_execute_defers_and_resumes_with_the_checkpoint(
    tmp_path: Path, pss: list[ParameterServer], running_job: RunningJob
) -> None:
    """Not there yet: ``execute`` defers to the trigger (absolute deadline from the sensor's
    timeout); the trigger's event, once it comes, is the task's XCom."""
    layout = running_job(tmp_path / "job")
    task = sensor(min_samples=2000, job_dir=str(layout.root))
    with pytest.raises(TaskDeferred) as deferred:
        task.execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, CheckpointTrigger)
    assert deferred.value.method_name == "execute_complete"
    assert trigger.deadline is not None and abs(trigger.deadline - (time.time() + 60)) < 5
    assert deferred.value.timeout is not None and deferred.value.timeout.total_seconds() > 60

    commit_checkpoint(layout, 1, done_shards=5, pss=pss)
    event = first_event(recreated(trigger))
    xcom = task.execute_complete({}, event)
    assert set(xcom) == XCOM_KEYS
    assert (xcom["name"], xcom["samples"], xcom["job_id"]) == ("ckpt-000001", 2500, "rover-job-7")


def test_execute_returns_at_once_when_the_checkpoint_is_there(
    tmp_path: Path, pss: list[ParameterServer], running_job: RunningJob
) -> None:
    layout = running_job(tmp_path / "job")
    commit_checkpoint(layout, 1, done_shards=5, pss=pss)
    xcom = sensor(min_samples=2500, job_dir=str(layout.root)).execute({})
    assert (xcom["name"], xcom["samples"]) == ("ckpt-000001", 2500)
    poked = sensor(min_samples=1, job_dir=str(layout.root), deferrable=False).execute({})
    assert poked == xcom


def test_execute_fails_at_once_for_a_job_that_ended_short(
    tmp_path: Path, pss: list[ParameterServer], dead_pid: int, running_job: RunningJob
) -> None:
    layout = running_job(tmp_path / "job")
    commit_checkpoint(layout, 1, done_shards=1, pss=pss)
    end_job(layout, "stopped", dead_pid, finished_at=time.time())
    with pytest.raises(AirflowException, match="ended \\(stopped: job stopped\\) without"):
        sensor(min_samples=5000, job_dir=str(layout.root)).execute({})


def test_templated_fields_render_then_validate(
    tmp_path: Path, pss: list[ParameterServer], running_job: RunningJob
) -> None:
    layout = running_job(tmp_path / "job")
    commit_checkpoint(layout, 1, done_shards=4, pss=pss)
    task = sensor(min_samples="{{ params.samples }}", job_dir="{{ params.job_dir }}")
    task.render_template_fields({"params": {"samples": 2000, "job_dir": str(layout.root)}})
    assert (task.min_samples, task.job_dir) == ("2000", str(layout.root))
    assert task.execute({})["samples"] == 2000

    bad = sensor(min_samples=1, checkpoint_uri="{{ params.uri }}")
    bad.render_template_fields({"params": {"uri": "ftp://x"}})
    with pytest.raises(ValueError, match="checkpoint_uri='ftp://x': unsupported scheme"):
        bad.execute({})


@pytest.mark.parametrize(
    ("event", "error", "match"),
    [
        (None, AirflowException, "returned no event"),
        ({"status": "failed", "message": "job x ended"}, AirflowException, "job x ended"),
        ({"status": "error", "message": "StorageError: s3://b"}, AirflowException, "s3://b"),
        ({"status": "timeout", "message": "no checkpoint"}, AirflowSensorTimeout, "no checkpoint"),
    ],
)
def test_execute_complete_rejects_every_other_ending(
    event: dict[str, Any] | None, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        sensor(min_samples=1, job_dir="/j").execute_complete({}, event)


def test_a_soft_fail_sensor_skips_on_timeout() -> None:
    task = CheckpointSensor(task_id="t", min_samples=1, job_dir="/j", soft_fail=True)
    with pytest.raises(AirflowSkipException, match="no checkpoint"):
        task.execute_complete({}, {"status": "timeout", "message": "no checkpoint"})
