"""Failures no restart can fix end the job at once, without retry: nodes report their crash to
the master before exiting (``POST /nodes/{id}/crash``), the master fails the job when the same
exception comes back from another shard, node or restart, and says so in its status, its
``state.json``, the trigger's event and the task's exception (``AirflowFailException``). A
transient crash, or one shard that keeps killing its worker, is still restarted."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Any

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from master_rig import Job, start_running

from airflow_rover.core.spec import RecoveryConfig
from airflow_rover.operators.training import ElasticTrainingOperator
from airflow_rover.triggers.elastic_job import ElasticJobTrigger


def raising(bad_id: int) -> dict[str, Any]:
    """The crash record a worker sends for an id outside its table's vocabulary."""
    message = f"table 'C1': column 'C1' has ids outside [0, 100) (e.g. {bad_id})"
    return {
        "exc_type": "ValueError",
        "message": message,
        "where": "core/embedding_placement.py:fused_ids:47",
        "tail": f"Traceback (most recent call last):\n  ...\nValueError: {message}\n",
    }


def dies(job: Job, node: str, crash: dict[str, Any] | None, code: int = 1) -> None:
    """``node`` reports ``crash`` (None: it reports nothing, as a killed one) and exits."""
    if crash is not None:
        assert job.post(f"/nodes/{node}/crash", crash) == {"ok": True}
    job.launcher.exit(node, code)
    job.master.step()


def starts_of(job: Job, node: str) -> int:
    return job.launcher.started.count((node, "worker"))


def operator_outcome(job: Job, monkeypatch: pytest.MonkeyPatch) -> pytest.ExceptionInfo:
    """What the task raises once the trigger reports the ended job."""
    event = asyncio.run(anext(ElasticJobTrigger(str(job.layout.root)).run())).payload
    with DAG(dag_id="determ_test", schedule=None, start_date=datetime(2026, 1, 1)):
        task = ElasticTrainingOperator(task_id="train", train_data="/data/train")
    monkeypatch.setattr(task, "_record", lambda _context, _job: None)
    with pytest.raises(AirflowException) as info:
        task.execute_complete({}, event)  # type: ignore[arg-type]
    return info


def test_the_same_exception_on_two_shards_fails_the_job_at_once(
    make_job, monkeypatch: pytest.MonkeyPatch
) -> None:
    """worker-0 dies on shard 0, worker-1 on shard 1, of the same exception (other ids): the
    job fails as the second reports it, restarts left or not, and the task is not retried."""
    job = make_job(recovery=RecoveryConfig(max_node_restarts=10))
    start_running(job)
    assert job.lease("worker-0")["shard"]["shard_id"] == 0
    assert job.lease("worker-1")["shard"]["shard_id"] == 1
    dies(job, "worker-0", raising(150))
    assert job.status()["state"] == "running"
    assert starts_of(job, "worker-0") == 2  # once is bad luck: restarted
    assert job.post("/nodes/worker-1/crash", raising(4096)) == {"ok": True}
    assert job.status()["state"] == "failed"  # at its report, not once its process is gone
    dies(job, "worker-1", None)

    status = job.status()
    assert status["state"] == "failed"
    assert starts_of(job, "worker-1") == 1  # not restarted
    message = status["message"]
    assert message.startswith("deterministic failure, not retried: the same exception struck 2")
    assert "(worker-0 on shard 0 (samples 0-250); worker-1 on shard 1 (samples 250-500))" in message
    assert "ValueError: table 'C1': column 'C1' has ids outside [0, 100) (e.g. 4096)" in message
    failure = status["failure"]
    assert failure["kind"] == "deterministic" and failure["retryable"] is False
    assert (failure["nodes"], failure["shards"]) == (["worker-0", "worker-1"], [0, 1])
    assert json.loads(job.layout.state_file.read_text())["failure"] == failure

    info = operator_outcome(job, monkeypatch)
    assert info.type is AirflowFailException
    assert "deterministic failure" in str(info.value)


def test_a_node_that_dies_of_the_same_exception_twice_before_training_fails_the_job(
    make_job,
) -> None:
    """A model that cannot be built kills each worker before it leases anything."""
    job = make_job()
    start_running(job)
    for _ in range(2):
        dies(job, "worker-0", raising(7))
    status = job.status()
    assert status["state"] == "failed", status["message"]
    assert status["failure"]["nodes"] == ["worker-0"] and status["failure"]["shards"] == []


def test_one_shard_that_keeps_killing_its_worker_is_quarantined_not_the_jobs_end(
    make_job,
) -> None:
    """Deaths on one shard are that shard's data: quarantined, the job goes on."""
    job = make_job(recovery=RecoveryConfig(max_shard_failures=3))
    start_running(job)
    for _ in range(3):
        assert job.lease("worker-0")["shard"]["shard_id"] == 0
        dies(job, "worker-0", raising(150))
    status = job.status()
    assert status["state"] == "running", status["message"]
    assert status["failure"] is None
    assert [q["shard_id"] for q in status["recovery"]["quarantined"]] == [0]


def test_transient_crashes_and_killed_nodes_are_restarted(make_job) -> None:
    """A lost connection (or a kill: no record) says nothing about the next try."""
    job = make_job()
    start_running(job)
    lost = {
        "exc_type": "httpx.ConnectError",
        "message": "[Errno 111] Connection refused",
        "where": "rpc/master_client.py:_request:44",
        "transient": True,
    }
    for worker in ("worker-0", "worker-1", "worker-0"):
        job.lease(worker)
        dies(job, worker, lost)
    for worker in ("worker-0", "worker-1"):
        job.lease(worker)
        dies(job, worker, None, code=-9)
    assert job.status()["state"] == "running"
    assert starts_of(job, "worker-0") == 4


def test_a_failure_beyond_the_restarts_quotes_the_nodes_exception_not_http_lines(
    make_job, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The message ends with the dead node's traceback; a node that reported none is quoted
    from its own log lines, without the HTTP client's request lines; Airflow may retry it."""
    job = make_job(recovery=RecoveryConfig(max_node_restarts=0))
    start_running(job)
    log = job.layout.log_file("worker-0")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(
        "INFO airflow_rover.worker step 12 loss 0.52\n"
        + 'INFO httpx HTTP Request: POST http://127.0.0.1:1/api/v1/shards/lease "HTTP/1.1 200"\n'
        * 20
    )
    dies(job, "worker-0", None, code=-9)
    status = job.status()
    assert status["state"] == "failed"
    assert "Last lines of worker-0's log:\nINFO airflow_rover.worker step 12" in status["message"]
    assert "HTTP Request" not in status["message"]
    assert status["failure"] is None
    assert operator_outcome(job, monkeypatch).type is AirflowException


def test_the_message_of_a_spent_restart_budget_quotes_the_exception(make_job) -> None:
    job = make_job(recovery=RecoveryConfig(max_node_restarts=0))
    start_running(job)
    dies(job, "worker-0", raising(150))
    message = job.status()["message"]
    assert "worker-0 exited with code 1 (ValueError: table 'C1'" in message
    assert "Its traceback:\nTraceback (most recent call last):" in message
