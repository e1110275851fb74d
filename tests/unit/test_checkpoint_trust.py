"""A checkpoint is trusted only as far as it proves itself (issue 22, findings 1, 2 and 6).

- Parts from a store are written only as plain files of the checkpoint's directory: a part
  key with ``//`` or an absolute path, or a manifest naming ``../x``, writes nothing anywhere.
- The checksum record is required: deleting it from ``queue.json`` does not switch the
  checksums off.
- A job resumes only its own checkpoint, from a store or from its directory, and a launch
  into another job's directory is refused before anything of it is stopped or written.
- Job directory names never collide after sanitising and are never ``.`` or ``..``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from moto_server import (
    commit_checkpoint,
    flip_byte,
    moto_server,
    new_store,
    s3_client,
    trained_ps,
)

from airflow_rover.core.checkpoint_files import (
    QUEUE_FILE,
    RECORD_KEY,
    CorruptCheckpoint,
    checkpoint_record,
    read_manifest,
    verify_checkpoint,
)
from airflow_rover.core.job_dir import JobDir, atomic_write_json
from airflow_rover.core.spec import JobSpec
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.launchers.base import JobDirInUse, write_job
from airflow_rover.launchers.local import LocalBackend
from airflow_rover.operators.job_identity import path_segment
from airflow_rover.ps.server import ParameterServer
from airflow_rover.storage import (
    ForeignCheckpoint,
    LocalStore,
    S3Store,
    download_checkpoint,
    restore_latest_checkpoint,
    upload_checkpoint,
)
from airflow_rover.storage.base import check_key

PREFIX = "jobs/job-1/checkpoints"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def s3_store(s3_endpoint: str) -> S3Store:
    return new_store(s3_endpoint, PREFIX)


@pytest.fixture(scope="module")
def pss() -> list[ParameterServer]:
    return [trained_ps(i, 2) for i in range(2)]


def _put(store: S3Store, endpoint: str, key: str, body: bytes) -> None:
    """An object put behind the store's back (as whoever else can write the bucket would)."""
    s3_client(endpoint).put_object(Bucket=store.bucket, Key=f"{PREFIX}/{key}", Body=body)


# -- finding 1: a stored checkpoint cannot write outside its directory ------------------------
def test_a_part_key_with_a_double_slash_writes_nothing_outside(
    s3_store: S3Store, s3_endpoint: str, tmp_path: Path
) -> None:
    """The reproduction: ``ckpt-000001//<abs path>`` (and the key ``//`` used to collapse
    to) with a ``queue.json`` that has neither the checksum record nor a job id. Before, the
    part was listed as an absolute name and written there; now nothing is restored and the
    target file never exists."""
    outside = tmp_path / "outside.txt"
    _put(s3_store, s3_endpoint, f"ckpt-000001/{outside}", b"owned")  # listed as /tmp/...
    _put(s3_store, s3_endpoint, f"ckpt-000001{outside}", b"owned")  # what a/b read as a//b
    _put(s3_store, s3_endpoint, f"ckpt-000001/{QUEUE_FILE}", json.dumps({"done": []}).encode())
    _put(s3_store, s3_endpoint, "LATEST", b"ckpt-000001")
    assert restore_latest_checkpoint(s3_store, tmp_path / "job" / "checkpoints", "job-1") is None
    with pytest.raises(CorruptCheckpoint, match="no checksum record"):
        download_checkpoint(s3_store, "ckpt-000001", tmp_path / "direct")
    assert not outside.exists()
    assert not (tmp_path / "direct" / "ckpt-000001").exists()


@pytest.mark.parametrize("part", ["../outside.txt", "/tmp/outside.txt", "a/b.npz", ".hidden", ""])
def test_a_manifest_naming_a_path_is_refused(tmp_path: Path, part: str) -> None:
    directory = tmp_path / "ckpt-000001"
    directory.mkdir()
    record = checkpoint_record({"done": []}, {})
    record[RECORD_KEY]["parts"] = {part: {"sha256": "0" * 64, "bytes": 1}}
    atomic_write_json(directory / QUEUE_FILE, record)
    with pytest.raises(CorruptCheckpoint):
        read_manifest(directory)


@pytest.mark.parametrize("key", ["a//b", "/a", "a/./b", "a/../b", "", "a/"])
def test_store_keys_with_empty_or_dot_segments_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match="invalid store key"):
        check_key(key)
    assert check_key("ckpt-000001/ps-0.npz") == "ckpt-000001/ps-0.npz"


# -- finding 6: the checksum record is required ----------------------------------------------
def test_deleting_the_checksum_record_does_not_switch_checksums_off(
    tmp_path: Path, pss: list[ParameterServer]
) -> None:
    job = JobDir(tmp_path / "job")
    directory = commit_checkpoint(job, 1, 2, pss, job_id="job-1")
    flip_byte(directory / "ps-0.npz")  # same size: only the checksum can tell
    queue = json.loads((directory / QUEUE_FILE).read_text())
    del queue[RECORD_KEY]
    atomic_write_json(directory / QUEUE_FILE, queue)
    assert verify_checkpoint(directory) == f"{QUEUE_FILE} has no checksum record ('checkpoint')"
    assert job.latest_checkpoint() is None  # the corrupt part is never resumed from


# -- finding 2: a job resumes only its own checkpoint -----------------------------------------
def test_a_stored_checkpoint_of_another_job_is_not_restored(
    tmp_path: Path, pss: list[ParameterServer]
) -> None:
    store = LocalStore(tmp_path / "durable")
    upload_checkpoint(commit_checkpoint(JobDir(tmp_path / "a"), 1, 2, pss, job_id="job-a"), store)
    with pytest.raises(ForeignCheckpoint, match=r"of job 'job-a', not of job 'job-b'"):
        restore_latest_checkpoint(store, tmp_path / "b" / "checkpoints", "job-b")
    assert not (tmp_path / "b" / "checkpoints").exists()
    assert restore_latest_checkpoint(store, tmp_path / "a2" / "checkpoints", "job-a") is not None


def test_a_master_refuses_another_jobs_checkpoint_in_its_directory(
    tmp_path: Path, pss: list[ParameterServer]
) -> None:
    """A directory holding job A's checkpoint: job B's master does not begin at A's done
    queue (the reproduction began at 300/300 done and would have succeeded untrained)."""
    from airflow_rover.master.job import JobMaster
    from airflow_rover.master.node_launcher import NodeLauncher

    class NoNodes(NodeLauncher):
        def start(self, node_id: str, role: str) -> None: ...  # type: ignore[override]

        def exit_codes(self) -> dict[str, int | None]:
            return {}

        def stop(self, node_id: str) -> None: ...

        def stop_all(self) -> None: ...

    data = generate_dataset(tmp_path / "data", SyntheticConfig(num_train=500, num_eval=100))
    job = JobDir(tmp_path / "job")
    commit_checkpoint(job, 1, 2, pss, job_id="job-a")
    spec = JobSpec(job_id="job-b", train_data=str(data.train_dir), features=_FEATURES)
    with pytest.raises(ForeignCheckpoint, match=r"of job 'job-a', not of job 'job-b'"):
        JobMaster(job, spec, NoNodes(), "token")


def test_a_launch_into_another_jobs_directory_is_refused_first(tmp_path: Path) -> None:
    job = JobDir(tmp_path / "job")
    job.root.mkdir()
    job.write_spec(JobSpec(job_id="job-a", train_data=str(tmp_path), features=_FEATURES))
    atomic_write_json(job.master_file, {"pid": 1, "keeper_pid": 1})  # a master not to touch
    mine = JobSpec(job_id="job-b", train_data=str(tmp_path), features=_FEATURES)
    with pytest.raises(JobDirInUse, match=r"directory of job 'job-a', not of 'job-b'"):
        LocalBackend().launch(job, mine)
    with pytest.raises(JobDirInUse):
        write_job(job, mine)
    assert job.read_spec().job_id == "job-a" and job.master_info() == {"pid": 1, "keeper_pid": 1}


# -- job directory names ----------------------------------------------------------------------
def test_job_directory_names_never_collide_and_never_climb() -> None:
    colon, underscore = (
        "scheduled__2026-11-25T00:00:00+00:00",
        "scheduled__2026-11-25T00_00_00_00_00",
    )
    assert path_segment(colon) != path_segment(underscore)
    assert path_segment(underscore) == underscore  # a plain name stays as it is
    assert path_segment("manual__1") == "manual__1"
    for value in ("..", ".", "", ".hidden", "a/../b", "/etc"):
        segment = path_segment(value)
        assert segment not in ("", ".", "..") and "/" not in segment
        assert not segment.startswith(".")


_FEATURES = {
    "num_dense": 1,
    "tables": [{"name": "t", "column": "c", "vocab_size": 10, "dim": 4}],
}
