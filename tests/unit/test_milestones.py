"""``Milestone``: when a waiting task counts a job as far enough, and when it never will be."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from airflow_rover.core.milestones import Milestone
from airflow_rover.core.states import JobState


def status(
    state: str, samples: int = 0, auc: float | None = None, job_id: str = "job-1"
) -> dict[str, Any]:
    """A status dict shaped like the master's ``/status`` answer."""
    return {
        "job_id": job_id,
        "state": state,
        "message": "",
        "progress": {"samples_done": samples, "samples_total": 10_000},
        "evaluation": None if auc is None else {"auc": auc, "logloss": 0.5, "samples": 100},
    }


def test_default_milestone_is_reached_only_when_the_job_succeeded() -> None:
    """The default waits for ``succeeded`` and nothing else."""
    milestone = Milestone()
    assert milestone.states == (JobState.SUCCEEDED,)
    assert milestone.reached(status("succeeded"))
    for state in ("pending", "running", "evaluating", "failed", "stopped", "absent"):
        assert not milestone.reached(status(state, samples=10**9, auc=1.0)), state


@pytest.mark.parametrize("state", ["pending", "running", "evaluating", "absent", "unreachable"])
def test_a_job_that_has_not_ended_has_not_missed_anything(state: str) -> None:
    """Non-terminal (and unknown-yet) states mean: keep waiting."""
    assert Milestone().missed(status(state)) is None
    assert Milestone(states=(), min_auc=0.9).missed(status(state)) is None


def test_states_milestone_matches_any_listed_state() -> None:
    """A milestone on states is reached in any of them, given as enum members or strings."""
    milestone = Milestone.model_validate({"states": ["running", "evaluating"]})
    assert milestone.reached(status("running"))
    assert milestone.reached(status("evaluating"))
    assert not milestone.reached(status("pending"))


def test_min_samples_is_reached_at_the_threshold_not_before() -> None:
    """``min_samples`` counts ``progress.samples_done``, inclusive."""
    milestone = Milestone(states=(), min_samples=1000)
    assert not milestone.reached(status("running", samples=999))
    assert milestone.reached(status("running", samples=1000))
    assert milestone.reached(status("running", samples=5000))


def test_a_status_without_progress_counts_zero_samples() -> None:
    """A status with no (or a null) ``progress`` is not a crash, just zero samples."""
    milestone = Milestone(states=(), min_samples=1)
    assert not milestone.reached({"state": "running"})
    assert not milestone.reached({"state": "running", "progress": None})


def test_min_auc_is_reached_at_the_threshold_and_needs_an_evaluation() -> None:
    """``min_auc`` compares ``evaluation.auc`` inclusively; no evaluation yet is not reached."""
    milestone = Milestone(states=(), min_auc=0.7)
    assert not milestone.reached(status("evaluating"))
    assert not milestone.reached(status("succeeded", auc=0.69))
    assert milestone.reached(status("succeeded", auc=0.7))
    assert milestone.reached(status("succeeded", auc=0.81))


def test_any_one_condition_is_enough() -> None:
    """States, samples and AUC are alternatives: whichever comes first reaches the milestone."""
    milestone = Milestone(states=(JobState.SUCCEEDED,), min_samples=500, min_auc=0.9)
    assert milestone.reached(status("succeeded", samples=0, auc=0.1))
    assert milestone.reached(status("running", samples=500))
    assert milestone.reached(status("evaluating", samples=0, auc=0.95))
    assert not milestone.reached(status("running", samples=499, auc=0.89))


@pytest.mark.parametrize("state", ["failed", "stopped"])
def test_terminal_without_milestone_is_missed_with_the_job_id(state: str) -> None:
    """A job that ended short of the milestone is missed; the reason names job, state and goal."""
    milestone = Milestone(min_samples=1000)
    reason = milestone.missed(status(state, samples=10, job_id="train-abc123"))
    assert reason is not None
    assert "train-abc123" in reason
    assert state in reason
    assert milestone.describe() in reason


def test_succeeded_below_the_auc_goal_is_missed() -> None:
    """With ``states=[]`` even success is a miss when the AUC goal was not met."""
    milestone = Milestone(states=(), min_auc=0.9)
    reason = milestone.missed(status("succeeded", auc=0.6, job_id="j-7"))
    assert reason == "job j-7 ended succeeded before the milestone auc >= 0.9"


def test_a_milestone_reached_before_the_job_failed_is_not_missed() -> None:
    """Samples trained before a failure still count: reached wins over missed."""
    milestone = Milestone(states=(), min_samples=100)
    job = status("failed", samples=100)
    assert milestone.reached(job)
    assert milestone.missed(job) is None


def test_describe_lists_every_condition() -> None:
    """``describe`` says what is awaited, in the order states, samples, AUC."""
    assert Milestone().describe() == "state in ['succeeded']"
    assert Milestone(states=(), min_samples=10).describe() == "samples >= 10"
    assert (
        Milestone(states=(JobState.RUNNING,), min_samples=10, min_auc=0.75).describe()
        == "state in ['running'] or samples >= 10 or auc >= 0.75"
    )


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"states": []}, "give at least one of states, min_samples, min_auc"),
        ({"min_samples": 0}, "min_samples"),
        ({"min_auc": 1.5}, "min_auc"),
        ({"min_auc": 0.0}, "min_auc"),
        ({"states": ["done"]}, "states"),
        ({"min_acu": 0.7}, "min_acu"),
    ],
)
def test_invalid_milestones_are_rejected(fields: dict[str, Any], named: str) -> None:
    """Nothing to wait for, out-of-range goals, unknown states and typos are all refused."""
    with pytest.raises(ValidationError, match=named):
        Milestone.model_validate(fields)


def test_json_round_trip_keeps_the_milestone() -> None:
    """The JSON form the trigger carries validates back to an equal milestone."""
    milestone = Milestone(states=(JobState.RUNNING,), min_samples=5, min_auc=0.6)
    assert Milestone.model_validate(milestone.model_dump(mode="json")) == milestone
