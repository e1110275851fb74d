"""A checkpoint policy takes one module and one registry line (``docs/architecture.md``).

``FailFast`` below is such a module: its options, its plan and the one hook it needs (a lost PS
fails the job at once; Airflow's retry starts it again from its checkpoint). Registered with one
line, it is a policy like the others: the operator's and the spec's validation take it, the
master runs it, and no process needed a change.
"""

from __future__ import annotations

from typing import Any

import pytest
from master_rig import start_running
from pydantic import Field

from airflow_rover.core.policies import (
    POLICIES,
    CheckpointCosts,
    CheckpointPlan,
    CheckpointPolicy,
    CheckpointPolicyConfig,
    CheckpointPolicyError,
    MasterPort,
    Overhead,
    PsLoss,
)
from airflow_rover.core.policies.options import PolicyOptions
from airflow_rover.core.spec import JobSpec


# -- the policy's module ---------------------------------------------------------------------
class FailFastOptions(PolicyOptions):
    section = "fail-fast"
    note: str = Field(default="the task's retry restarts it", min_length=1)


class FailFast(CheckpointPolicy):
    """No recovery inside the job: a lost PS fails it, and the retry resumes it."""

    name = "fail-fast"
    Options = FailFastOptions
    options: FailFastOptions

    def __init__(self, options: PolicyOptions, mtbf_s: float | None = None) -> None:
        super().__init__(options, mtbf_s)
        self.losses = 0

    def plan(self, costs: CheckpointCosts) -> CheckpointPlan:
        lost = Overhead(lost=1.0)  # the whole run, once per failure (a model, not a promise)
        return CheckpointPlan("fail-fast", "fail-fast", None, None, lost, 0.0, "fail fast")

    def on_ps_lost(self, master: MasterPort, index: int, cause: str) -> PsLoss | None:
        self.losses += 1
        master.fail(f"{cause}; checkpoint_policy='fail-fast': {self.options.note}")
        return None

    def report(self) -> dict[str, Any]:
        return {"fail_fast_losses": self.losses}

    @classmethod
    def empty_report(cls) -> dict[str, Any]:
        return {"fail_fast_losses": 0}


# -- the tests -------------------------------------------------------------------------------
@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(POLICIES, FailFast.name, FailFast)  # the one registry line


def test_its_options_are_validated_like_the_others(registered: None) -> None:
    config = CheckpointPolicyConfig.from_task_params("fail-fast", {"note": "retry"})
    assert isinstance(config.build(), FailFast) and config.build().options.note == "retry"
    with pytest.raises(CheckpointPolicyError, match=r"accepted: note, mtbf_s$"):
        CheckpointPolicyConfig.from_task_params("fail-fast", {"k": 2})
    spec = JobSpec.model_validate(
        {"job_id": "j", "train_data": "/d", "checkpoint": {"policy": "fail-fast"}}
    )
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec
    with pytest.raises(CheckpointPolicyError, match="accepted: full, cpr, ecrm, fail-fast"):
        CheckpointPolicyConfig.from_task_params("fail-fastest")


def test_unregistered_it_is_no_policy() -> None:
    with pytest.raises(CheckpointPolicyError, match=r"accepted: full, cpr, ecrm$"):
        CheckpointPolicyConfig.from_task_params("fail-fast")


def test_the_master_runs_it(registered: None, make_job) -> None:
    job = make_job(checkpoint=CheckpointPolicyConfig.from_task_params("fail-fast"))
    start_running(job)
    assert job.status()["recovery"]["fail_fast_losses"] == 0
    job.launcher.exit("ps-0", 137)
    job.master.step()
    status = job.status()
    assert status["state"] == "failed"
    assert status["message"] == (
        "ps-0 exited with code 137; checkpoint_policy='fail-fast': the task's retry restarts it"
    )
    recovery = status["recovery"]
    assert recovery["checkpoint_policy"] == "fail-fast" and recovery["fail_fast_losses"] == 1
    assert recovery["ecrm_rebuilds"] == [] and recovery["partial_saves"] == 0
