"""A node's last act before an uncaught exception ends it: tell the master what it dies of
(``core.crashes.Crash``), so that the master can tell a mistake that every restart would repeat
from bad luck, and quote the node's own words."""

from __future__ import annotations

import logging

import grpc
import httpx

from airflow_rover.core.crashes import Crash
from airflow_rover.rpc import master_api
from airflow_rover.rpc.master_client import MasterClient

log = logging.getLogger(__name__)

REPORT_TIMEOUT_S = 5.0
_TRANSIENT_GRPC = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)
# TensorFlow's errors of the same kinds, by class name (the wire does not import TensorFlow)
_TRANSIENT_NAMES = frozenset(
    {
        "ResourceExhaustedError",
        "UnavailableError",
        "DeadlineExceededError",
        "AbortedError",
        "CancelledError",
    }
)


def is_transient(exc: BaseException) -> bool:
    """Whether a restart may fix what ``exc`` says: the network, a timeout, memory."""
    if isinstance(exc, (httpx.HTTPError, ConnectionError, TimeoutError, MemoryError)):
        return True
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        return exc.code() in _TRANSIENT_GRPC
    return any(kind.__name__ in _TRANSIENT_NAMES for kind in type(exc).__mro__)


def _rpc_message(exc: BaseException) -> str | None:
    """A gRPC error's status and details (its ``str`` starts with the call object's repr,
    the same for every error of every call)."""
    if not isinstance(exc, grpc.RpcError):
        return None
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if not callable(code) or not callable(details):
        return None
    return f"{code().name}: {details()}"


def report_crash(master: MasterClient, node_id: str, exc: BaseException) -> None:
    """Send ``exc`` to the master as ``node_id``'s crash record (best effort: a master that
    does not answer within ``REPORT_TIMEOUT_S`` is not told)."""
    crash = Crash.of(exc, transient=is_transient(exc), message=_rpc_message(exc))
    try:
        master.report_crash(node_id, master_api.NodeCrash(**crash.to_dict()), REPORT_TIMEOUT_S)
    except (httpx.HTTPError, ValueError) as error:
        log.warning("%s could not report its crash to the master: %s", node_id, error)
