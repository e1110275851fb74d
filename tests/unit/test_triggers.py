"""``ElasticJobTrigger`` and ``resolve_status`` against real job directories on disk.

No master runs here: each job directory is written by hand with ``JobDir`` the way a master
leaves it (``master.json``, the mirrored ``state.json``, the token), so every branch of the
status policy and every event the trigger can fire is reached deterministically.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import socket
import subprocess
import sys
from collections.abc import AsyncGenerator, Iterator
from pathlib import Path
from typing import Any, cast

import psutil
import pytest
from airflow.triggers.base import TriggerEvent
from standin_master import standin_master

from airflow_rover.core.job_dir import JobDir, atomic_write_json
from airflow_rover.hooks.elastic_job import ABSENT, UNREACHABLE, resolve_status
from airflow_rover.triggers.elastic_job import ElasticJobTrigger

EVENT_KEYS = {"status", "job_id", "message", "job", "failure"}


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def closed_port_address() -> str:
    """An HTTP address on a port nobody listens on: requests fail at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def make_job(
    root: Path,
    state: dict[str, Any] | None = None,
    master: dict[str, Any] | None = None,
) -> JobDir:
    """A job directory as a master leaves it: token, optional master.json and state.json."""
    layout = JobDir(root)
    layout.ensure_token()
    if master is not None:
        atomic_write_json(layout.master_file, master)
    if state is not None:
        atomic_write_json(layout.state_file, state)
    return layout


def job_state(state: str, samples: int = 0, message: str = "", **extra: Any) -> dict[str, Any]:
    return {
        "job_id": "rover-job-1",
        "state": state,
        "message": message,
        "progress": {"samples_done": samples, "samples_total": 10_000},
        "evaluation": None,
        **extra,
    }


def events_of(trigger: ElasticJobTrigger) -> AsyncGenerator[TriggerEvent, None]:
    """``trigger.run()``, typed as the async generator it is (so it can be closed)."""
    return cast(AsyncGenerator[TriggerEvent, None], trigger.run())


def first_event(trigger: ElasticJobTrigger, timeout: float = 10.0) -> dict[str, Any]:
    """Run the trigger like the triggerer does, until its first event; return the payload."""

    async def go() -> Any:
        events = events_of(trigger)
        try:
            return await asyncio.wait_for(anext(events), timeout)
        finally:
            await events.aclose()

    payload: dict[str, Any] = asyncio.run(go()).payload
    assert set(payload) == EVENT_KEYS
    json.dumps(payload)  # events travel to the task as JSON
    return payload


# -- serialization ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"milestone": {"min_samples": 5000}},
        {"milestone": {"states": [], "min_auc": 0.7}},
        {"stop_on_kill": True, "poll_interval": 0.5},
        {"stream_logs": True},
    ],
    ids=["default", "min_samples", "min_auc-no-states", "stop_on_kill", "stream_logs"],
)
def test_serialize_recreates_an_equal_trigger(kwargs: dict[str, Any]) -> None:
    """classpath + kwargs (through JSON) rebuild a trigger that serializes identically."""
    trigger = ElasticJobTrigger(job_dir="/jobs/a", **kwargs)
    classpath, trigger_kwargs = trigger.serialize()
    stored = json.loads(json.dumps(trigger_kwargs))  # plain JSON values only
    assert stored == trigger_kwargs

    module_name, class_name = classpath.rsplit(".", 1)
    cls = getattr(importlib.import_module(module_name), class_name)
    assert cls is ElasticJobTrigger
    assert cls(**stored).serialize() == (classpath, trigger_kwargs)


def test_serialized_kwargs_keep_every_setting() -> None:
    """Nothing is lost: job dir, poll interval, milestone, stop_on_kill and apply_plans."""
    _, kwargs = ElasticJobTrigger(
        "/jobs/b",
        poll_interval=2.5,
        milestone={"min_auc": 0.8},
        stop_on_kill=True,
        apply_plans=False,
    ).serialize()
    assert kwargs == {
        "job_dir": "/jobs/b",
        "poll_interval": 2.5,
        "milestone": {"states": ["succeeded"], "min_samples": None, "min_auc": 0.8},
        "stop_on_kill": True,
        "apply_plans": False,
    }


# -- resolve_status: one test per branch -----------------------------------------------------
def test_the_masters_answer_wins(tmp_path: Path) -> None:
    """An API answer is returned as is, whatever the mirrored file says."""
    layout = make_job(tmp_path, state=job_state("failed"))
    api = job_state("running", samples=7)
    assert resolve_status(layout, api, master_alive=True) == api


@pytest.mark.parametrize("alive", [True, False])
@pytest.mark.parametrize("state", ["succeeded", "failed", "stopped"])
def test_a_mirrored_terminal_state_is_final(tmp_path: Path, state: str, alive: bool) -> None:
    """Without an answer, a terminal state.json is the status, master alive or not."""
    layout = make_job(tmp_path, state=job_state(state, message="done"))
    assert resolve_status(layout, None, master_alive=alive) == job_state(state, message="done")


def test_a_live_master_that_did_not_answer_is_unreachable(tmp_path: Path) -> None:
    """Master alive but silent: 'unreachable' (poll again), keeping the last known progress."""
    layout = make_job(tmp_path, state=job_state("running", samples=42))
    status = resolve_status(layout, None, master_alive=True)
    assert status["state"] == UNREACHABLE
    assert status["message"] == "master did not answer"
    assert status["progress"]["samples_done"] == 42
    assert status["job_id"] == "rover-job-1"


def test_no_files_means_absent(tmp_path: Path) -> None:
    """An empty (or missing) directory is a job not started yet, named in the message."""
    missing = tmp_path / "not-yet"
    status = resolve_status(JobDir(missing), None, master_alive=False)
    assert status == {"state": ABSENT, "message": f"no job in {missing}"}


@pytest.mark.parametrize("with_state", [True, False])
def test_a_dead_master_before_the_end_means_failed(tmp_path: Path, with_state: bool) -> None:
    """A master gone before a terminal state: failed, pointing at the master's log."""
    layout = make_job(
        tmp_path,
        state=job_state("running", samples=9) if with_state else None,
        master={"address": "http://127.0.0.1:1", "pid": 1},
    )
    status = resolve_status(layout, None, master_alive=False)
    assert status["state"] == "failed"
    assert "master process died before the job finished" in status["message"]
    assert str(layout.log_file("master")) in status["message"]
    if with_state:
        assert status["progress"]["samples_done"] == 9


# -- run(): events ---------------------------------------------------------------------------
def test_success_event_for_a_succeeded_job(tmp_path: Path) -> None:
    """A mirrored 'succeeded' with no live master ends the wait with a success event."""
    make_job(tmp_path, state=job_state("succeeded", samples=10_000, message="trained 10000"))
    event = first_event(ElasticJobTrigger(str(tmp_path), poll_interval=0.1))
    assert event["status"] == "success"
    assert event["job_id"] == "rover-job-1"
    assert event["message"] == "trained 10000"
    assert event["job"]["progress"]["samples_done"] == 10_000


def test_an_event_leaves_the_status_lists_over_time_in_state_json(tmp_path: Path) -> None:
    """A long job's throughput and checkpoint histories stay out of the event (and so out of
    Airflow's database); everything else of the status is there, and ``state.json`` keeps all."""
    points = [{"at": 1e9 + 2 * i, "samples_per_second": 100.0} for i in range(600)]
    checkpoints = [{"id": 1, "at": 1e9, "samples": 5, "bytes": 10, "uri": "file:///c/ckpt-1"}]
    recovery = {"restarts": 0, "checkpoint_history": checkpoints}
    state = job_state("succeeded", 10_000, throughput_history=points, recovery=recovery)
    layout = make_job(tmp_path, state=state)
    payload = first_event(ElasticJobTrigger(str(tmp_path), poll_interval=0.1))
    assert "throughput_history" not in payload["job"]
    assert payload["job"]["recovery"] == {"restarts": 0}
    assert payload["job"]["progress"] == state["progress"]
    print(f"event: {len(json.dumps(payload))} bytes; status: {len(json.dumps(state))} bytes")
    assert json.loads(layout.state_file.read_text())["throughput_history"] == points


def test_failed_event_carries_the_masters_message(tmp_path: Path) -> None:
    """A failed job gives a 'failed' event whose message holds the master's reason."""
    reason = "worker-0 exited with code 1; 1 shard(s) returned to TODO"
    make_job(tmp_path, state=job_state("failed", message=reason))
    event = first_event(ElasticJobTrigger(str(tmp_path), poll_interval=0.1))
    assert event["status"] == "failed"
    assert reason in event["message"]
    assert "rover-job-1" in event["message"]


def test_stopped_event_for_a_stopped_job(tmp_path: Path) -> None:
    """A job stopped on request gives a 'stopped' event, not 'failed'."""
    make_job(tmp_path, state=job_state("stopped", message="the Airflow task was killed"))
    event = first_event(ElasticJobTrigger(str(tmp_path), poll_interval=0.1))
    assert event["status"] == "stopped"
    assert "the Airflow task was killed" in event["message"]


def test_a_dead_master_gives_a_failed_event(
    tmp_path: Path, dead_pid: int, closed_port_address: str
) -> None:
    """master.json naming a dead pid with a running state.json: 'master process died'."""
    make_job(
        tmp_path,
        state=job_state("running", samples=100),
        master={"address": closed_port_address, "pid": dead_pid},
    )
    event = first_event(ElasticJobTrigger(str(tmp_path), poll_interval=0.1))
    assert event["status"] == "failed"
    assert "master process died" in event["message"]


def test_a_sample_milestone_reached_while_running(
    tmp_path: Path, stand_in_master: subprocess.Popen[bytes]
) -> None:
    """A live master that does not answer still has its mirrored progress, and a
    ``min_samples`` milestone already passed in it is a success."""
    make_job(tmp_path, state=job_state("running", samples=3000))
    trigger = ElasticJobTrigger(str(tmp_path), poll_interval=0.1, milestone={"min_samples": 2000})
    event = first_event(trigger)
    assert event["status"] == "success"
    assert event["job"]["state"] == UNREACHABLE  # alive, not taken for dead
    assert event["job"]["progress"]["samples_done"] == 3000


def test_an_auc_milestone_missed_by_a_succeeded_job_fails(tmp_path: Path) -> None:
    """With ``states=[]`` a job that succeeded below ``min_auc`` ends the wait as failed."""
    make_job(tmp_path, state=job_state("succeeded", evaluation={"auc": 0.55}, message="trained"))
    trigger = ElasticJobTrigger(
        str(tmp_path), poll_interval=0.1, milestone={"states": [], "min_auc": 0.7}
    )
    event = first_event(trigger)
    assert event["status"] == "failed"
    assert "auc >= 0.7" in event["message"]


def test_an_absent_job_is_polled_until_it_appears(tmp_path: Path) -> None:
    """No event while nothing is there; once the job shows up, the next poll reports it."""
    job_dir = tmp_path / "later"

    async def go() -> dict[str, Any]:
        events = events_of(ElasticJobTrigger(str(job_dir), poll_interval=0.1))
        pending = asyncio.ensure_future(anext(events))
        try:
            done, _ = await asyncio.wait({pending}, timeout=0.5)
            assert not done, f"yielded for an absent job: {pending.result()}"
            make_job(job_dir, state=job_state("succeeded"))
            event = await asyncio.wait_for(pending, 2.0)
            return dict(event.payload)
        finally:
            pending.cancel()
            await events.aclose()

    assert asyncio.run(go())["status"] == "success"


def test_an_unreadable_job_gives_an_error_event(tmp_path: Path) -> None:
    """An unexpected exception (state.json is a directory) becomes an 'error' event."""
    (tmp_path / "state.json").mkdir()
    event = first_event(ElasticJobTrigger(str(tmp_path), poll_interval=0.1))
    assert event["status"] == "error"
    assert event["job_id"] is None
    assert "IsADirectoryError" in event["message"]


@pytest.fixture
def stand_in_master(tmp_path: Path, closed_port_address: str) -> Iterator[subprocess.Popen[bytes]]:
    """A running job whose master.json names a live process that does not answer HTTP."""
    with standin_master(tmp_path) as (proc, named):
        make_job(
            tmp_path,
            state=job_state("running"),
            master={"address": closed_port_address, **named},
        )
        yield proc


def test_on_kill_without_stop_on_kill_leaves_the_job_alone(
    tmp_path: Path, stand_in_master: subprocess.Popen[bytes]
) -> None:
    """A sensor's trigger (stop_on_kill=False) never touches the job it watches."""
    asyncio.run(ElasticJobTrigger(str(tmp_path)).on_kill())
    assert stand_in_master.poll() is None


def test_on_kill_terminates_a_master_that_does_not_answer(
    tmp_path: Path, stand_in_master: subprocess.Popen[bytes]
) -> None:
    """With stop_on_kill, a failed stop request falls back to terminating the master."""
    asyncio.run(ElasticJobTrigger(str(tmp_path), stop_on_kill=True).on_kill())
    stand_in_master.wait(timeout=5)  # the hook already reaped it: no exit code left to read
    assert not psutil.pid_exists(stand_in_master.pid)


# -- the job's logs in the task's log ----------------------------------------------------------
HTTP_LINE = 'INFO httpx HTTP Request: POST http://127.0.0.1:1/api/v1/shards/lease "HTTP/1.1 200"\n'
# a line the trigger logged (structlog writes them to stdout), its event only
TRIGGER_LINE = re.compile(r"\[\w+ *\] (.*) \[airflow_rover\.triggers\.elastic_job\.\w+\]")


class TriggerLog:
    """What the triggers logged so far, read from the captured stdout."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys
        self.events: list[str] = []

    def streamed(self) -> list[str]:
        """The job's lines passed on (``[node] ...``), in order."""
        found = TRIGGER_LINE.findall(self.capsys.readouterr().out)
        self.events += [e.rstrip() for e in found]  # structlog pads a short event
        return [e for e in self.events if re.match(r"\[[\w.-]+\] ", e)]


def test_stream_logs_is_serialized_only_when_on() -> None:
    """Off (the sensors' triggers, and those serialized before it existed): no new kwarg."""
    assert "stream_logs" not in ElasticJobTrigger("/jobs/c").serialize()[1]
    assert ElasticJobTrigger("/jobs/c", stream_logs=True).serialize()[1]["stream_logs"] is True


def test_the_jobs_new_log_lines_reach_the_trigger_log_while_it_waits_and_at_the_end(
    tmp_path: Path, stand_in_master: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    """Lines are passed on as they come, once each, prefixed by node, never the HTTP
    client's; the lines written just before the job ended are passed on before the event."""
    layout = JobDir(tmp_path)
    layout.logs.mkdir()
    (layout.logs / "master.log").write_text("master listening\n")
    (layout.logs / "worker-0.log").write_text(HTTP_LINE + "worker-0 leased shard 0\n")
    logged = TriggerLog(capsys)

    async def go() -> dict[str, Any]:
        trigger = ElasticJobTrigger(str(tmp_path), poll_interval=0.05, stream_logs=True)
        events = events_of(trigger)
        pending = asyncio.ensure_future(anext(events))
        try:
            for _ in range(100):
                await asyncio.sleep(0.05)
                if "[worker-0] worker-0 leased shard 0" in logged.streamed():
                    break
            assert not pending.done()
            with open(layout.log_file("worker-0"), "a") as fh:
                fh.write(HTTP_LINE + "worker-0 done: 64 steps\n")
            atomic_write_json(layout.state_file, job_state("succeeded"))
            event = await asyncio.wait_for(pending, 5.0)
            return dict(event.payload)
        finally:
            pending.cancel()
            await events.aclose()

    assert asyncio.run(go())["status"] == "success"
    assert logged.streamed() == [
        "[master] master listening",
        "[worker-0] worker-0 leased shard 0",
        "[worker-0] worker-0 done: 64 steps",
    ]
    assert any(f"the whole logs are in {layout.logs}" in e for e in logged.events)


def test_without_stream_logs_no_log_line_is_passed_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = make_job(tmp_path, state=job_state("succeeded"))
    layout.logs.mkdir()
    (layout.logs / "worker-0.log").write_text("worker-0 done: 64 steps\n")
    logged = TriggerLog(capsys)
    assert first_event(ElasticJobTrigger(str(tmp_path), poll_interval=0.1))["status"] == "success"
    assert logged.streamed() == []
    on = ElasticJobTrigger(str(tmp_path), poll_interval=0.1, stream_logs=True)
    assert first_event(on)["status"] == "success"
    assert logged.streamed() == ["[worker-0] worker-0 done: 64 steps"]


def test_rover_status_leaves_the_lists_over_time_out_unless_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow_rover.cli import main

    points = [{"at": 1e9 + 2 * i, "samples_per_second": 100.0} for i in range(600)]
    make_job(tmp_path, state=job_state("succeeded", 10_000, throughput_history=points))
    assert main(["status", "--job-dir", str(tmp_path)]) == 0
    short = json.loads(capsys.readouterr().out)
    assert "throughput_history" not in short and short["state"] == "succeeded"
    assert main(["status", "--job-dir", str(tmp_path), "--full"]) == 0
    assert json.loads(capsys.readouterr().out)["throughput_history"] == points
