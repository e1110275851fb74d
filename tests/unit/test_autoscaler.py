"""The master's autoscaler: one proposal waits at a time, only an urgent rule (a predicted OOM)
replaces it, and proposals carry the fitted model's expected gain for the cluster arbiter."""

from __future__ import annotations

import collections

from airflow_rover.core.plans import PlanRecord
from airflow_rover.core.spec import AutoscaleConfig, ResourcePlan
from airflow_rover.core.throughput import JobShape
from airflow_rover.master.autoscaler import Autoscaler, NodeSample, Profiler

NOW = 1_000_000.0  # the tests' clock; each autoscaler's plan started 1000 s before it
CONFIG = AutoscaleConfig(sampling_s=0, min_plan_interval_s=0, max_workers=8, cpu_budget=64)


def plan(workers: int, ps: int = 1, ps_memory_mb: int = 1024) -> ResourcePlan:
    return ResourcePlan(num_workers=workers, num_ps=ps, ps_memory_mb=ps_memory_mb)


def profiler(ps_cpu: float = 0.9, ps_memory_growth_mb_s: float = 0.0) -> Profiler:
    """Two workers and one PS as the profiler saw them; the PS memory grows as given."""
    prof = Profiler(lambda _node: None)
    trend = collections.deque((NOW - 10 * i, 600 + ps_memory_growth_mb_s * -10 * i)
                              for i in reversed(range(12)))  # fmt: skip
    prof.nodes = {
        "ps-0": NodeSample("ps", cpu_used=ps_cpu, memory_mb=trend[-1][1], trend=trend),
        "worker-0": NodeSample("worker", cpu_used=1.0, memory_mb=900),
        "worker-1": NodeSample("worker", cpu_used=1.0, memory_mb=900),
    }
    return prof


STEPS = {"worker-0": 10.0, "worker-1": 10.0}


def fresh() -> Autoscaler:
    """An autoscaler whose plan has run for 1000 s of the tests' clock."""
    autoscaler = Autoscaler(CONFIG, JobShape(512, 1.0, 1000.0, 16))
    autoscaler.plan_changed(NOW - 1000)
    return autoscaler


def waiting(autoscaler: Autoscaler, rule: str) -> PlanRecord:
    record = PlanRecord.model_validate(
        {"id": 1, "state": "proposed", "rule": rule, "plan": plan(3).model_dump(),
         "previous": plan(2).model_dump()}
    )  # fmt: skip
    autoscaler.plans.append(record)
    return record


def test_a_waiting_proposal_blocks_new_ones_from_ordinary_rules() -> None:
    autoscaler = fresh()
    waiting(autoscaler, "idle_ps")
    assert autoscaler.propose(NOW, plan(2), profiler(ps_cpu=0.1), STEPS, 1e6) is None
    assert len(autoscaler.plans) == 1


def test_a_predicted_oom_replaces_a_waiting_proposal() -> None:
    autoscaler = fresh()
    old = waiting(autoscaler, "idle_ps")
    new = autoscaler.propose(NOW, plan(2), profiler(ps_memory_growth_mb_s=2.0), STEPS, 1e6)
    assert new is not None and new.rule == "predicted_oom" and new.id == 2
    assert new.plan.ps_memory_mb > 1024
    assert old.state == "superseded" and "predicted_oom" in str(old.note)
    assert autoscaler.pending() is new


def test_an_urgent_proposal_that_waits_is_never_replaced() -> None:
    autoscaler = fresh()
    waiting(autoscaler, "predicted_oom")
    assert autoscaler.propose(NOW, plan(2), profiler(ps_memory_growth_mb_s=4.0), STEPS, 1e6) is None


def test_proposals_carry_the_fitted_models_expected_gain() -> None:
    autoscaler = fresh()
    # Two plans seen: with one PS, 1 -> 2 workers went from 20 ms to 22 ms per step.
    for workers, ms in ((1, 20.0), (2, 22.0)):
        autoscaler._plan_since = NOW - 100
        autoscaler.record(NOW, plan(workers), workers * 512 / (ms / 1000), [ms])
    proposal = autoscaler.propose(NOW, plan(2), profiler(ps_cpu=0.1), STEPS, 1e7)
    assert proposal is not None and proposal.plan.num_workers > 2
    assert proposal.expected_gain is not None and proposal.expected_gain > 0
    # Without a model (one plan seen) there is no expected gain to give.
    unfitted = fresh()
    first = unfitted.propose(NOW, plan(2), profiler(ps_cpu=0.1), STEPS, 1e7)
    assert first is not None and "expected_gain" not in first.to_json()
