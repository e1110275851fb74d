"""What a stranger's large request costs a job's real processes: a master API (``master.serve``)
and a PS (``python -m airflow_rover.ps``), each measured by its resident memory while 200 MiB
requests arrive. The token is checked before the body is read (HTTP: ``master.http_guard``;
gRPC: ``ps.server.TokenCheck``, on the call's metadata), and a body over the size the job needs
is refused as it arrives, so neither process holds more than a small margin of it."""

from __future__ import annotations

import contextlib
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import httpx
import psutil
import pytest

from airflow_rover.core.job_dir import JobDir
from airflow_rover.master.http_guard import MAX_BODY_BYTES
from airflow_rover.rpc import frames, ps_service
from airflow_rover.rpc.master_api import API_PREFIX

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from lone_master import Master, cluster, lone_master, ps_node, small_job

MiB = 1 << 20
LARGE = 200 * MiB
MARGIN = 24 * MiB  # what a process may grow by while refusing LARGE (measured: under 10 MiB)


@pytest.fixture
def job_dir(tmp_path: Path) -> JobDir:
    return small_job(tmp_path)


@pytest.fixture
def master(job_dir: JobDir) -> Iterator[Master]:
    with lone_master(job_dir) as served:
        yield served


class Growth:
    """The largest resident memory of a process over a block, above where it started."""

    def __init__(self, pid: int) -> None:
        self._process = psutil.Process(pid)
        self.start = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _rss(self) -> int:
        return int(self._process.memory_info().rss)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(0.002)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())
        return self.peak - self.start


@contextlib.contextmanager
def growth(pid: int) -> Iterator[Growth]:
    watch = Growth(pid)
    try:
        yield watch
    finally:
        watch.stop()


# -- HTTP: the master ------------------------------------------------------------------------
def post_raw(address: str, path: str, size: int, token: str | None, chunked: bool) -> int | None:
    """POST ``size`` bytes to the master, sent a MiB at a time until it answers (it may answer
    before the body is sent, and then stop reading); returns the status it answered."""
    url = urlsplit(address)
    head = [f"POST {API_PREFIX}{path} HTTP/1.1", f"Host: {url.netloc}"]
    head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}")
    head.append("Content-Type: application/json")
    if token is not None:
        head.append(f"Authorization: Bearer {token}")
    piece = b"\0" * MiB
    if chunked:
        piece = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        with contextlib.suppress(OSError):  # the master may close it once it answered
            for _ in range(size // MiB):
                if select.select([sock], [], [], 0)[0]:
                    break  # it answered
                sock.sendall(piece)
            else:
                sock.sendall(b"0\r\n\r\n" if chunked else b"")
        try:
            reply = sock.recv(4096)
        except OSError:
            return None
    return int(reply.split(b" ", 2)[1]) if reply else None


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize(
    ("authenticated", "expected"), [(False, 401), (True, 413)], ids=["stranger", "token"]
)
def test_a_200_mib_request_costs_the_master_no_memory(
    master: Master, chunked: bool, authenticated: bool, expected: int
) -> None:
    """A stranger's 200 MiB is refused (401) before a byte of it is read, with the token it is
    refused (413) once it is over ``MAX_BODY_BYTES``; either way the master's memory stays
    where it was (before: 404 -> 840 MB), and the master still serves."""
    token = master.token if authenticated else None
    with growth(master.process.pid) as watch:
        statuses = [
            post_raw(master.address, "/nodes/ps-0/heartbeat", LARGE, token, chunked)
            for _ in range(3)
        ]
    assert watch.peak - watch.start < MARGIN, f"grew {(watch.peak - watch.start) / MiB:.0f} MiB"
    assert statuses == [expected] * 3
    assert master.get("/status").status_code == 200


def test_a_body_under_the_cap_still_reaches_the_master(master: Master) -> None:
    """The cap leaves room: a body of ``MAX_BODY_BYTES`` is read and judged by the route (a
    heartbeat it does not parse: 422), one byte more is not."""
    body = b"{" + b" " * (MAX_BODY_BYTES - 2) + b"}"
    url = f"{master.address}{API_PREFIX}/nodes/ps-0/heartbeat"
    headers = {"Authorization": f"Bearer {master.token}", "Content-Type": "application/json"}
    assert httpx.post(url, content=body, headers=headers).status_code == 422
    reply = httpx.post(url, content=body + b" ", headers=headers)
    assert reply.status_code == 413
    assert reply.json() == {"detail": f"request body over {MAX_BODY_BYTES} bytes"}


# -- gRPC: a PS ------------------------------------------------------------------------------
@dataclass
class PS:
    process: subprocess.Popen[bytes]
    address: str
    token: str

    def call(self, method: str, payload: bytes, token: str | None) -> grpc.StatusCode:
        metadata = ps_service.auth_metadata(token) if token is not None else None
        with grpc.insecure_channel(self.address, options=ps_service.CHANNEL_OPTIONS) as channel:
            try:
                channel.unary_unary(ps_service.method_path(method))(
                    payload, metadata=metadata, timeout=30
                )
            except grpc.RpcError as exc:
                return exc.code()
        return grpc.StatusCode.OK


@pytest.fixture
def ps(master: Master, job_dir: JobDir) -> Iterator[PS]:
    """ps-0 of the job, from its entry point, once the master has asked for it."""
    with ps_node(master, job_dir) as proc:
        yield PS(proc, cluster(master)[0], master.token)


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        (None, grpc.StatusCode.UNAUTHENTICATED),
        ("wrong", grpc.StatusCode.UNAUTHENTICATED),
        ("job", grpc.StatusCode.RESOURCE_EXHAUSTED),
    ],
    ids=["no-token", "wrong-token", "token"],
)
def test_a_200_mib_call_costs_a_ps_no_memory(
    ps: PS, job_dir: JobDir, token: str | None, expected: grpc.StatusCode
) -> None:
    """A stranger's 200 MiB Push is refused (UNAUTHENTICATED) on its metadata, before gRPC reads
    the message; with the token, it is over what this job's requests can be
    (``ps_service.receive_limit``: 160 MiB) and refused as it arrives. The PS's memory stays
    where it was (before: 102 -> 948 MB), and it still serves."""
    spec = job_dir.read_spec()
    assert ps_service.receive_limit(spec.resolved_features, spec.training.batch_size) < LARGE
    payload = b"\0" * LARGE
    given = ps.token if token == "job" else token
    with growth(ps.process.pid) as watch:
        codes = [ps.call("Push", payload, given) for _ in range(3)]
    assert watch.peak - watch.start < MARGIN, f"grew {(watch.peak - watch.start) / MiB:.0f} MiB"
    assert codes == [expected] * 3
    assert ps.call("Stats", frames.encode({}), ps.token) == grpc.StatusCode.OK
