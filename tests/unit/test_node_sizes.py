"""Per-node sizes in a plan (``ResourcePlan.sizes``): a node sized apart from its role, what
every sum of a plan's cores and memory, the bounds, the pods and the resize see."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from airflow_rover.core.cluster_budget import Budget
from airflow_rover.core.optimizer import PlanBounds, Prices
from airflow_rover.core.plan_limits import plan_limits
from airflow_rover.core.spec import AutoscaleConfig, NodeSize, ResourcePlan, describe_errors
from airflow_rover.core.warm_start import to_plan
from airflow_rover.launchers.kubernetes import manifests as m
from airflow_rover.master.resize import sizes_change
from airflow_rover.plugins.job_views import plan_text

PLAN = ResourcePlan(num_workers=3, num_ps=2, worker_cpu=1.0, ps_cpu=2.0, ps_memory_mb=4096)
HOT = PLAN.with_size("ps-1", cpu=8.0)


def test_a_plan_without_sizes_dumps_as_before() -> None:
    """Old history rows and statuses hold plans without ``sizes``: they load and compare."""
    old = {
        "num_workers": 3,
        "num_ps": 2,
        "worker_cpu": 1.0,
        "worker_memory_mb": 2048,
        "ps_cpu": 2.0,
        "ps_memory_mb": 4096,
    }
    assert PLAN.model_dump() == old and json.loads(PLAN.model_dump_json()) == old
    assert ResourcePlan.model_validate(old) == PLAN
    assert ResourcePlan.model_validate_json(HOT.model_dump_json()) == HOT
    assert len({PLAN, HOT, PLAN.with_size("ps-1", cpu=8.0)}) == 2  # frozen and hashable


def test_size_of_and_the_totals_count_each_node_at_its_own_size() -> None:
    assert HOT.size_of("ps-1") == (8.0, 4096) and HOT.size_of("ps-0") == (2.0, 4096)
    assert HOT.size_of("evaluator-0") == HOT.size_of("worker-0") == (1.0, 2048)
    assert PLAN.total_cores == 3 * 1.0 + 2 * 2.0
    assert HOT.total_cores == 3 * 1.0 + 2.0 + 8.0
    bigger = HOT.with_size("worker-2", memory_mb=8192)
    assert bigger.total_memory_mb == 2 * 2048 + 8192 + 2 * 4096
    # what the optimizer's prices, the cluster budget and the UI count
    assert Budget.used(bigger) == (bigger.total_cores, float(bigger.total_memory_mb))
    assert Prices(cpu=1.0, memory_gb=0.0).cost(HOT) == HOT.total_cores
    assert "ps-1 8 CPU, 4096 MB" in plan_text(HOT) and "(" not in plan_text(PLAN)


def test_with_size_lists_only_nodes_apart_from_their_role() -> None:
    assert HOT.sizes == (NodeSize(node="ps-1", cpu=8.0),)
    assert HOT.with_size("ps-1", cpu=2.0) == PLAN  # back at the role's size: not listed
    both = HOT.with_size("ps-1", memory_mb=8192).with_size("ps-0", cpu=4.0)
    assert [s.node for s in both.sizes] == ["ps-0", "ps-1"]
    assert both.size_of("ps-1") == (8.0, 8192)
    with pytest.raises(ValueError, match="ps-2 does not exist in a plan of 2 PS"):
        PLAN.with_size("ps-2", cpu=4.0)
    with pytest.raises(ValueError, match="expected 'ps-N' or 'worker-N'"):
        PLAN.with_size("data-0", cpu=4.0)


def test_with_counts_drops_the_sizes_of_nodes_that_go() -> None:
    sized = HOT.with_size("worker-2", cpu=2.0)
    fewer = sized.with_counts(num_workers=2, num_ps=1)
    assert (fewer.num_workers, fewer.num_ps, fewer.sizes) == (2, 1, ())
    assert sized.with_counts(num_workers=4).sizes == sized.sizes
    # model_copy does not validate: size_of and the totals ignore what lies beyond the counts
    copied = sized.model_copy(update={"num_workers": 2})
    assert copied.total_cores == 2 * 1.0 + 2.0 + 8.0


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ([{"node": "ps-0", "cpu": 2}, {"node": "ps-0", "memory_mb": 512}], "ps-0 is sized twice"),
        ([{"node": "worker-3", "cpu": 2}], "worker-3 does not exist in a plan of 3 workers"),
        ([{"node": "ps-0"}], "ps-0 gives neither cpu nor memory_mb"),
        ([{"node": "evaluator-0", "cpu": 2}], "sizes.0.node"),
        ([{"node": "ps-0", "cpu": 0}], "sizes.0.cpu"),
        ([{"node": "ps-0", "memory_mb": 100}], "sizes.0.memory_mb"),
    ],
)
def test_bad_sizes_are_named(sizes: list[dict[str, object]], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ResourcePlan.model_validate({**PLAN.model_dump(), "sizes": sizes})
    text = describe_errors(caught.value)
    assert message in text and ("plan.sizes" in text or "sizes." in text), text


def test_the_role_bounds_bound_each_node() -> None:
    limits = plan_limits(AutoscaleConfig(max_ps_cpu=4.0, max_ps_memory_mb=8192), PLAN)
    assert limits.outside(HOT) == ["plan.sizes ps-1 cpu=8 is above autoscale.max_ps_cpu=4"]
    assert limits.clamp(HOT).size_of("ps-1") == (4.0, 4096)
    assert limits.toward(PLAN, HOT).size_of("ps-1") == (4.0, 4096)
    big = PLAN.with_size("ps-0", memory_mb=16384)
    assert limits.toward(PLAN, big).size_of("ps-0") == (2.0, 8192)
    assert not limits.admits(big) and limits.admits(limits.clamp(big))


def test_pods_sizes_and_resizes_follow_each_node() -> None:
    assert m.node_size(HOT, "ps", node_id="ps-1") == (8.0, 4096)
    assert m.node_size(HOT, "ps", node_id="ps-0") == (2.0, 4096)
    assert m.node_size(HOT, "evaluator", node_id="evaluator-0") == (1.0, 2048)
    assert sizes_change(PLAN, HOT) and not sizes_change(HOT, HOT.with_counts(num_workers=1))
    assert not sizes_change(PLAN, PLAN.with_counts(num_ps=4))


def test_warm_start_smoothing_leaves_node_sizes_out() -> None:
    smoothed = to_plan({"num_workers": 2.4, "num_ps": 1.0}, fallback=HOT)
    assert smoothed.sizes == () and smoothed.num_ps == 1


def test_search_plans_keep_the_sizes_of_nodes_that_stay_only() -> None:
    """The Pareto search's plans from a plan with a node sized apart: valid at fewer nodes
    (they go through the status JSON to the trigger), the sized node kept while it exists."""
    bounds = PlanBounds(max_workers=4, max_ps=4, worker_cpus=(1.0,), ps_cpus=(2.0,))
    fewer = bounds.plan((2, 1, 0, 0), HOT)
    assert ResourcePlan.model_validate_json(fewer.model_dump_json()) == fewer
    assert (fewer.num_ps, fewer.sizes) == (1, ())
    more = bounds.plan((3, 3, 0, 0), HOT)
    assert more.size_of("ps-1") == (8.0, 4096) and more.size_of("ps-2") == (2.0, 4096)
