"""A node that dies of an exception tells its master what killed it before it exits
(``rpc.crash_report``): a real PS process against a real master process. What a restart may fix
(the network, a timeout, memory) is marked transient, never taken for a deterministic failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import pytest

from airflow_rover.core.job_dir import (
    ENV_JOB_DIR,
    ENV_MASTER_ADDR,
    ENV_NODE_ID,
    ENV_PS_PORT,
    ENV_TOKEN_FILE,
)
from airflow_rover.rpc import master_api
from airflow_rover.rpc.crash_report import is_transient, report_crash

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from lone_master import lone_master, small_job, started


class _RpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def __str__(self) -> str:  # as grpc's call objects print
        return f"<_MultiThreadedRendezvous of RPC that terminated with:\n\tstatus = {self._code}"


class Recorder:
    """Takes a crash report the way ``MasterClient.report_crash`` sends it."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, master_api.NodeCrash]] = []

    def report_crash(self, node_id: str, crash: master_api.NodeCrash, timeout_s: float) -> None:
        self.sent.append((node_id, crash))


class ResourceExhaustedError(Exception):
    """Named as TensorFlow's error of the kind (the wire does not import TensorFlow)."""


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (httpx.ConnectError("refused"), True),
        (httpx.ReadTimeout("slow"), True),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (MemoryError(), True),
        (_RpcError(grpc.StatusCode.UNAVAILABLE), True),
        (_RpcError(grpc.StatusCode.DEADLINE_EXCEEDED), True),
        (ResourceExhaustedError("OOM when allocating tensor"), True),
        (_RpcError(grpc.StatusCode.INVALID_ARGUMENT), False),
        (ValueError("table 'C1': column 'C1' has ids outside [0, 100)"), False),
        (ZeroDivisionError("division by zero"), False),
        (FileNotFoundError("/data/train/manifest.json"), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_what_a_restart_may_fix_is_transient(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


def test_a_grpc_error_is_reported_by_its_status_and_details() -> None:
    """Its ``str`` starts with the call object's repr, the same for every error."""
    recorder = Recorder()
    refused = _RpcError(grpc.StatusCode.INVALID_ARGUMENT, "table 'C1': non-finite gradients")
    report_crash(recorder, "worker-0", refused)  # type: ignore[arg-type]
    ((node, crash),) = recorder.sent
    assert node == "worker-0"
    assert crash.message == "INVALID_ARGUMENT: table 'C1': non-finite gradients"
    assert crash.transient is False


def test_a_ps_that_dies_of_an_exception_tells_its_master_first(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """ps-0, started from its entry point with a port that is not a number, raises: the master
    hears what and where before the process exits 1, and the PS logs no HTTP request line."""
    job_dir = small_job(tmp_path)
    with lone_master(job_dir) as master:
        started(master.process, lambda: "ps-0" in master.get("/status").text, "the master")
        env = {
            ENV_JOB_DIR: str(job_dir.root),
            ENV_NODE_ID: "ps-0",
            ENV_MASTER_ADDR: master.address,
            ENV_TOKEN_FILE: str(job_dir.token_file),
            ENV_PS_PORT: "not-a-port",
        }
        ps = subprocess.run(
            [sys.executable, "-m", "airflow_rover.ps", "--role", "ps"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ps.returncode == 1, ps.stderr[-3000:]
        heard = capfd.readouterr()
    said = heard.out + heard.err
    assert "ps-0 is exiting: ValueError: invalid literal for int() with base 10: 'not-a-port'" in (
        said
    ), said[-3000:]
    assert "(at ps/__main__.py:serve:" in said
    assert "could not report" not in ps.stderr
    assert "HTTP Request:" not in ps.stderr + ps.stdout
