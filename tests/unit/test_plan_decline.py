"""A person declines (or approves) a proposed plan: the master's route over a real
``JobMaster`` (``master_rig``), and the hook against a real master process
(``tests/fixtures/lone_master.py``)."""

from __future__ import annotations

import asyncio
import collections
import json
import sys
import time
from pathlib import Path

import httpx
import pytest
from master_rig import AUTH, Job, P, start_running

from airflow_rover.core.plans import PlanRecord, PlanState
from airflow_rover.core.spec import AutoscaleConfig
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.master.autoscaler import NodeSample

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from lone_master import lone_master, small_job


def _propose(job: Job, **changes: object) -> int:
    """Put a proposal in the autoscaler's list as the optimizer would."""
    current = job.master.spec.plan
    plans = job.master.autoscaler.plans
    plans.append(
        PlanRecord(
            id=len(plans) + 1,
            at=0.0,
            plan=current.model_copy(update=changes),
            previous=current,
            rule="idle_ps",
            reason="test",
        )
    )
    return len(plans)


def test_a_declined_plan_is_never_applied_and_says_why(make_job) -> None:
    job = make_job()
    start_running(job)
    plan_id = _propose(job, num_workers=3)
    record = job.post(f"/plans/{plan_id}/decline", {"reason": "too dear at night"})
    assert record["state"] == "declined" and record["note"] == "declined: too dear at night"
    assert job.post(f"/plans/{plan_id}/apply")["state"] == "declined"
    assert ("worker-2", "worker") not in job.launcher.started
    mirrored = json.loads(job.layout.state_file.read_text())
    assert mirrored["plans"][-1]["state"] == "declined"
    assert job.master.autoscaler.pending() is None  # nothing waits any more


@pytest.mark.parametrize("ended", ["declined", "applied", "superseded"])
def test_declining_a_plan_no_longer_proposed_is_409_naming_its_state(make_job, ended: str) -> None:
    job = make_job()
    start_running(job)
    plan_id = _propose(job, num_workers=3)
    if ended == "declined":
        job.post(f"/plans/{plan_id}/decline", {"reason": "no"})
    elif ended == "applied":
        job.post(f"/plans/{plan_id}/apply")
    else:
        job.post("/plans", {"num_workers": 1})
    before = job.get("/plans")
    reply = job.api.post(f"{P}/plans/{plan_id}/decline", json={"reason": "no"}, headers=AUTH)
    assert reply.status_code == 409
    assert reply.json()["detail"] == (
        f"plan {plan_id} is {ended}: only a proposed plan can be declined"
    )
    assert job.get("/plans") == before


def test_declining_an_unknown_plan_is_404_and_a_bad_reason_422(make_job) -> None:
    job = make_job()
    start_running(job)
    assert (
        job.api.post(P + "/plans/9/decline", json={"reason": "x"}, headers=AUTH).status_code == 404
    )
    plan_id = _propose(job, num_workers=3)
    for body in ({}, {"reason": ""}, {"reason": "x" * 501}, {"reason": "x", "by": "me"}):
        reply = job.api.post(f"{P}/plans/{plan_id}/decline", json=body, headers=AUTH)
        assert reply.status_code == 422, body
    assert job.get("/plans")[-1]["state"] == "proposed"


def test_the_hook_applies_and_declines_plans_through_a_real_master(tmp_path: Path) -> None:
    """Sync and async, each returning the plan's record; a refusal raises with the master's
    reason. (The job is pending here: a plan applied now is declined by the master.)"""
    job_dir = small_job(tmp_path)
    with lone_master(job_dir):
        hook = ElasticJobHook(job_dir.root)
        first = hook.request_plan(num_workers=2, reason="more")
        declined = hook.decline_plan(first.id, "not tonight")
        assert isinstance(declined, PlanRecord)
        assert (declined.id, declined.state) == (first.id, PlanState.DECLINED)
        assert declined.note == "declined: not tonight"
        with pytest.raises(httpx.HTTPStatusError, match=r"409 .*only a proposed plan") as info:
            hook.decline_plan(first.id, "again")
        assert info.value.response.status_code == 409
        with pytest.raises(httpx.HTTPStatusError, match="404"):
            hook.decline_plan(99, "no such plan")

        second = hook.request_plan(num_workers=3)
        record = asyncio.run(hook.async_decline_plan(second.id, "async"))
        assert (record.state, record.note) == (PlanState.DECLINED, "declined: async")

        third = hook.request_plan(num_workers=3)
        applied = hook.apply_plan(third.id)
        assert applied.id == third.id and applied.note == "the job is pending"
        states = [p["state"] for p in hook.get_status()["plans"]]
        assert states == ["declined", "declined", "declined"]


def test_a_job_that_asks_for_approval_says_so_in_its_status(make_job) -> None:
    """``autoscale.plan_approval`` (the operator's ``autoscale``) reaches the status and
    ``state.json``: a reader knows its proposals wait for a person."""
    job = make_job(autoscale=AutoscaleConfig(plan_approval=True))
    job.master.step()
    assert job.status()["plan_approval"] is True
    job.master.mirror_state(force=True)
    assert json.loads(job.layout.state_file.read_text())["plan_approval"] is True


def test_a_decline_starts_the_masters_decline_cooldown(make_job) -> None:
    """The master tells its autoscaler when a person declines: with ``decline_cooldown_s``
    nothing is proposed for that long, even a predicted OOM; after it, proposals resume
    (``test_autoscaler`` covers the rules)."""
    config = AutoscaleConfig(decline_cooldown_s=3600, min_plan_interval_s=0, sampling_s=0)
    job = make_job(autoscale=config)
    start_running(job)
    plan_id = _propose(job, num_workers=3)
    job.post(f"/plans/{plan_id}/decline", {"reason": "not tonight"})
    now = time.time()
    trend = collections.deque((now - 10 * i, 600.0 + 50 * (12 - i)) for i in reversed(range(12)))
    growing = {"ps-0": NodeSample("ps", cpu_used=0.9, memory_mb=840, trend=trend)}
    autoscaler, plan = job.master.autoscaler, job.master.spec.plan
    assert autoscaler.propose(now + 60, plan, growing, {}, 1e6) is None
    later = autoscaler.propose(now + 3660, plan, growing, {}, 1e6)
    assert later is not None and later.rule == "predicted_oom"


def test_a_requested_plan_outside_the_bounds_is_refused_with_422(make_job) -> None:
    job = make_job(autoscale=AutoscaleConfig(max_workers=2))
    start_running(job)
    response = job.api.post(P + "/plans", json={"num_workers": 3}, headers=AUTH)
    assert response.status_code == 422
    assert "plan.num_workers=3 is above autoscale.max_workers=2" in response.json()["detail"]
