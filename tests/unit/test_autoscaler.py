"""The master's autoscaler: one proposal waits at a time, only an urgent rule (a predicted OOM)
replaces it, the model proposes from the first observation, and proposals carry the fitted
model's expected gain for the cluster arbiter."""

from __future__ import annotations

import collections

import pytest

from airflow_rover.core.plans import PlanRecord
from airflow_rover.core.spec import AutoscaleConfig, ResourcePlan
from airflow_rover.core.throughput import JobShape
from airflow_rover.master.autoscaler import Autoscaler, NodeSample

NOW = 1_000_000.0  # the tests' clock; each autoscaler's plan started 1000 s before it
CONFIG = AutoscaleConfig(sampling_s=0, min_plan_interval_s=0, max_workers=8, cpu_budget=64)


def plan(workers: int, ps: int = 1, ps_memory_mb: int = 1024) -> ResourcePlan:
    return ResourcePlan(num_workers=workers, num_ps=ps, ps_memory_mb=ps_memory_mb)


def profiler(ps_cpu: float = 0.9, ps_memory_growth_mb_s: float = 0.0) -> dict[str, NodeSample]:
    """Two workers and one PS as the profiler saw them; the PS memory grows as given."""
    trend = collections.deque((NOW - 10 * i, 600 + ps_memory_growth_mb_s * -10 * i)
                              for i in reversed(range(12)))  # fmt: skip
    return {
        "ps-0": NodeSample("ps", cpu_used=ps_cpu, memory_mb=trend[-1][1], trend=trend),
        "worker-0": NodeSample("worker", cpu_used=1.0, memory_mb=900),
        "worker-1": NodeSample("worker", cpu_used=1.0, memory_mb=900),
    }


def observed(autoscaler: Autoscaler, workers: int = 2, ms: float = 20.0) -> None:
    """One throughput sample of ``plan(workers)`` at ``ms`` per step."""
    autoscaler.record(NOW, plan(workers), workers * 512 / (ms / 1000), [ms])


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
    # Without a model (nothing observed yet) there is no expected gain to give.
    unfitted = fresh()
    first = unfitted.propose(NOW, plan(2), profiler(ps_memory_growth_mb_s=2.0), STEPS, 1e7)
    assert first is not None and first.rule == "predicted_oom"
    assert "expected_gain" not in first.to_json()


def test_the_model_proposes_from_the_first_observation() -> None:
    """One plan seen: the paper's coefficients scaled to it are the model, and NSGA-II's plan
    is proposed at once (workers up to the maximum: default 4 for a job started with 2)."""
    autoscaler = bounded()
    observed(autoscaler)
    assert autoscaler.model() is not None
    proposal = autoscaler.propose(NOW, plan(2), profiler(), STEPS, 1e7)
    assert proposal is not None and proposal.rule == "pareto"
    assert proposal.plan.num_workers == 4 and "fitted model" in proposal.reason
    # Node sizes stay as they are where the launcher cannot resize nodes.
    assert (proposal.plan.worker_cpu, proposal.plan.ps_cpu) == (1.0, 1.0)


def test_where_nodes_resize_the_search_tries_node_sizes() -> None:
    """A resizing launcher: the bounds offer every size between the autoscale bounds."""
    config = AutoscaleConfig(max_worker_cpu=8, min_ps_cpu=2, max_ps_cpu=4, cpu_budget=64)
    autoscaler = Autoscaler(config, SHAPE, start=plan(2, ps_memory_mb=1024).model_copy(
        update={"ps_cpu": 2.0}), resizable=True)  # fmt: skip
    bounds = autoscaler.bounds(autoscaler.limits.clamp(plan(2)))
    assert bounds.worker_cpus == (0.5, 1.0, 2.0, 4.0, 8.0)
    assert bounds.ps_cpus == (2.0, 4.0)
    fixed = bounded().bounds(plan(2))
    assert fixed.worker_cpus == (1.0,) and fixed.ps_cpus == (1.0,)


# -- the autoscale bounds ----------------------------------------------------------------------
SHAPE = JobShape(512, 0.25, 1.0, 16)


def bounded(**bounds: float) -> Autoscaler:
    """An autoscaler like ``fresh()``'s, with the given bounds, for a job that started at
    ``plan(2)``."""
    config = AutoscaleConfig(sampling_s=0, min_plan_interval_s=0, cpu_budget=64, **bounds)
    autoscaler = Autoscaler(config, SHAPE, start=plan(2))
    autoscaler.plan_changed(NOW - 1000)
    return autoscaler


def three_ps(hot_cpu: float) -> dict[str, NodeSample]:
    """``profiler()`` with two more PS that idle while ps-0 uses ``hot_cpu`` cores."""
    nodes = profiler(ps_cpu=hot_cpu)
    for node in ("ps-1", "ps-2"):
        nodes[node] = NodeSample("ps", cpu_used=0.05, memory_mb=600)
    return nodes


def test_the_oom_rule_raises_ps_memory_only_up_to_its_maximum() -> None:
    """Unbounded, the OOM rule asks for what the PS needs in 10 min; ``max_ps_memory_mb``
    caps it (the reason says so), and at the cap there is nothing left to propose."""
    growing = profiler(ps_memory_growth_mb_s=2.0)
    free = bounded().propose(NOW, plan(2), growing, STEPS, 1e6)
    assert free is not None and free.rule == "predicted_oom" and free.plan.ps_memory_mb > 1536
    capped = bounded(max_ps_memory_mb=1536).propose(NOW, plan(2), growing, STEPS, 1e6)
    assert capped is not None and capped.rule == "predicted_oom"
    assert capped.plan.ps_memory_mb == 1536
    assert "within the autoscale bounds: ps_memory_mb" in capped.reason
    at_cap = bounded(max_ps_memory_mb=1024).propose(NOW, plan(2), growing, STEPS, 1e6)
    assert at_cap is None or at_cap.rule != "predicted_oom"


def test_the_hot_ps_rule_stays_within_the_ps_cores_maximum() -> None:
    """A hot PS doubles its own cores unbounded; ``max_ps_cpu`` 1.5 caps it; 1.0 (today's)
    leaves nothing to propose."""
    two = plan(2, ps=3)
    free = bounded().propose(NOW, two, three_ps(0.95), STEPS, 1e6)
    assert free is not None and free.rule == "hot_ps" and free.plan.size_of("ps-0")[0] == 2.0
    capped = bounded(max_ps_cpu=1.5).propose(NOW, two, three_ps(0.95), STEPS, 1e6)
    assert capped is not None and capped.rule == "hot_ps"
    assert capped.plan.size_of("ps-0")[0] == 1.5 and capped.plan.ps_cpu == 1.0
    assert "ps-0 cores 1 -> 1.5" in capped.reason
    assert bounded(max_ps_cpu=1.0).propose(NOW, two, three_ps(0.95), STEPS, 1e6) is None


def test_pareto_plans_lie_between_the_minimum_and_the_maximum() -> None:
    """The fitted model likes more workers; the Pareto search spans only the bounds, so its
    plan keeps at least ``min_workers`` and at most ``max_workers`` and ``max_ps``."""
    for bounds in ({"min_workers": 2, "max_workers": 3, "max_ps": 1}, {"max_workers": 6}):
        autoscaler = bounded(**bounds)
        for workers, ms in ((1, 20.0), (2, 22.0)):
            autoscaler._plan_since = NOW - 100
            autoscaler.record(NOW, plan(workers), workers * 512 / (ms / 1000), [ms])
        busy = profiler(ps_cpu=0.9)  # no rule fires: the model decides
        proposal = autoscaler.propose(NOW, plan(2), busy, STEPS, 1e7)
        assert proposal is not None and proposal.rule == "pareto", bounds
        assert autoscaler.limits.admits(proposal.plan), (bounds, proposal.plan)
        assert proposal.plan.num_workers == bounds["max_workers"]


def test_no_proposal_ever_leaves_the_bounds() -> None:
    """Every rule over a grid of profiles and bounds: each proposal is within the bounds."""
    grid = [
        {},
        {"max_workers": 3, "max_ps": 2, "max_ps_cpu": 1.5, "max_ps_memory_mb": 1280},
        {"min_workers": 2, "max_workers": 2, "min_ps": 1, "max_ps": 2, "max_ps_cpu": 1.0},
        {"max_ps_memory_mb": 1024, "max_workers": 5},
    ]
    profiles = [
        profiler(ps_cpu=0.1),
        profiler(ps_cpu=0.9, ps_memory_growth_mb_s=3.0),
        three_ps(0.95),
        three_ps(0.3),
    ]
    seen = 0
    for bounds in grid:
        for prof in profiles:
            for current in (plan(2), plan(2, ps=3)):
                autoscaler = bounded(**bounds)
                observed(autoscaler)
                proposal = autoscaler.propose(NOW, current, prof, STEPS, 1e6)
                if proposal is not None:
                    seen += 1
                    assert autoscaler.limits.admits(proposal.plan), (bounds, proposal)
    assert seen >= 8  # the grid does make the rules fire


def test_a_requested_plan_outside_the_bounds_is_refused() -> None:
    """``request`` (the hook's ``request_plan``) names the bound a plan would break."""
    autoscaler = bounded(max_workers=3, min_ps=1)
    assert autoscaler.request(NOW, plan(2), plan(3), "more").plan.num_workers == 3
    try:
        autoscaler.request(NOW, plan(2), plan(5), "many more")
    except ValueError as exc:
        assert "plan.num_workers=5 is above autoscale.max_workers=3" in str(exc)
    else:
        raise AssertionError("a plan above max_workers was accepted")


def test_a_declined_proposal_starts_the_decline_cooldown() -> None:
    """After a person declines, nothing is proposed for ``decline_cooldown_s``; by default
    (0) the next tick may propose again."""
    for cooldown, expected in ((0.0, True), (600.0, False)):
        autoscaler = bounded(decline_cooldown_s=cooldown)
        observed(autoscaler)
        first = autoscaler.propose(NOW - 60, plan(2), profiler(ps_cpu=0.1), STEPS, 1e8)
        assert first is not None and first.rule == "pareto"
        first.decline("declined: not now")
        autoscaler.declined(NOW - 60)
        # the declined rule is not proposed again for this plan; the OOM rule may be
        again = autoscaler.propose(NOW, plan(2), profiler(ps_memory_growth_mb_s=2.0), STEPS, 1e6)
        assert (again is not None) is expected, cooldown
        later = autoscaler.propose(
            NOW + 600, plan(2), profiler(ps_memory_growth_mb_s=2.0), STEPS, 1e6
        )
        assert later is not None or expected


# -- nodes that share one host (the local launcher) --------------------------------------------
def on_host(host_cores: float | None) -> Autoscaler:
    """``bounded()`` whose nodes share ``host_cores`` cores (None: each node has its own)."""
    config = AutoscaleConfig(sampling_s=0, min_plan_interval_s=0, cpu_budget=64, max_ps=4)
    autoscaler = Autoscaler(config, SHAPE, start=plan(2, ps=2), host_cores=host_cores)
    autoscaler.plan_changed(NOW - 1000)
    return autoscaler


def busy(workers: int, ps: int, worker_cpu: float, ps_cpu: float) -> dict[str, NodeSample]:
    nodes = {f"ps-{j}": NodeSample("ps", cpu_used=ps_cpu) for j in range(ps)}
    for i in range(workers):
        nodes[f"worker-{i}"] = NodeSample("worker", cpu_used=worker_cpu)
    return nodes


def steps(workers: int, ms: float = 20.0) -> dict[str, float]:
    return {f"worker-{i}": ms for i in range(workers)}


def test_on_a_shared_host_idle_ps_are_probed_one_fewer_once() -> None:
    """Every PS idles: one PS fewer, to learn what a PS adds; not once a smaller PS count ran,
    and not where each node has its own cores (there the model counts what a PS costs)."""
    autoscaler = on_host(2.0)
    observed_plan = plan(2, ps=2)
    autoscaler.record(NOW, observed_plan, 2 * 512 / 0.02, [20.0])
    probe = autoscaler.propose(NOW, observed_plan, busy(2, 2, 0.7, 0.15), steps(2), 1e7)
    assert probe is not None and probe.rule == "shared_host_ps"
    assert probe.plan.num_ps == 1 and probe.plan.num_workers == 2
    assert "0.15 cores busy" in probe.reason
    # The probe ran: the PS count is the data's to decide from now on.
    again = on_host(2.0)
    again.propose(NOW, plan(2, ps=1), busy(2, 1, 0.7, 0.3), steps(2), 1e7)
    later = again.propose(NOW, observed_plan, busy(2, 2, 0.7, 0.15), steps(2), 1e7)
    assert later is None or later.rule != "shared_host_ps"
    # A busy PS is not probed away.
    busy_ps = on_host(2.0).propose(NOW, observed_plan, busy(2, 2, 0.7, 0.6), steps(2), 1e7)
    assert busy_ps is None or busy_ps.rule != "shared_host_ps"
    own = on_host(None).propose(NOW, observed_plan, busy(2, 2, 0.7, 0.15), steps(2), 1e7)
    assert own is None or own.rule != "shared_host_ps"


def test_a_saturated_shared_host_gets_no_more_workers() -> None:
    """Two workers keep both cores of the host busy: more workers only share them. With cores
    of their own, the same observations call for more workers."""
    proposals = {}
    for host_cores in (2.0, None):
        autoscaler = on_host(host_cores)
        current = plan(2, ps=1)
        autoscaler.record(NOW, current, 2 * 512 / 0.02, [20.0])
        proposals[host_cores] = autoscaler.propose(
            NOW, current, busy(2, 1, 0.9, 0.5), steps(2), 1e7
        )
    dedicated = proposals[None]
    assert dedicated is not None and dedicated.plan.num_workers > 2
    assert proposals[2.0] is None
    report = on_host(2.0)
    report.record(NOW, plan(2, ps=1), 2 * 512 / 0.02, [20.0])
    report.propose(NOW, plan(2, ps=1), busy(2, 1, 0.9, 0.5), steps(2), 1e7)
    bound = report.host_bound()
    assert bound is not None and bound.cores == pytest.approx(2.0)  # 2.3 busy: all of it
    assert bound.step_base == pytest.approx(2.3 * 0.01, rel=0.01)  # core-s per global step
