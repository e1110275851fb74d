"""Bad numbers and paths get a clear refusal, never a 500, an UNKNOWN or a silent yes
(issue 22, finding 9)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import grpc
import numpy as np
import pytest
from airflow.sdk import DAG
from master_rig import AUTH, P, start_running
from test_ps import ADAGRAD, LAYOUT, SEED

from airflow_rover.operators.training import ElasticTrainingOperator
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc import frames, ps_service
from airflow_rover.storage.base import parse_checkpoint_uri

TOKEN = "ps-token-0123456789"


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_heartbeat_with_a_number_json_cannot_hold_is_refused(make_job, number: str) -> None:
    job = make_job()
    start_running(job)
    body = f'{{"steps": 1, "samples": 64, "step_time_ms": {number}}}'
    reply = job.api.post(
        P + "/nodes/worker-0/heartbeat",
        content=body,
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert reply.status_code == 422, reply.text
    assert reply.json()["detail"][0]["loc"][-1] == "step_time_ms"
    worker = next(n for n in job.status()["nodes"] if n["id"] == "worker-0")
    assert (worker["samples"], worker["step_time_ms"]) == (0, 0.0)  # nothing applied


@pytest.fixture
def ps_address() -> Iterator[str]:
    server, port = start_server(ParameterServer(0, 1, LAYOUT, ADAGRAD, SEED), TOKEN, threads=2)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def _call(address: str, method: str, request: dict[str, np.ndarray]) -> Any:
    with grpc.insecure_channel(address, options=ps_service.CHANNEL_OPTIONS) as channel:
        stub = channel.unary_unary(ps_service.method_path(method))
        return stub(frames.encode(request), metadata=ps_service.auth_metadata(TOKEN), timeout=10)


@pytest.mark.parametrize(
    ("method", "field", "value"),
    [
        ("Push", "key", np.empty(0, np.int64)),
        ("Push", "key", np.array(3, np.int64)),  # 0-d
        ("Push", "key", np.array([1, 2], np.int64)),
        ("Pull", "dense_version", np.empty(0, np.int64)),
        ("Pull", "create", np.empty(0, np.uint8)),
    ],
)
def test_a_ps_refuses_a_malformed_scalar_as_invalid_argument(
    ps_address: str, method: str, field: str, value: np.ndarray
) -> None:
    request = {field: value, "dense": np.ones(1, np.uint8)}
    with pytest.raises(grpc.RpcError) as err:
        _call(ps_address, method, request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{field}: expected one value" in (err.value.details() or "")
    assert _call(ps_address, "Stats", {})  # the server serves on


def _operator(**kwargs: Any) -> ElasticTrainingOperator:
    with DAG(dag_id="numbers", schedule=None, start_date=datetime(2026, 1, 1)):
        return ElasticTrainingOperator(task_id="train", train_data="/data/train", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"embedding_dim": -5}, "embedding_dim=-5: Input should be greater than 0"),
        ({"embedding_dim": 4096}, "embedding_dim=4096: Input should be less than or equal"),
        ({"embedding_dim": 8.5}, "embedding_dim=8.5"),
        ({"output_dir": "/models/../etc"}, "output_dir='/models/../etc': '..' in the path"),
        ({"checkpoint_uri": "file:///ckpt/../etc"}, "'..' in the path"),
        ({"checkpoint_uri": "/ckpt/../../etc"}, "'..' in the path"),
    ],
)
def test_the_operator_refuses_them_when_the_dag_is_parsed(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match="ElasticTrainingOperator") as err:
        _operator(**kwargs)
    assert message in str(err.value)


def test_plain_paths_and_uris_still_parse() -> None:
    assert parse_checkpoint_uri("file:///ckpt/a..b").path is not None  # '..' inside a name
    _operator(output_dir="/models/ctr/{{ ds }}", embedding_dim=32, checkpoint_uri="/ckpt/x")
