"""A training task run again (a retry, a cleared task, a re-triggered run): the fingerprint of
what it trains decides whether it resumes, returns the finished result or trains anew, and a
new model replaces the published one in a single rename, never before it succeeds."""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from moto_server import NUM_SAMPLES, commit_checkpoint, trained_ps

from airflow_rover.core.deadline import JobDeadline
from airflow_rover.core.job_dir import JobDir, atomic_write_json
from airflow_rover.core.model_release import new_model_folder, publish_model, published_folder
from airflow_rover.core.spec import JobSpec, ResourcePlan, TrainingConfig
from airflow_rover.data.fingerprint import training_fingerprint
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.launchers.base import JobDirInUse
from airflow_rover.operators.job_rerun import Rerun, clear_job, rerun_decision
from airflow_rover.storage import ForeignCheckpoint, check_owner

JOB = "daily.train-0123456789"


def dataset(root: Path, num_train: int = 400, seed: int = 7) -> Path:
    config = SyntheticConfig(num_train=num_train, num_eval=100, seed=seed)
    return generate_dataset(root, config).train_dir


def spec_of(train: Path, **fields: Any) -> JobSpec:
    return JobSpec(job_id=fields.pop("job_id", JOB), train_data=str(train), **fields)


# -- the fingerprint ---------------------------------------------------------------------------
def test_the_fingerprint_follows_the_data_and_what_decides_the_model(tmp_path: Path) -> None:
    """Data written again with the same content, another plan or another deadline: the same
    fingerprint. Fewer rows, other values, more epochs: another one."""
    train = dataset(tmp_path / "data")
    first = training_fingerprint(spec_of(train))

    shutil.rmtree(tmp_path / "data")
    dataset(tmp_path / "data")  # the day's ETL ran again: new files, same content
    assert training_fingerprint(spec_of(train)) == first
    other_run = spec_of(
        train,
        plan=ResourcePlan(num_workers=5, num_ps=3),
        deadline=JobDeadline.after(timedelta(hours=1)),
    )
    assert training_fingerprint(other_run) == first

    assert training_fingerprint(spec_of(train, training=TrainingConfig(epochs=2))) != first
    shutil.rmtree(tmp_path / "data")
    dataset(tmp_path / "data", num_train=300)
    assert training_fingerprint(spec_of(train)) != first
    shutil.rmtree(tmp_path / "data")
    dataset(tmp_path / "data", seed=8)
    assert training_fingerprint(spec_of(train)) != first


def test_a_dataset_without_checksums_is_hashed_whole(tmp_path: Path) -> None:
    """A manifest that lists no checksums: a changed byte anywhere changes the fingerprint."""
    train = dataset(tmp_path / "data")
    manifest = train / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"files"', '"unlisted"'))
    first = training_fingerprint(spec_of(train))
    labels = np.load(train / "label.npy")
    labels[200] = 1.0 - labels[200]
    np.save(train / "label.npy", labels)
    assert training_fingerprint(spec_of(train)) != first


def test_the_fingerprint_follows_a_user_models_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    train = dataset(tmp_path / "data")
    package = tmp_path / "code"
    package.mkdir()
    (package / "towers.py").write_text("def build(features):\n    return None\n")
    monkeypatch.syspath_prepend(str(package))
    importlib.invalidate_caches()
    first = training_fingerprint(spec_of(train, model="towers:build"))
    (package / "towers.py").write_text("def build(features):\n    return 1  # changed\n")
    assert training_fingerprint(spec_of(train, model="towers:build")) != first
    sys.modules.pop("towers", None)


# -- the decision ------------------------------------------------------------------------------
def job_here(job_dir: JobDir, spec: JobSpec, state: str, **status: Any) -> dict[str, Any]:
    """``job_dir`` holding ``spec``'s job, last seen in ``state``: its status."""
    job_dir.write_spec(spec)
    mirrored = {"job_id": spec.job_id, "state": state, **status}
    atomic_write_json(job_dir.state_file, mirrored)
    return mirrored


@pytest.fixture
def train(tmp_path: Path) -> Path:
    return dataset(tmp_path / "data")


def fingerprinted(train: Path, **fields: Any) -> JobSpec:
    spec = spec_of(train, **fields)
    return spec.model_copy(update={"fingerprint": training_fingerprint(spec)})


def test_a_new_directory_trains_a_new_job(tmp_path: Path, train: Path) -> None:
    decision = rerun_decision(JobDir(tmp_path / "job"), fingerprinted(train), {"state": "absent"})
    assert decision.rerun is Rerun.FRESH


def test_the_same_finished_job_is_returned_and_the_log_says_so(tmp_path: Path, train: Path) -> None:
    job_dir, spec = JobDir(tmp_path / "job"), fingerprinted(train)
    result = {"samples_trained": 400, "auc": 0.7312}
    status = job_here(job_dir, spec, "succeeded", result=result)
    decision = rerun_decision(job_dir, spec, status)
    assert decision.rerun is Rerun.RETURN
    for part in ["Not training again", "400 samples", "AUC 0.7312", "To train again"]:
        assert part in decision.message, decision.message


def test_changed_data_trains_anew_and_says_the_model_stays(tmp_path: Path, train: Path) -> None:
    job_dir = JobDir(tmp_path / "job")
    status = job_here(job_dir, fingerprinted(train), "succeeded")
    publish_model(job_dir, saved_model(job_dir, "yesterday"))
    shutil.rmtree(tmp_path / "data")
    dataset(tmp_path / "data", num_train=300)
    decision = rerun_decision(job_dir, fingerprinted(train), status)
    assert decision.rerun is Rerun.RETRAIN and decision.replaced == JOB
    assert "stays in place until the new one succeeds" in decision.message
    assert "fingerprint" in decision.message


def test_an_unfinished_job_resumes_and_says_from_where(tmp_path: Path, train: Path) -> None:
    """A retry, or a cleared task of a failed job: its own checkpoint, named in the log with
    the samples it holds."""
    job_dir, spec = JobDir(tmp_path / "job"), fingerprinted(train)
    status = job_here(job_dir, spec, "failed")
    commit_checkpoint(job_dir, 2, 3, [trained_ps(0, 1)], job_id=JOB)
    decision = rerun_decision(job_dir, spec, status)
    assert decision.rerun is Rerun.RESUME
    assert f"from checkpoint ckpt-000002, 1,500 of {NUM_SAMPLES:,} samples done" in (
        decision.message
    )


def test_a_running_job_is_followed_and_another_runs_one_refused(
    tmp_path: Path, train: Path
) -> None:
    job_dir, spec = JobDir(tmp_path / "job"), fingerprinted(train)
    status = job_here(job_dir, spec, "running")
    assert rerun_decision(job_dir, spec, status).rerun is Rerun.REATTACH
    other = fingerprinted(train, job_id="daily.train-backfill")
    with pytest.raises(JobDirInUse, match="running now"):
        rerun_decision(job_dir, other, status)
    assert job_dir.spec_file.exists()


def test_another_runs_ended_job_is_replaced_never_resumed(tmp_path: Path, train: Path) -> None:
    """A backfill of a date whose directory holds the scheduled run's failed job: the new
    job replaces it (its checkpoint names another job); a succeeded one on the same data is
    returned."""
    job_dir, spec = JobDir(tmp_path / "job"), fingerprinted(train)
    backfill = fingerprinted(train, job_id="daily.train-backfill")
    failed = job_here(job_dir, spec, "failed")
    decision = rerun_decision(job_dir, backfill, failed)
    assert decision.rerun is Rerun.RETRAIN and decision.replaced == JOB
    succeeded = job_here(job_dir, spec, "succeeded")
    assert rerun_decision(job_dir, backfill, succeeded).rerun is Rerun.RETURN


def test_a_checkpoint_of_an_earlier_run_on_other_data_is_not_resumed() -> None:
    queue = {"job_id": JOB, "fingerprint": "a" * 32}
    check_owner(queue, JOB, "ckpt-000001", "a" * 32)
    with pytest.raises(ForeignCheckpoint, match="earlier run of job"):
        check_owner(queue, JOB, "ckpt-000001", "b" * 32)


def test_clearing_a_job_keeps_the_published_model_and_the_credentials(tmp_path: Path) -> None:
    job_dir = JobDir(tmp_path / "job")
    job_dir.root.mkdir()
    token = job_dir.ensure_token()
    publish_model(job_dir, saved_model(job_dir, "old"))
    for path in (job_dir.state_file, job_dir.spec_file, job_dir.log_file("worker-0")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    commit_checkpoint(job_dir, 1, 1, [trained_ps(0, 1)], job_id=JOB)
    clear_job(job_dir)
    kept = sorted(p.name for p in job_dir.root.iterdir())
    assert kept == ["model", "models", "token"]
    assert job_dir.read_token() == token
    assert (job_dir.model_dir / "ps-0.npz").read_text() == "old"


# -- publishing a model ------------------------------------------------------------------------
def saved_model(job_dir: JobDir, content: str) -> Path:
    """A model saved into a folder of ``models/``, as the master saves one."""
    folder = new_model_folder(job_dir)
    folder.mkdir(parents=True)
    (folder / "ps-0.npz").write_text(content)
    (folder / "model.json").write_text("{}")
    return folder


def test_a_new_model_replaces_the_published_one_at_once(tmp_path: Path) -> None:
    """``model`` is a relative link swapped by one rename: a reader that opened the old model
    reads it whole; the one before is kept for such readers, older ones deleted."""
    job_dir = JobDir(tmp_path / "job")
    first = saved_model(job_dir, "day-1")
    publish_model(job_dir, first)
    assert (job_dir.model_dir / "ps-0.npz").read_text() == "day-1"
    assert not os.path.isabs(os.readlink(job_dir.model_dir))

    second = saved_model(job_dir, "day-1 again")
    with open(job_dir.model_dir / "ps-0.npz") as reader:
        publish_model(job_dir, second)
        assert reader.read() == "day-1"
    assert published_folder(job_dir) == second.resolve()
    assert (job_dir.model_dir / "ps-0.npz").read_text() == "day-1 again"

    third = saved_model(job_dir, "day-1, changed data")
    publish_model(job_dir, third)
    assert sorted(p.name for p in job_dir.saved_models.iterdir()) == sorted(
        [second.name, third.name]
    )


def test_a_model_folder_of_an_older_version_is_moved_under_models(tmp_path: Path) -> None:
    job_dir = JobDir(tmp_path / "job")
    job_dir.model_dir.mkdir(parents=True)
    (job_dir.model_dir / "ps-0.npz").write_text("legacy")
    publish_model(job_dir, saved_model(job_dir, "new"))
    assert (job_dir.model_dir / "ps-0.npz").read_text() == "new"
    folders = [p for p in job_dir.saved_models.iterdir()]
    assert sorted((p / "ps-0.npz").read_text() for p in folders) == ["legacy", "new"]


def test_only_a_folder_of_models_is_published(tmp_path: Path) -> None:
    job_dir = JobDir(tmp_path / "job")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(ValueError, match="published from"):
        publish_model(job_dir, elsewhere)
