"""A run's ``checkpoint_uri`` must not hold another job's checkpoints: the job would resume
from them (or prune them). The task refuses before launching, naming both jobs."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException
from moto_server import commit_checkpoint, trained_ps

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.spec import JobSpec
from airflow_rover.operators.training import ElasticTrainingOperator
from airflow_rover.storage import open_store, upload_checkpoint


def operator(uri: str) -> ElasticTrainingOperator:
    with DAG(dag_id="daily", schedule=None, start_date=datetime(2026, 1, 1)):
        return ElasticTrainingOperator(task_id="train", train_data="/d", checkpoint_uri=uri)


def spec(job_id: str, uri: str) -> JobSpec:
    return JobSpec(job_id=job_id, train_data="/d", checkpoint_uri=uri)


@pytest.fixture
def store_uri(tmp_path: Path) -> str:
    """A store holding checkpoint 1 of job ``daily.train-yesterday``."""
    layout = JobDir(tmp_path / "job")
    directory = commit_checkpoint(layout, 1, 2, [trained_ps(0, 1)], job_id="daily.train-yesterday")
    uri = f"file://{tmp_path / 'store'}"
    upload_checkpoint(directory, open_store(uri))
    return uri


def test_another_jobs_checkpoints_at_the_uri_are_refused(store_uri: str) -> None:
    with pytest.raises(AirflowFailException, match=r"holds checkpoints of job 'daily\.train-yest"):
        operator(store_uri)._check_store_is_this_jobs(spec("daily.train-today", store_uri), None)


def test_the_same_jobs_checkpoints_and_an_empty_store_are_fine(
    store_uri: str, tmp_path: Path
) -> None:
    operator(store_uri)._check_store_is_this_jobs(spec("daily.train-yesterday", store_uri), None)
    empty = f"file://{tmp_path / 'empty'}"
    operator(empty)._check_store_is_this_jobs(spec("daily.train-today", empty), None)


def test_the_checkpoints_of_the_job_a_new_one_replaces_are_deleted(store_uri: str) -> None:
    """A re-run that trains anew in the directory of an ended job (``job_rerun``): that job's
    checkpoints at the URI go, so the new job neither resumes nor keeps them."""
    today = spec("daily.train-today", store_uri)
    operator(store_uri)._check_store_is_this_jobs(today, "daily.train-yesterday")
    assert open_store(store_uri).list_checkpoints() == []
    operator(store_uri)._check_store_is_this_jobs(today, None)  # nothing of another job left


def test_a_bad_uri_is_refused_at_parse_time() -> None:
    with pytest.raises(ValueError, match=r"checkpoint_uri='ftp://x'.*accepted"):
        operator("ftp://x")
