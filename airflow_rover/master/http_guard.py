"""The master API's front door: an ASGI middleware that checks the job's bearer token and caps
the request body before the app (or anyone) reads a byte of the body.

A dependency of the app would run only after FastAPI had read and parsed the body, so a
stranger's large request would cost the master memory before being refused.
"""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

MAX_BODY_BYTES = 64 * 1024
"""The largest request body the master accepts. What the nodes and Airflow post is small JSON
(``rpc.master_api``: a heartbeat, a lease, a shard report, an evaluation, a plan request or a
stop, the largest with its 500-character reason: under 1 KiB)."""
UNAUTHORIZED = "missing or wrong job token"


class _TooLarge(Exception):
    pass


class TokenAndSizeGuard:
    """Answers 401 to a request without ``Authorization: Bearer <the job's token>`` (compared in
    constant time) and 413 to one whose body is over ``max_body`` bytes, by its
    ``Content-Length`` or, sent in chunks, as it arrives; only then does ``app`` see the request,
    with its body already read (at most ``max_body`` bytes held)."""

    def __init__(self, app: ASGIApp, token: str, max_body: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self._expected = token.encode()
        self._max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # no websockets here: refused before the handshake
            await send({"type": "websocket.close", "code": 1008})
            return
        if not self._authorized(scope):
            await _refuse(scope, receive, send, 401, UNAUTHORIZED, {"WWW-Authenticate": "Bearer"})
            return
        try:
            body = await self._read_body(scope, receive)
        except _TooLarge:
            await _refuse(scope, receive, send, 413, f"request body over {self._max_body} bytes")
            return
        if body is None:  # the client went away
            return
        await self.app(scope, _replay(body, receive), send)

    def _authorized(self, scope: Scope) -> bool:
        given = _header(scope, b"authorization") or b""
        scheme, _, credentials = given.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(credentials, self._expected)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        declared = _header(scope, b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self._max_body):
            raise _TooLarge
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            found: bytes = value
            return found
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """The app's ``receive``: the body read already, then whatever comes next (a disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


async def _refuse(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    detail: str,
    headers: dict[str, str] | None = None,
) -> None:
    """Answer without reading (the rest of) the body: the server closes the connection after
    the answer, so what the client still sends is never read."""
    await JSONResponse({"detail": detail}, status, headers=headers)(scope, receive, send)
