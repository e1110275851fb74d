"""A person's stop (``final``) ends the job and says no retry should resume it; the stop the
deadline or a signal asks for leaves the retry to Airflow."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from master_rig import start_running

from airflow_rover.operators.job_result import raise_job_ended


@pytest.mark.parametrize("final", [True, False])
def test_a_final_stop_fails_the_task_without_retry(make_job, final: bool) -> None:
    job = make_job()
    start_running(job)
    body = {"reason": "stopped from the Airflow UI by ops", "final": final}
    assert job.post("/stop", body)["state"] == "stopped"
    status = job.get("/status")
    failure = status["failure"]
    if final:
        assert failure == {"kind": "stopped", "retryable": False, "reason": body["reason"]}
    else:
        assert failure is None
    expected = AirflowFailException if final else AirflowException
    with pytest.raises(expected) as raised:
        raise_job_ended(status["job_id"], status["state"], status["message"], failure)
    assert type(raised.value) is expected
    assert "by ops" in str(raised.value)
