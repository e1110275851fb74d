"""Parquet datasets on an S3 API (moto's server on loopback): a prefix, a Hive-style partition
or a glob reads the same rows as the local files; the fingerprint follows the objects' ETags."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException
from moto_server import ACCESS_KEY, SECRET_KEY, moto_server, new_bucket, s3_client

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.spec import JobSpec
from airflow_rover.data import csv_files
from airflow_rover.data.fingerprint import training_fingerprint
from airflow_rover.data.offset_index import ENV_INDEX_DIR
from airflow_rover.data.reader import open_dataset
from airflow_rover.data.s3_files import StorageUnavailable
from airflow_rover.data.sources import list_files
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.data.synthetic_files import (
    parquet_schema,
    write_csv,
    write_parquet,
    write_tfrecord,
)
from airflow_rover.launchers.local import LocalNodeLauncher
from airflow_rover.operators.training import ElasticTrainingOperator


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture()
def s3_env(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The environment a job's processes get from ``aws_conn_id``."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return endpoint


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("data")
    split = generate_dataset(root, SyntheticConfig(num_train=2000, num_eval=500, seed=4)).train_dir
    return split, write_parquet(
        split, root / "pq", num_files=3, rows_per_group=300, string_ids=True
    )


def _upload(endpoint: str, files: Path, prefix: str) -> str:
    bucket = new_bucket(endpoint)
    client = s3_client(endpoint)
    for path in sorted(files.iterdir()):
        client.upload_file(str(path), bucket, f"{prefix}{path.name}")
    client.put_object(Bucket=bucket, Key=f"{prefix}_SUCCESS", Body=b"")
    return bucket


def test_a_partition_on_s3_reads_as_the_local_files(s3_env: str, local: tuple[Path, Path]) -> None:
    split, files = local
    schema = parquet_schema(split, string_ids=True)
    bucket = _upload(s3_env, files, "clicks/dt=2026-11-25/")
    s3_client(s3_env).put_object(Bucket=bucket, Key="clicks/dt=2026-11-250/x.parquet", Body=b"no")
    in_progress = "clicks/dt=2026-11-25/_temporary/0/part-9.parquet"  # a Spark write going on
    s3_client(s3_env).put_object(Bucket=bucket, Key=in_progress, Body=b"no")
    expected = open_dataset(files, schema=schema).read(0, 2000)
    for uri in (
        f"s3://{bucket}/clicks/dt=2026-11-25/",
        f"s3://{bucket}/clicks/dt=2026-11-25",
        f"s3://{bucket}/clicks/dt=2026-11-25/part-*.parquet",
    ):
        reader = open_dataset(uri, schema=schema)
        assert reader.num_samples == 2000, uri
        for start, stop in ((0, 2000), (250, 950)):
            got = reader.read(start, stop)
            np.testing.assert_array_equal(got.categorical, expected.categorical[start:stop])
            np.testing.assert_array_equal(got.dense, expected.dense[start:stop])
            np.testing.assert_array_equal(got.label, expected.label[start:stop])


def test_the_fingerprint_follows_the_objects(s3_env: str, local: tuple[Path, Path]) -> None:
    split, files = local
    bucket = _upload(s3_env, files, "day/")
    spec = JobSpec(
        job_id="s3",
        train_data=f"s3://{bucket}/day/",
        data_schema=parquet_schema(split, string_ids=True),
    )
    first = training_fingerprint(spec)
    assert training_fingerprint(spec) == first
    client = s3_client(s3_env)
    client.upload_file(str(files / "part-00001.parquet"), bucket, "day/part-00000.parquet")
    assert training_fingerprint(spec) != first


def test_a_missing_bucket_and_an_empty_prefix_are_named(s3_env: str) -> None:
    with pytest.raises(ValueError, match=r"s3://no-such-bucket/x/: cannot list the objects"):
        open_dataset("s3://no-such-bucket/x/")
    bucket = new_bucket(s3_env)
    with pytest.raises(ValueError, match=rf"s3://{bucket}/empty/: no data files found"):
        open_dataset(f"s3://{bucket}/empty/")


@pytest.mark.parametrize("train_data", ["s3://bucket/clicks/", "/data/clicks"])
def test_only_nodes_that_read_data_on_s3_get_the_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, train_data: str
) -> None:
    """Workers and the evaluator of a job whose data is on S3 keep the master's credentials
    in their environment; a PS never, and no node of a job whose data is local."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    layout = JobDir(tmp_path / "job")
    layout.root.mkdir()
    layout.write_spec(JobSpec(job_id="s3", train_data=train_data))
    launcher = LocalNodeLauncher(layout, "http://127.0.0.1:1")
    on_s3 = train_data.startswith("s3://")
    for node, reads_data in (("worker-0", True), ("evaluator", True), ("ps-0", False)):
        env = launcher.node_env(node, reads_data)
        assert (env.get("AWS_SECRET_ACCESS_KEY") == SECRET_KEY) is (on_s3 and reads_data), node
        assert ("AWS_ACCESS_KEY_ID" in env) is (on_s3 and reads_data), node


def test_tfrecord_and_csv_on_s3_read_as_their_local_files(
    s3_env: str, local: tuple[Path, Path], tmp_path: Path
) -> None:
    """The record and line indexes are built from chunked reads of the objects."""
    split, files = local
    schema = parquet_schema(split, string_ids=True)
    expected = open_dataset(files, schema=schema).read(0, 2000)
    for fmt, writer in (("tfrecord", write_tfrecord), ("csv", write_csv)):
        folder = writer(split, tmp_path / fmt, num_files=3, string_ids=True)
        bucket = _upload(s3_env, folder, f"{fmt}/dt=2026-11-25/")
        reader = open_dataset(f"s3://{bucket}/{fmt}/dt=2026-11-25/", schema=schema)
        assert reader.num_samples == 2000, fmt
        for start, stop in ((0, 2000), (600, 1400)):
            got = reader.read(start, stop)
            np.testing.assert_array_equal(got.categorical, expected.categorical[start:stop])
            np.testing.assert_allclose(got.dense, expected.dense[start:stop], rtol=1e-6)
            np.testing.assert_array_equal(got.label, expected.label[start:stop])


def test_data_on_s3_through_aws_conn_id_is_refused_on_kubernetes() -> None:
    """The pods cannot be given the connection's keys: the task fails at once, saying what
    to do instead (as for checkpoints)."""
    with DAG(dag_id="s3_data", schedule=None, start_date=datetime(2026, 1, 1)):
        operator = ElasticTrainingOperator(
            task_id="train",
            train_data="s3://bucket/clicks/",
            aws_conn_id="rover_s3",
            launcher="kubernetes",
            kubernetes={"image": "registry.example.com/rover:1", "job_volume_claim": "jobs"},
        )
    spec = JobSpec(job_id="s3", train_data="s3://bucket/clicks/")
    with pytest.raises(AirflowFailException, match=r"aws_conn_id with data on S3 and launcher="):
        operator._data_env(spec)


def test_the_line_index_of_objects_is_kept_in_the_jobs_folder(
    s3_env: str,
    local: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second open reads no object from end to end; a rewritten object (a new ETag) is
    scanned again."""
    split, _ = local
    schema = parquet_schema(split, string_ids=True)
    folder = write_csv(split, tmp_path / "csv", num_files=2, string_ids=True)
    bucket = _upload(s3_env, folder, "csv/")
    monkeypatch.setenv(ENV_INDEX_DIR, str(tmp_path / "job" / "data-index"))
    scanned: list[str] = []
    scan = csv_files.line_offsets
    monkeypatch.setattr(csv_files, "line_offsets", lambda path: scanned.append(path) or scan(path))
    uri = f"s3://{bucket}/csv/"
    expected = open_dataset(uri, schema=schema).read(0, 2000)
    assert len(scanned) == 2
    assert len(list((tmp_path / "job" / "data-index").iterdir())) == 2
    scanned.clear()
    again = open_dataset(uri, schema=schema)
    assert scanned == []
    np.testing.assert_array_equal(again.read(0, 2000).categorical, expected.categorical)
    s3_client(s3_env).upload_file(str(folder / "part-00000.csv"), bucket, "csv/part-00001.csv")
    rewritten = open_dataset(uri, schema=schema)
    assert scanned == [f"s3://{bucket}/csv/part-00001.csv"]
    assert rewritten.num_samples == 2 * 1000
    np.testing.assert_array_equal(
        rewritten.read(1000, 2000).categorical, expected.categorical[:1000]
    )


class _BusyS3(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint that answers every request 503 SlowDown, as S3 does under load."""

    def do_GET(self) -> None:
        body = b"<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>"
        self.send_response(503)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def one_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # boto3's own retries would only add time


def test_s3_busy_or_unreachable_is_worth_a_retry_a_missing_bucket_is_not(
    one_attempt: None, endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task fails at once (no retry) on a ValueError, and is retried on any other error:
    a 503 or no answer is StorageUnavailable, a missing bucket a ValueError naming it."""
    busy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BusyS3)
    threading.Thread(target=busy.serve_forever, daemon=True).start()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening
        try:
            for url, reason in (
                (f"http://127.0.0.1:{busy.server_port}", "SlowDown"),
                (nobody, "reach"),
            ):
                monkeypatch.setenv("AWS_ENDPOINT_URL_S3", url)
                with pytest.raises(StorageUnavailable, match=reason) as caught:
                    list_files("s3://clicks/dt=2026-11-25/")
                assert not isinstance(caught.value, ValueError)
                assert "s3://clicks/dt=2026-11-25/" in str(caught.value)
        finally:
            busy.shutdown()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    with pytest.raises(
        ValueError, match=r"s3://no-such-bucket/x/: cannot list the objects \(NoSuchBucket\)"
    ):
        list_files("s3://no-such-bucket/x/")
