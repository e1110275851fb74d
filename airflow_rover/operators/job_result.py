"""What a training task returns: the ended job's metrics as its XCom value, the trigger
event status of a job status, and the exception of a job that did not succeed."""

from __future__ import annotations

from typing import Any, NoReturn

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_rover.core.states import JobState

RESULT_KEYS = (
    "samples_trained",
    "samples_resumed",
    "samples_trained_this_run",
    "train_seconds",
    "samples_per_second",
    "auc",
    "logloss",
    "eval_samples",
    "embedding_rows",
    "model_dir",
    "model_folder",
    "plan",
    "accounting",
    "recovery",
    "durable_checkpoint",
    "data_workers",
)


def event_status_of(job: dict[str, Any]) -> str:
    """The trigger event's ``status`` for a job status: ``success`` or the job's state."""
    return "success" if job.get("state") == JobState.SUCCEEDED else str(job.get("state"))


def job_result(job: dict[str, Any]) -> dict[str, Any]:
    """The XCom value of every successful path: the job's metrics, never its token."""
    result = job.get("result") or {}
    return {
        "job_id": job.get("job_id"),
        "state": job.get("state"),
        "duration_s": job.get("duration_s"),
        **{key: result.get(key) for key in RESULT_KEYS},
    }


def raise_job_ended(
    job_id: str | None, state: str, message: str | None, failure: dict[str, Any] | None
) -> NoReturn:
    """Fail the task for a job that did not succeed: without retry (``AirflowFailException``)
    when the master found that no retry can fix it (``failure.retryable`` false: the same
    exception again and again, or nothing left to train), else through Airflow's retries."""
    text = f"Job {job_id} {state}: {message}"
    if isinstance(failure, dict) and failure.get("retryable") is False:
        raise AirflowFailException(text)
    raise AirflowException(text)
