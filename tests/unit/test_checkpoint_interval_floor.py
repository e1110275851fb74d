"""The checkpoint interval a job plans from a failure rate has a floor (``interval_floor``):
one clean past run of 10 s must not make a job checkpoint every fraction of a second.

Driven through a real ``JobMaster`` (``master_rig``): each committed checkpoint's measured save
pause re-plans the interval, which the status reports.
"""

from __future__ import annotations

import pytest

from airflow_rover.core.policies import (
    CheckpointCosts,
    CheckpointPolicyConfig,
    FailureHistory,
    interval_floor,
    mtbf_from_history,
    plan_checkpoints,
)
from airflow_rover.core.spec import RecoveryConfig
from airflow_rover.master.checkpointer import CheckpointTimes

ONE_CLEAN_RUN = [FailureHistory(seconds=10.0, num_ps=1, ps_failures=0)]


def recovery_after_a_commit(job, pause_s: float) -> dict:
    """The status's recovery summary once a checkpoint that paused ``pause_s`` committed."""
    times = CheckpointTimes(pause_s=pause_s, durable_s=0.05, bytes=1 << 20)
    job.master.checkpointing.committed(job.layout.checkpoint_dir(1), times)
    return job.status()["recovery"]


def with_history(policy: str = "full") -> CheckpointPolicyConfig:
    return CheckpointPolicyConfig.from_task_params(
        policy, {"mtbf_s": mtbf_from_history(ONE_CLEAN_RUN, 1)}
    )


def test_one_clean_run_gives_twice_its_time_and_a_30_s_interval(make_job) -> None:
    """MTBF 20 s (10 PS-seconds / (0 + 1/2)); a 4 ms save would make the optimum
    sqrt(2 * 0.004 * 20) = 0.4 s, the floor makes it 30 s (on main: MTBF 10 s, 0.28 s)."""
    assert mtbf_from_history(ONE_CLEAN_RUN, 1) == pytest.approx(20.0)
    job = make_job(num_ps=1, checkpoint=with_history())
    recovery = recovery_after_a_commit(job, pause_s=0.004)
    print(recovery["checkpoint_policy_reason"])
    assert recovery["checkpoint_interval_s"] == pytest.approx(30.0)
    assert "raised to the floor" in recovery["checkpoint_policy_reason"]


def test_a_slow_save_floors_the_interval_at_twenty_saves(make_job) -> None:
    """A 2 s save: at least 40 s between saves (saving costs at most 5% of training)."""
    job = make_job(num_ps=1, checkpoint=with_history())
    assert recovery_after_a_commit(job, pause_s=2.0)["checkpoint_interval_s"] == pytest.approx(40)


def test_a_users_own_short_interval_is_the_floor(make_job) -> None:
    """``recovery.checkpoint_interval_s=5``: the user asked for frequent checkpoints; the plan
    may go down to theirs, not below (on main: 0.28 s)."""
    job = make_job(
        num_ps=1, checkpoint=with_history(), recovery=RecoveryConfig(checkpoint_interval_s=5.0)
    )
    assert recovery_after_a_commit(job, pause_s=0.004)["checkpoint_interval_s"] == 5.0


def test_cpr_that_cannot_keep_its_pls_target_above_the_floor_runs_as_full(make_job) -> None:
    """CPR's interval for PLS 0.1 with a 20 s MTBF is 4 s; at the 30 s floor its expected PLS
    is 0.75, so the job runs as full recovery and says why (on main: CPR every 4 s)."""
    job = make_job(num_ps=1, checkpoint=with_history("cpr"))
    recovery = recovery_after_a_commit(job, pause_s=0.004)
    print(recovery["checkpoint_policy_reason"])
    assert recovery["checkpoint_policy"] == "full"
    assert "above cpr.target_pls=0.1" in recovery["checkpoint_policy_reason"]
    assert recovery["checkpoint_interval_s"] == pytest.approx(30.0)
    kept = CheckpointPolicyConfig.from_task_params("cpr", {"mtbf_s": 20.0, "fallback": False})
    costs = CheckpointCosts(
        save_s=0.004, load_s=0.1, mtbf_s=20.0, num_emb_ps=1, min_interval_s=interval_floor(0.004)
    )
    plan = plan_checkpoints(kept, costs)
    assert plan.policy == "cpr" and "kept (cpr.fallback=False)" in plan.reason


def test_ecrms_backup_checkpoint_has_the_floor_too() -> None:
    costs = CheckpointCosts(
        save_s=0.004, load_s=0.1, mtbf_s=20.0, num_emb_ps=3, min_interval_s=interval_floor(0.004)
    )
    cfg = CheckpointPolicyConfig.from_task_params("ecrm", {"k": 2, "mtbf_s": 20.0})
    assert plan_checkpoints(cfg, costs).interval_s == pytest.approx(30.0)
