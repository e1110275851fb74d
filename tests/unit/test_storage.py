"""Durable checkpoint storage: a local directory and S3 (moto's server on loopback, one process
per module), with real parameter-server checkpoints committed as the master commits them.

Published part by part, then ``queue.json``, then ``LATEST``; a reader never takes a
half-written checkpoint; every checksum is checked on the way back, and a checkpoint that fails
is skipped, with the reason logged, for the one before it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from moto_server import (
    ACCESS_KEY,
    LAYOUT,
    SECRET_KEY,
    commit_checkpoint,
    connection_env,
    flip_byte,
    moto_server,
    new_bucket,
    new_store,
    s3_client,
    shard_queue,
    trained_ps,
)

from airflow_rover.core.checkpoint_files import CorruptCheckpoint, read_manifest
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.hooks.checkpoint_store import CheckpointStoreHook
from airflow_rover.ps.server import ParameterServer
from airflow_rover.storage import (
    LATEST,
    AwsSettings,
    CheckpointMirror,
    LocalStore,
    S3Store,
    StorageAccessDenied,
    StorageError,
    checkpoint_samples,
    download_checkpoint,
    latest_remote_checkpoint,
    open_store,
    parse_checkpoint_uri,
    restore_latest_checkpoint,
    upload_checkpoint,
)
from airflow_rover.storage.base import CheckpointStore
from airflow_rover.storage.s3 import aws_settings_from_connection, transfer_config

MiB = 1 << 20


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def s3_store(s3_endpoint: str) -> S3Store:
    return new_store(s3_endpoint, "jobs/job-1/checkpoints")


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStore:
    """Every behaviour holds for both stores."""
    if request.param == "file":
        return LocalStore(tmp_path / "durable")
    s3: S3Store = request.getfixturevalue("s3_store")
    return s3


@pytest.fixture
def job(tmp_path: Path) -> JobDir:
    return JobDir(tmp_path / "job")


@pytest.fixture(scope="module")
def pss() -> list[ParameterServer]:
    return [trained_ps(i, 2) for i in range(2)]


def arrays_of(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as npz:
        return {k: npz[k] for k in npz.files}


def assert_same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# -- URIs --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("uri", "scheme", "where"),
    [
        ("file:///var/ckpt", "file", "/var/ckpt"),
        ("/var/ckpt", "file", "/var/ckpt"),
        ("s3://bucket/a/b/", "s3", "bucket:a/b"),
        ("s3://bucket", "s3", "bucket:"),
    ],
)
def test_accepted_uris(uri: str, scheme: str, where: str) -> None:
    location = parse_checkpoint_uri(uri)
    assert location.scheme == scheme
    got = str(location.path) if scheme == "file" else f"{location.bucket}:{location.prefix}"
    assert got == where


@pytest.mark.parametrize("uri", ["ftp://x", "s3://", "file://host/x", "gs://b/p", ""])
def test_a_bad_uri_names_the_parameter_and_what_is_accepted(uri: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_checkpoint_uri(uri)
    message = str(info.value)
    assert message.startswith(f"checkpoint_uri={uri!r}")
    assert "accepted: file:///path (or a plain path), s3://bucket/prefix" in message


def test_multipart_settings_are_checked() -> None:
    with pytest.raises(ValueError, match=r"multipart_chunksize=1024: accepted: bytes >= 5242880"):
        transfer_config(multipart_chunksize=1024)
    with pytest.raises(ValueError, match="multipart_threshold=0"):
        transfer_config(multipart_threshold=0)


# -- samples -----------------------------------------------------------------------------------
def test_samples_come_from_the_committed_shard_queue(job: JobDir, pss: list[Any]) -> None:
    """The samples of the shards done at the snapshot: the job's own ``samples_done``."""
    directory = commit_checkpoint(job, 1, done_shards=7, pss=pss)
    record = json.loads((directory / "queue.json").read_text())
    assert checkpoint_samples(record) == (shard_queue(7).done_samples, 10_000)
    assert checkpoint_samples(record)[0] == 3500
    with pytest.raises(ValueError, match="holds no shard queue"):
        checkpoint_samples({"done": []})


# -- both stores -------------------------------------------------------------------------------
def test_upload_list_and_download_a_real_checkpoint(
    store: CheckpointStore, job: JobDir, pss: list[ParameterServer], tmp_path: Path
) -> None:
    directory = commit_checkpoint(job, 1, done_shards=4, pss=pss)
    stored = upload_checkpoint(directory, store)

    assert store.list_checkpoints() == ["ckpt-000001"]
    assert store.list_objects() == {
        "LATEST": len(b"ckpt-000001"),
        **{f"ckpt-000001/{p.name}": p.stat().st_size for p in directory.iterdir()},
    }
    manifest = read_manifest(directory)
    assert stored.summary() == {
        "name": "ckpt-000001",
        "number": 1,
        "uri": store.uri_of("ckpt-000001"),
        "samples": 2000,
        "samples_total": 10_000,
        "checksums": {name: d.sha256 for name, d in manifest.items()},
        "bytes": sum(d.bytes for d in manifest.values()),
        "manifest_sha256": json.loads((directory / "queue.json").read_text())["checkpoint"][
            "sha256"
        ],
    }
    assert latest_remote_checkpoint(store) == stored

    restored = download_checkpoint(store, "ckpt-000001", tmp_path / "restored")
    assert restored == tmp_path / "restored" / "ckpt-000001"
    for ps in pss:  # byte for byte the partition each PS had
        assert_same_arrays(arrays_of(restored / f"ps-{ps.index}.npz"), ps.snapshot())
    fresh = ParameterServer(1, 2, LAYOUT, Optimizer("adagrad", 0.1), 5)
    fresh.restore(arrays_of(restored / "ps-1.npz"))
    assert_same_arrays(fresh.snapshot(), pss[1].snapshot())


def test_parts_then_manifest_then_latest(
    store: CheckpointStore, job: JobDir, pss: list[ParameterServer]
) -> None:
    """The publication order that keeps a half-written checkpoint from being the latest."""
    writes: list[str] = []
    put_file, put_bytes = store.put_file, store.put_bytes

    def spy_file(local: Path, key: str) -> None:
        writes.append(key)
        put_file(local, key)

    def spy_bytes(key: str, data: bytes) -> None:
        writes.append(key)
        put_bytes(key, data)

    store.put_file = spy_file  # type: ignore[method-assign]
    store.put_bytes = spy_bytes  # type: ignore[method-assign]
    upload_checkpoint(commit_checkpoint(job, 1, 2, pss), store)
    parts = ["ckpt-000001/ps-0.npz", "ckpt-000001/ps-1.npz"]
    assert writes == [*parts, "ckpt-000001/queue.json", LATEST]
    writes.clear()
    upload_checkpoint(job.checkpoint_dir(1), store)  # already stored whole: nothing written
    assert writes == []


def test_an_upload_cut_short_leaves_the_previous_checkpoint_the_latest(
    store: CheckpointStore, job: JobDir, pss: list[ParameterServer]
) -> None:
    upload_checkpoint(commit_checkpoint(job, 1, 2, pss), store)
    put_file = store.put_file

    def failing(local: Path, key: str) -> None:
        if key.endswith("ps-1.npz"):
            raise StorageError(f"{key}: connection reset")
        put_file(local, key)

    store.put_file = failing  # type: ignore[method-assign]
    with pytest.raises(StorageError, match="connection reset"):
        upload_checkpoint(commit_checkpoint(job, 2, 6, pss), store)
    assert store.read_bytes(LATEST) == b"ckpt-000001"
    assert "ckpt-000002/ps-0.npz" in store.list_objects()  # the half that went up
    latest = latest_remote_checkpoint(store)
    assert latest is not None and (latest.name, latest.samples) == ("ckpt-000001", 1000)

    store.put_file = put_file  # type: ignore[method-assign]
    assert upload_checkpoint(job.checkpoint_dir(2), store).name == "ckpt-000002"  # retried
    latest = latest_remote_checkpoint(store)
    assert latest is not None and (latest.name, latest.samples) == ("ckpt-000002", 3000)


def test_the_last_n_are_kept_and_leftovers_go(
    store: CheckpointStore, job: JobDir, pss: list[ParameterServer], tmp_path: Path
) -> None:
    stray = tmp_path / "stray.bin"
    stray.write_bytes(b"x" * 10)
    store.put_file(stray, "ckpt-000002/ps-7.npz")  # a half-uploaded one, never committed
    for number in (1, 3, 4, 5):
        upload_checkpoint(commit_checkpoint(job, number, number, pss), store, keep=2)
    assert store.list_checkpoints() == ["ckpt-000004", "ckpt-000005"]
    upload_checkpoint(commit_checkpoint(job, 6, 6, pss), store, keep=3)
    assert store.list_checkpoints() == ["ckpt-000004", "ckpt-000005", "ckpt-000006"]


def test_a_stale_upload_under_the_same_name_is_replaced(
    store: CheckpointStore, job: JobDir, pss: list[ParameterServer], tmp_path: Path
) -> None:
    """A name reused after an abandoned upload: its old objects go before the new ones."""
    stray = tmp_path / "stray.bin"
    stray.write_bytes(b"old")
    store.put_file(stray, "ckpt-000001/ps-9.npz")
    store.put_file(stray, "ckpt-000001/ps-0.npz")
    upload_checkpoint(commit_checkpoint(job, 1, 1, pss), store)
    assert sorted(store.list_objects("ckpt-000001")) == [
        "ckpt-000001/ps-0.npz",
        "ckpt-000001/ps-1.npz",
        "ckpt-000001/queue.json",
    ]


def test_latest_never_moves_back(
    store: CheckpointStore, job: JobDir, pss: list[ParameterServer], caplog: Any
) -> None:
    upload_checkpoint(commit_checkpoint(job, 1, 1, pss), store)
    upload_checkpoint(commit_checkpoint(job, 2, 2, pss), store)
    store.delete("ckpt-000001")
    with caplog.at_level(logging.WARNING, "airflow_rover.storage"):
        upload_checkpoint(job.checkpoint_dir(1), store)
    assert store.read_bytes(LATEST) == b"ckpt-000002"
    assert "ckpt-000001 stored in" in caplog.text and "LATEST names the newer" in caplog.text


def test_a_corrupt_local_checkpoint_is_not_uploaded(
    store: CheckpointStore, job: JobDir, pss: list[ParameterServer]
) -> None:
    directory = commit_checkpoint(job, 1, 1, pss)
    flip_byte(directory / "ps-0.npz")
    with pytest.raises(CorruptCheckpoint, match=r"ps-0.npz: checksum mismatch.*not uploaded"):
        upload_checkpoint(directory, store)
    assert store.list_objects() == {}
    with pytest.raises(ValueError, match=r"local_checkpoint_dir=.*accepted: .*ckpt-<n>"):
        upload_checkpoint(job.checkpoints, store)
    with pytest.raises(ValueError, match=r"keep=0: accepted: an integer >= 1"):
        upload_checkpoint(directory, store, keep=0)


def test_a_downloaded_checkpoint_is_one_the_job_resumes_from(
    store: CheckpointStore, job: JobDir, pss: list[ParameterServer], tmp_path: Path
) -> None:
    """Restored into a new job directory, ``JobDir.latest_checkpoint`` takes it."""
    upload_checkpoint(commit_checkpoint(job, 3, 5, pss, job_id="job-1"), store)
    fresh = JobDir(tmp_path / "new-job")
    restored = restore_latest_checkpoint(store, fresh.checkpoints, "job-1")
    assert restored == fresh.checkpoint_dir(3)
    fresh.commit_checkpoint(restored)
    assert fresh.latest_checkpoint() == restored
    assert not [p for p in fresh.checkpoints.iterdir() if p.name.startswith(".")]


def test_the_mirror_uploads_in_the_background_and_never_raises(
    store: CheckpointStore, job: JobDir, pss: list[ParameterServer], caplog: Any
) -> None:
    mirror = CheckpointMirror(store, keep=2)
    try:
        mirror.submit(commit_checkpoint(job, 1, 1, pss))
        assert mirror.flush(timeout=30)
        assert mirror.last is not None and mirror.last.name == "ckpt-000001"
        bad = commit_checkpoint(job, 2, 2, pss)
        flip_byte(bad / "ps-1.npz")
        with caplog.at_level(logging.WARNING, "airflow_rover.storage"):
            mirror.submit(bad)
            assert mirror.flush(timeout=30)
        assert mirror.last_error is not None and "checksum mismatch" in mirror.last_error
        assert "checkpoint ckpt-000002 not stored in" in caplog.text
        assert store.read_bytes(LATEST) == b"ckpt-000001"
    finally:
        assert mirror.close(timeout=30)


# -- S3 ----------------------------------------------------------------------------------------
def test_objects_are_in_the_bucket_and_large_parts_go_multipart(
    s3_endpoint: str, job: JobDir, tmp_path: Path
) -> None:
    """Seen with a plain boto3 client: keys under the prefix; a part above the threshold is a
    multipart object (its ETag ends in ``-<parts>``), a small one is not."""
    bucket = new_bucket(s3_endpoint)
    settings = AwsSettings(ACCESS_KEY, SECRET_KEY, endpoint_url=s3_endpoint)
    transfer = transfer_config(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    store = S3Store(bucket, "ckpts", settings, transfer)
    big = trained_ps(0, 2, dense=1_000_000)  # its part: ~8 MB
    small = trained_ps(1, 2)
    directory = commit_checkpoint(job, 1, 3, [big, small])
    upload_checkpoint(directory, store)

    client = s3_client(s3_endpoint)
    listed = client.list_objects_v2(Bucket=bucket)["Contents"]
    assert sorted(o["Key"] for o in listed) == [
        "ckpts/LATEST",
        "ckpts/ckpt-000001/ps-0.npz",
        "ckpts/ckpt-000001/ps-1.npz",
        "ckpts/ckpt-000001/queue.json",
    ]
    size = (directory / "ps-0.npz").stat().st_size
    assert size > 5 * MiB
    head = client.head_object(Bucket=bucket, Key="ckpts/ckpt-000001/ps-0.npz")
    assert head["ETag"].strip('"').endswith(f"-{-(-size // (5 * MiB))}")
    assert "-" not in client.head_object(Bucket=bucket, Key="ckpts/ckpt-000001/ps-1.npz")["ETag"]

    restored = download_checkpoint(store, "ckpt-000001", tmp_path / "back")
    assert_same_arrays(arrays_of(restored / "ps-0.npz"), big.snapshot())


def test_a_corrupted_object_is_detected_and_the_previous_checkpoint_used(
    s3_store: S3Store, s3_endpoint: str, job: JobDir, pss: list[Any], tmp_path: Path, caplog: Any
) -> None:
    upload_checkpoint(commit_checkpoint(job, 1, 2, pss, job_id="job-1"), s3_store)
    directory = commit_checkpoint(job, 2, 4, pss, job_id="job-1")
    upload_checkpoint(directory, s3_store)
    damaged = tmp_path / "ps-1.npz"
    damaged.write_bytes((directory / "ps-1.npz").read_bytes())
    flip_byte(damaged, at=200)  # same size: only the checksum can tell
    key = "jobs/job-1/checkpoints/ckpt-000002/ps-1.npz"
    s3_client(s3_endpoint).upload_file(str(damaged), s3_store.bucket, key)

    with caplog.at_level(logging.WARNING, "airflow_rover.storage"):
        restored = restore_latest_checkpoint(s3_store, tmp_path / "restore", "job-1")
    assert restored == tmp_path / "restore" / "ckpt-000001"
    assert "checkpoint ckpt-000002 skipped:" in caplog.text
    assert "ps-1.npz: checksum mismatch" in caplog.text
    assert sorted(p.name for p in (tmp_path / "restore").iterdir()) == ["ckpt-000001"]
    with pytest.raises(CorruptCheckpoint, match=r"ckpt-000002: ps-1.npz: checksum mismatch"):
        download_checkpoint(s3_store, "ckpt-000002", tmp_path / "direct")

    # A truncated object is caught from the listing alone, without a download.
    s3_client(s3_endpoint).put_object(Bucket=s3_store.bucket, Key=key, Body=b"short")
    caplog.clear()
    with caplog.at_level(logging.WARNING, "airflow_rover.storage"):
        latest = latest_remote_checkpoint(s3_store)
    assert latest is not None and latest.name == "ckpt-000001"
    assert "ckpt-000002 in s3://" in caplog.text and "ps-1.npz: 5 bytes, the manifest says" in (
        caplog.text
    )


def test_credentials_come_from_an_airflow_connection_and_never_show(
    s3_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    job: JobDir,
    pss: list[Any],
    caplog: Any,
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_ROVER_S3", connection_env(s3_endpoint))
    bucket = new_bucket(s3_endpoint)
    with caplog.at_level(logging.DEBUG, "airflow_rover"):
        store = CheckpointStoreHook("rover_s3").get_store(f"s3://{bucket}/p")
        stored = upload_checkpoint(commit_checkpoint(job, 1, 1, pss), store)
    assert stored.uri == f"s3://{bucket}/p/ckpt-000001"
    assert isinstance(store, S3Store) and store.settings.endpoint_url == s3_endpoint
    for text in (repr(store), caplog.text, json.dumps(stored.summary())):
        assert SECRET_KEY not in text


def test_a_process_without_connections_gets_the_settings_through_its_environment(
    s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, job: JobDir, pss: list[Any]
) -> None:
    """The job's master cannot read Airflow connections: the task hands it the connection's
    settings as boto3's environment, and the master opens the store with no connection."""
    monkeypatch.setenv("AIRFLOW_CONN_ROVER_S3", connection_env(s3_endpoint))
    conn_store = CheckpointStoreHook("rover_s3").get_store("s3://bucket/x")
    assert isinstance(conn_store, S3Store)
    env = conn_store.settings.to_env()
    assert env == {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_ENDPOINT_URL_S3": s3_endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    monkeypatch.delenv("AIRFLOW_CONN_ROVER_S3")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    bucket = new_bucket(s3_endpoint)
    store = open_store(f"s3://{bucket}/p")  # boto3's default chain
    upload_checkpoint(commit_checkpoint(job, 1, 1, pss), store)
    listed = s3_client(s3_endpoint).list_objects_v2(Bucket=bucket)["Contents"]
    assert "p/LATEST" in {o["Key"] for o in listed}


def test_connection_shapes() -> None:
    class Conn:
        conn_id = "c"

        def __init__(self, login: str | None, password: str | None, extra: dict[str, Any]):
            self.login, self.password, self.extra_dejson = login, password, extra

    settings = aws_settings_from_connection(
        Conn(None, None, {"service_config": {"s3": {"endpoint_url": "http://s3:9000"}}})
    )
    assert settings.endpoint_url == "http://s3:9000" and settings.access_key_id is None
    with pytest.raises(ValueError, match=r"aws_conn_id='c': extra \['role_arn'\] needs"):
        aws_settings_from_connection(Conn(None, None, {"role_arn": "arn:aws:iam::1:role/x"}))
    with pytest.raises(ValueError, match="give both the access key id"):
        aws_settings_from_connection(Conn("AKIA", None, {}))


def test_a_missing_bucket_is_a_clear_error(s3_endpoint: str) -> None:
    settings = AwsSettings(ACCESS_KEY, SECRET_KEY, endpoint_url=s3_endpoint)
    store = S3Store("rover-no-such-bucket", "x", settings)
    expected = r"^s3://rover-no-such-bucket/x/: list failed \(NoSuchBucket: "
    with pytest.raises(StorageError, match=expected):
        store.list_checkpoints()
    assert latest_remote_checkpoint(LocalStore("/nonexistent/rover")) is None


def test_refused_credentials_are_an_access_error() -> None:
    """A server that checks keys (moto with IAM checks on) refuses unknown ones: a distinct
    ``StorageAccessDenied`` naming the store and the code, so it is not retried blindly."""
    with moto_server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as endpoint:
        store = S3Store("rover-any", "p", AwsSettings("AKIAUNKNOWN", "nope", endpoint_url=endpoint))
        expected = r"^s3://rover-any/p/LATEST: read failed \(InvalidAccessKeyId: "
        with pytest.raises(StorageAccessDenied, match=expected):
            latest_remote_checkpoint(store)
