"""gRPC plumbing shared by the PS server and its clients: raw-bytes methods, bearer-token auth
checked before a request is read, and the message sizes a job needs."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any, NoReturn

import grpc

from airflow_rover.core.spec import FeatureConfig

SERVICE = "rover.ParameterServer"
METHODS = (
    "Pull",
    "Push",
    "PushPull",
    "InitDense",
    "Save",
    "Stats",
    "Ledger",
    "Reshard",
    "Absorb",
    "Ecrm",
)
MAX_MESSAGE_BYTES = 512 * 1024 * 1024
"""The most a message may carry: what a PS sends and what a client takes (replies come from
the job's own PS; a ledger or an ECRM rebuild's reply of a large job are the largest)."""
PIECE_BYTES = 32 * 1024 * 1024
"""Bulk hand-overs go in messages of about this: a resize's rows (``Absorb``), ECRM's parity
frames."""
DENSE_BYTES = 128 * 1024 * 1024
"""The dense part of the model is the user's (``JobSpec.model``), so its size is not in the
spec: this carries 11 million dense weights with Adam's two slots (the reference models have
under 0.2 million)."""
SERVER_THREADS = 8  # requests a PS serves at once
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
UNAUTHENTICATED = "missing or wrong job token"


def receive_limit(features: FeatureConfig, batch_size: int) -> int:
    """The largest request a PS of a job with these tables and batch size takes. A request
    carries at most: one batch's worth of rows (a PushPull's push and pull ids, or one parity
    message, with every id distinct: its id three times, its gradient or row and two
    optimizer slots), one piece of a bulk hand-over (``PIECE_BYTES``) and the dense weights
    with their optimizer state (``DENSE_BYTES``). A larger one is refused as it arrives
    (RESOURCE_EXHAUSTED), before it is read."""
    per_id = sum(3 * 8 + 3 * 4 * table.dim for table in features.tables)
    return min(MAX_MESSAGE_BYTES, batch_size * per_id + PIECE_BYTES + DENSE_BYTES)


def server_options(receive_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", receive_bytes),
    ]


def method_path(name: str) -> str:
    return f"/{SERVICE}/{name}"


def auth_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _refuse(requests: Any, context: grpc.ServicerContext) -> NoReturn:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED)
    raise AssertionError("unreachable: abort raises")


# Request-streaming: gRPC reads no message for it, so a stranger's request is never read.
_REFUSED = grpc.stream_unary_rpc_method_handler(_refuse)


class TokenCheck(grpc.ServerInterceptor):
    """Refuses a call whose metadata lacks ``authorization: Bearer <the job's token>``
    (compared in constant time) with UNAUTHENTICATED, before its request is read: the
    interceptor sees only the metadata, and the handler it gives such a call reads nothing."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        given = given.encode() if isinstance(given, str) else bytes(given)
        if hmac.compare_digest(given, self._expected):
            return continuation(details)
        return _REFUSED
