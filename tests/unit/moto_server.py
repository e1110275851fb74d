"""Helpers for the checkpoint storage tests: an S3 API on loopback (moto's server mode, a real
HTTP server in its own process) and checkpoints written the way the master's checkpointer
writes them (real parameter-server snapshots as checksummed ``.npz`` parts, ``queue.json``
with the shard queue and every part's checksum, then ``LATEST``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np

from airflow_rover.core.checkpoint_files import checkpoint_record, write_npz
from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.job_dir import JobDir, atomic_write_json
from airflow_rover.core.shards import ShardQueue
from airflow_rover.core.spec import FeatureConfig, TableConfig
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.ps.server import ParameterServer
from airflow_rover.storage import AwsSettings, S3Store

ACCESS_KEY = "AKIAROVERTEST"
SECRET_KEY = "rover-test-secret-do-not-log"
START_TIMEOUT_S = 30.0

FEATURES = FeatureConfig(
    num_dense=1, tables=(TableConfig(name="a", column="C1", vocab_size=5000, dim=8),)
)
LAYOUT = EmbeddingPlacement.from_features(FEATURES)
GROUP = LAYOUT.groups[0].name
NUM_SAMPLES = 10_000
SHARD_SIZE = 500
BATCH_SIZE = 100


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def moto_server(env: dict[str, str] | None = None) -> Iterator[str]:
    """``moto_server -H 127.0.0.1 -p <free port>`` until the block ends; yields its URL.
    ``env``: extra environment (``INITIAL_NO_AUTH_ACTION_COUNT=0`` makes it check keys)."""
    port = free_port()
    exe = Path(sys.executable).with_name("moto_server")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "moto.server"]
    # Its request log goes to a file: a pipe nobody reads fills up after a few hundred
    # requests and then blocks the server (a job that checkpoints every second hung on it).
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(
        [*command, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                log.seek(0)
                err = log.read().decode(errors="replace")
                raise RuntimeError(f"moto_server exited with {proc.returncode}: {err[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                    break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server not up on {url}: {exc}") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def s3_client(endpoint: str) -> Any:
    """A plain boto3 client on the moto server, for looking behind the store's back."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
    )


def new_bucket(endpoint: str) -> str:
    """A fresh bucket (tests share one server, never a bucket)."""
    name = f"rover-{uuid.uuid4().hex[:12]}"
    s3_client(endpoint).create_bucket(Bucket=name)
    return name


def new_store(endpoint: str, prefix: str) -> S3Store:
    """An ``S3Store`` at ``prefix`` of a new bucket on the moto server at ``endpoint``."""
    settings = AwsSettings(ACCESS_KEY, SECRET_KEY, endpoint_url=endpoint, region_name="us-east-1")
    return S3Store(new_bucket(endpoint), prefix, settings)


def connection_env(endpoint: str) -> str:
    """An ``AIRFLOW_CONN_<ID>`` value: an AWS connection in the Amazon provider's shape."""
    import json

    return json.dumps(
        {
            "conn_type": "aws",
            "login": ACCESS_KEY,
            "password": SECRET_KEY,
            "extra": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
    )


# -- checkpoints as the checkpointer writes them --------------------------------------------
def trained_ps(index: int, num_ps: int, pushes: int = 3, dense: int = 6) -> ParameterServer:
    """A parameter server with some pushes applied (rows, Adagrad state, ledger) and a dense
    weight of ``dense`` floats."""
    ps = ParameterServer(index, num_ps, LAYOUT, Optimizer("adagrad", 0.1), 5)
    rng = np.random.default_rng(index)
    ps.init_dense({"dense/w": rng.random(dense, dtype=np.float32)})
    for key in range(pushes):
        ids = np.arange(key * 100, key * 100 + 300, dtype=np.int64)
        grads = np.full((ids.size, 8), 0.01 * (key + 1), dtype=np.float32)
        ps.push({"key": np.array([key]), f"ids/{GROUP}": ids, f"grad/{GROUP}": grads})
    return ps


def shard_queue(done_shards: int) -> ShardQueue:
    """A job's queue with its first ``done_shards`` shards trained (500 samples each)."""
    queue = ShardQueue(NUM_SAMPLES, SHARD_SIZE, epochs=1, batch_size=BATCH_SIZE)
    for _ in range(done_shards):
        shard = queue.lease("worker-0", now=0.0, lease_s=60.0)
        assert shard is not None
        queue.complete(shard.shard_id, "worker-0")
    return queue


def commit_checkpoint(
    layout: JobDir,
    number: int,
    done_shards: int,
    pss: list[ParameterServer],
    job_id: str | None = None,
) -> Path:
    """Checkpoint ``number`` of the job in ``layout``, committed as the master does: every
    PS's part (``write_npz`` of its snapshot, as its persister writes it), then ``queue.json``
    (``checkpoint_record``), then ``LATEST`` (``JobDir.commit_checkpoint``)."""
    directory = layout.checkpoint_dir(number)
    parts = {
        f"ps-{ps.index}.npz": write_npz(directory / f"ps-{ps.index}.npz", ps.snapshot().items())
        for ps in pss
    }
    queue = shard_queue(done_shards).to_dict()
    record = checkpoint_record(queue if job_id is None else {**queue, "job_id": job_id}, parts)
    atomic_write_json(directory / "queue.json", record)
    layout.commit_checkpoint(directory)
    return directory


def flip_byte(path: Path, at: int = 100) -> None:
    """Change one byte of a file in place (same size)."""
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0xFF]))
        fh.flush()
        os.fsync(fh.fileno())
