"""Post-scaling rules (DLRover 4.2 "adjust", DLRover-RM 4.3): each fires on its scenario and
stays silent on a healthy job."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from airflow_rover.core.post_scaling import (
    OOM_MIN_SAMPLES,
    JobProfile,
    NodeProfile,
    after_oom,
    hot_ps,
    pending_pods,
    post_scaling,
    predicted_oom,
    straggler,
)
from airflow_rover.core.spec import AutoscaleConfig, ResourcePlan, describe_errors

PLAN = ResourcePlan(num_workers=4, num_ps=3, worker_cpu=4.0, ps_cpu=4.0, ps_memory_mb=4096)


def _ps(i: int, cpu: float, trend: tuple[tuple[float, float], ...] = ()) -> NodeProfile:
    return NodeProfile(f"ps-{i}", "ps", cpu, 2000.0, memory_trend=trend)


def _worker(i: int, step_ms: float = 100.0) -> NodeProfile:
    return NodeProfile(f"worker-{i}", "worker", 3.0, 1000.0, step_time_ms=step_ms)


SAMPLES = max(OOM_MIN_SAMPLES, 4)


def trend(start_mb: float, mb_per_s: float) -> tuple[tuple[float, float], ...]:
    """Memory samples every 30 s, with a little jitter."""
    return tuple(
        (30.0 * i, start_mb + mb_per_s * 30.0 * i + (3.0 if i % 2 else -3.0))
        for i in range(SAMPLES)
    )


FLAT = trend(2000.0, 0.0)


def healthy(plan: ResourcePlan = PLAN) -> JobProfile:
    """PS moderately and evenly busy, memory flat, workers equally fast."""
    ps = tuple(_ps(i, 2.6, FLAT) for i in range(plan.num_ps))
    workers = tuple(_worker(i) for i in range(plan.num_workers))
    return JobProfile(plan, ps + workers)


def with_nodes(*nodes: NodeProfile, plan: ResourcePlan = PLAN) -> JobProfile:
    base = {n.node_id: n for n in healthy(plan).nodes}
    base.update({n.node_id: n for n in nodes})
    return JobProfile(plan, tuple(base.values()))


@pytest.mark.parametrize("rule", [hot_ps, straggler, predicted_oom])
def test_no_rule_fires_on_a_healthy_job(rule) -> None:
    assert rule(healthy()) is None
    assert post_scaling(healthy()) == []


def test_hot_ps_gives_the_saturated_ps_alone_more_cores() -> None:
    profile = with_nodes(_ps(1, 3.9), _ps(0, 0.8), _ps(2, 0.7))
    proposal = hot_ps(profile)
    assert proposal is not None
    assert proposal.rule == "hot_ps" and proposal.nodes == ("ps-1",)
    assert proposal.plan.size_of("ps-1")[0] >= 2 * PLAN.ps_cpu  # the hot PS, bigger
    assert proposal.plan.size_of("ps-1")[1] == PLAN.ps_memory_mb
    for other in ("ps-0", "ps-2"):  # the others as they were
        assert proposal.plan.size_of(other) == PLAN.size_of(other)
    assert proposal.plan.with_counts() == proposal.plan and proposal.plan.num_ps == PLAN.num_ps
    assert proposal.plan.ps_cpu == PLAN.ps_cpu  # the role's size is not touched
    assert "ps-1 cores 4 -> 8" in proposal.reason


def test_hot_ps_judges_a_ps_by_its_own_size() -> None:
    """A hot PS already sized apart: busy against its own cores, doubled from them."""
    plan = PLAN.with_size("ps-0", cpu=2.0)
    proposal = hot_ps(with_nodes(_ps(0, 1.9), _ps(1, 0.5), _ps(2, 0.5), plan=plan))
    assert proposal is not None and proposal.plan.size_of("ps-0")[0] == 4.0
    assert proposal.plan.sizes == ()  # back at the role's size: no longer listed
    sized = PLAN.with_size("ps-0", cpu=8.0)
    at_max = JobProfile(sized, (_ps(0, 7.9), _ps(1, 1.0), _ps(2, 1.0)), max_cpu=8.0)
    assert hot_ps(at_max) is None  # the hot one is at the largest size already


def test_hot_ps_with_the_other_ps_idle_does_not_crash() -> None:
    """The median PS at 0 cores (e.g. PS holding no hot tensor yet) used to divide by zero."""
    proposal = hot_ps(with_nodes(_ps(0, 3.9), _ps(1, 0.0), _ps(2, 0.0)))
    assert proposal is not None and "idle" in proposal.reason


def test_hot_ps_stays_silent_when_all_ps_are_equally_busy_or_at_the_largest_size() -> None:
    overloaded = with_nodes(_ps(0, 3.9), _ps(1, 3.8), _ps(2, 3.9))
    assert hot_ps(overloaded) is None  # every PS is busy: too few PS cores, no hot spot
    big = PLAN.model_copy(update={"ps_cpu": 8.0})
    at_max = JobProfile(big, (_ps(0, 7.9), _ps(1, 1.0), _ps(2, 1.0)), max_cpu=8.0)
    assert hot_ps(at_max) is None  # nothing bigger to ask for


def test_straggler_names_the_slow_worker() -> None:
    proposal = straggler(with_nodes(_worker(2, step_ms=450.0)))
    assert proposal is not None
    assert proposal.nodes == ("worker-2",) and proposal.plan == PLAN


def test_predicted_oom_raises_ps_memory_before_the_limit() -> None:
    growing = trend(3000.0, 1.5)  # 1.5 MB/s: the 4096 MB limit is minutes away
    last = growing[-1][1]
    proposal = predicted_oom(with_nodes(_ps(1, 2.6, growing)))
    assert proposal is not None and proposal.nodes == ("ps-1",)
    # In 600 s it would need last + 900 MB; the new limit has 25% headroom on that.
    assert proposal.plan.ps_memory_mb >= (last + 1.5 * 600) * 1.25 - 10
    assert proposal.plan.ps_memory_mb % 256 == 0
    assert post_scaling(with_nodes(_ps(1, 2.6, growing)))[0].rule == "predicted_oom"


def test_predicted_oom_ignores_slow_growth() -> None:
    slow = trend(2000.0, 0.02)  # hours to go
    assert predicted_oom(with_nodes(_ps(1, 2.6, slow))) is None


def test_after_oom_doubles_that_node_alone_up_to_the_bound() -> None:
    proposal = after_oom(PLAN, "ps-2", max_memory_mb=math.inf)
    assert proposal is not None and proposal.rule == "oom" and proposal.nodes == ("ps-2",)
    assert proposal.plan.size_of("ps-2") == (PLAN.ps_cpu, 2 * PLAN.ps_memory_mb)
    assert proposal.plan.size_of("ps-1") == PLAN.size_of("ps-1")
    assert "ps-2 was killed out of memory at 4096 MB: relaunched with 8192 MB" in proposal.reason
    worker = after_oom(PLAN, "worker-1", max_memory_mb=math.inf)
    assert worker is not None and worker.plan.size_of("worker-1")[1] == 2 * PLAN.worker_memory_mb
    capped = after_oom(PLAN, "ps-0", max_memory_mb=6144)
    assert capped is not None and capped.plan.size_of("ps-0")[1] == 6144
    assert after_oom(PLAN, "ps-0", max_memory_mb=4096) is None  # at its bound: cannot grow


LOW = {"ps": (1.0, 0.0), "worker": (0.0, 0.0)}


def test_pending_pods_drop_waiting_workers_down_to_the_minimum() -> None:
    waits = {"worker-3": 400.0, "worker-2": 350.0, "worker-1": 10.0}
    proposal = pending_pods(PLAN, waits, 300.0, min_workers=1, low=LOW)
    assert proposal is not None and proposal.rule == "pending"
    assert proposal.plan == PLAN.with_counts(num_workers=2)
    assert proposal.nodes == ("worker-2", "worker-3")
    assert "worker-2 for 350 s, worker-3 for 400 s" in proposal.reason
    assert pending_pods(PLAN, waits, 300.0, min_workers=3, low=LOW).plan.num_workers == 3  # type: ignore[union-attr]
    assert pending_pods(PLAN, waits, 300.0, min_workers=4, low=LOW) is None
    assert pending_pods(PLAN, {"worker-3": 299.0}, 300.0, min_workers=1, low=LOW) is None


def test_pending_pods_halve_a_ps_or_a_node_sized_apart_first() -> None:
    big = PLAN.with_size("worker-0", cpu=16.0, memory_mb=16384)
    proposal = pending_pods(big, {"worker-0": 301.0, "worker-3": 900.0}, 300.0, 1, LOW)
    assert proposal is not None and proposal.nodes == ("worker-0",)
    assert proposal.plan.size_of("worker-0") == (8.0, 8192)  # halved, the counts next time
    near = PLAN.with_size("worker-0", cpu=6.0)
    assert pending_pods(near, {"worker-0": 301.0}, 300.0, 1, LOW).plan.sizes == ()  # type: ignore[union-attr]
    ps = pending_pods(PLAN, {"ps-1": 301.0}, 300.0, 1, LOW)
    assert ps is not None and ps.plan.size_of("ps-1") == (2.0, PLAN.ps_memory_mb)  # rows kept
    at_floor = PLAN.model_copy(update={"ps_cpu": 1.0})
    assert pending_pods(at_floor, {"ps-1": 301.0}, 300.0, 1, LOW) is None


@pytest.mark.parametrize("bad", [0, -1, 86_401, "soon"])
def test_pending_timeout_is_validated(bad: object) -> None:
    with pytest.raises(ValidationError) as caught:
        AutoscaleConfig.model_validate({"pending_timeout_s": bad})
    assert "pending_timeout_s" in describe_errors(caught.value)
    assert AutoscaleConfig().pending_timeout_s == 300.0
