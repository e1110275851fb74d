"""The S3 stand-in for benches: moto's server on loopback, with the dataset's Parquet files
uploaded, and the environment a job reads S3 through (what ``aws_conn_id`` would give)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import boto3

ACCESS_KEY = "AKIAROVERBENCH"
SECRET_KEY = "rover-bench-secret"
REGION = "us-east-1"


def s3_env(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_DEFAULT_REGION": REGION,
    }


@contextlib.contextmanager
def s3_standin(log_file: Path) -> Iterator[str]:
    """moto's server on a free loopback port until the block ends; yields its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    exe = Path(sys.executable).with_name("moto_server")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "moto.server"]
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(
            [*command, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server not up on {url}; see {log_file}") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def upload(endpoint: str, folder: Path, bucket: str, prefix: str) -> str:
    """Every file of ``folder`` under ``s3://bucket/prefix/``; returns that URI."""
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
    )
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
    for path in sorted(folder.iterdir()):
        client.upload_file(str(path), bucket, f"{prefix}/{path.name}")
    return f"s3://{bucket}/{prefix}/"


def apply_env(endpoint: str) -> None:
    """This process (and the jobs it starts) reads S3 from the stand-in."""
    os.environ.update(s3_env(endpoint))
