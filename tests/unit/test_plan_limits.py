"""The autoscale bounds (``core.plan_limits``): resolved against the starting plan, checked
against it with errors that name both, and applied to a warm-start plan and a CLI job."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from airflow_rover.cli import load_spec
from airflow_rover.core.plan_limits import check_start_plan, plan_limits
from airflow_rover.core.spec import AutoscaleConfig, ResourcePlan
from airflow_rover.core.warm_start import WarmStart, within_bounds


def test_maxima_left_out_stretch_to_a_larger_starting_plan() -> None:
    """Counts: 4 unless the plan has more; PS cores: 8 unless the plan has more; the other
    sizes unbounded. Given bounds are kept as given."""
    small = plan_limits(AutoscaleConfig(), ResourcePlan(num_workers=2))
    assert small.ranges["num_workers"] == (1, 4) and small.ranges["num_ps"] == (1, 4)
    assert small.ranges["ps_cpu"] == (0.0, 8.0)
    assert small.ranges["worker_cpu"] == (0.0, math.inf)
    assert small.ranges["ps_memory_mb"] == (0.0, math.inf)
    large = plan_limits(AutoscaleConfig(), ResourcePlan(num_workers=12, num_ps=6, ps_cpu=16))
    assert large.ranges["num_workers"] == (1, 12) and large.ranges["num_ps"] == (1, 6)
    assert large.ranges["ps_cpu"] == (0.0, 16.0)
    given = plan_limits(
        AutoscaleConfig(min_workers=2, max_workers=6, max_ps_memory_mb=4096), ResourcePlan()
    )
    assert given.ranges["num_workers"] == (2, 6)
    assert given.ranges["ps_memory_mb"] == (0.0, 4096)
    above = plan_limits(AutoscaleConfig(min_workers=6, min_ps_cpu=12), ResourcePlan())
    assert above.ranges["num_workers"] == (6, 6) and above.ranges["ps_cpu"] == (12.0, 12.0)


def test_clamp_moves_each_field_into_its_bounds() -> None:
    limits = plan_limits(
        AutoscaleConfig(min_workers=2, max_workers=6, max_ps=2, max_ps_cpu=4, min_ps_cpu=2),
        ResourcePlan(num_workers=2),
    )
    wild = ResourcePlan(num_workers=9, num_ps=5, ps_cpu=1.0, ps_memory_mb=8192)
    tamed = limits.clamp(wild)
    assert (tamed.num_workers, tamed.num_ps, tamed.ps_cpu) == (6, 2, 2.0)
    assert tamed.ps_memory_mb == 8192 and isinstance(tamed.num_workers, int)
    assert limits.admits(tamed) and not limits.admits(wild)
    assert limits.clamp(tamed) is tamed


def test_toward_keeps_a_rules_change_in_its_direction() -> None:
    """A rule's plan: only the fields it changes are bounded, and never past where they were:
    from 8 workers under a maximum of 4 (an older job), "more workers" is no change at all."""
    limits = plan_limits(AutoscaleConfig(max_workers=4, max_ps_memory_mb=3072), ResourcePlan())
    now = ResourcePlan(num_workers=2, ps_memory_mb=2048)
    asked = now.model_copy(update={"num_workers": 6, "ps_memory_mb": 4096})
    assert limits.toward(now, asked) == now.model_copy(
        update={"num_workers": 4, "ps_memory_mb": 3072}
    )
    big = ResourcePlan(num_workers=8, num_ps=6)
    more = big.model_copy(update={"num_workers": 10})
    assert limits.toward(big, more) == big  # not 4: that would shrink what asked to grow


def test_a_starting_plan_outside_the_bounds_is_named_with_the_bound() -> None:
    config = AutoscaleConfig(min_workers=2, max_ps=1, max_worker_cpu=2)
    with pytest.raises(ValueError) as info:
        check_start_plan(config, ResourcePlan(num_workers=1, num_ps=2, worker_cpu=4))
    message = str(info.value)
    for part in (
        "plan.num_workers=1 is below autoscale.min_workers=2",
        "plan.num_ps=2 is above autoscale.max_ps=1",
        "plan.worker_cpu=4 is above autoscale.max_worker_cpu=2",
    ):
        assert part in message, message
    check_start_plan(config, ResourcePlan(num_workers=2, num_ps=1, worker_cpu=2))


@pytest.mark.parametrize(
    ("low", "high", "values"),
    [
        ("min_workers", "max_workers", (3, 2)),
        ("min_ps", "max_ps", (3, 2)),
        ("min_worker_cpu", "max_worker_cpu", (4.0, 2.0)),
        ("min_ps_cpu", "max_ps_cpu", (4.0, 2.0)),
        ("min_ps_memory_mb", "max_ps_memory_mb", (4096, 2048)),
    ],
)
def test_a_minimum_above_its_maximum_is_refused(
    low: str, high: str, values: tuple[float, float]
) -> None:
    with pytest.raises(ValidationError, match=rf"autoscale\.{low}=.* is above autoscale\.{high}="):
        AutoscaleConfig(**{low: values[0], high: values[1]})


def test_a_warm_start_plan_is_moved_into_the_bounds_given() -> None:
    """History may hold plans larger than this job may have: the warm-start plan keeps within
    the bounds given (and says so); a bound left out stretches to it."""
    decision = WarmStart(ResourcePlan(num_workers=8, num_ps=3), "history", "smoothed")
    moved = within_bounds(decision, AutoscaleConfig(max_workers=4))
    assert moved.plan == ResourcePlan(num_workers=4, num_ps=3)
    assert "within autoscale: num_workers 8 -> 4" in moved.message
    assert within_bounds(decision, AutoscaleConfig()) is decision


def test_the_cli_checks_the_starting_plan_against_the_bounds(tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        "train_data: /data/train\nplan: {num_workers: 3}\nautoscale: {max_workers: 2}\n"
    )
    with pytest.raises(SystemExit, match=r"plan\.num_workers=3 is above autoscale\.max_workers=2"):
        load_spec(config)
    config.write_text("train_data: /data/train\nplan: {num_workers: 3}\n")
    assert load_spec(config).plan.num_workers == 3
