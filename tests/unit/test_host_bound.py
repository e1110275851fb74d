"""On a shared host a job trains at most its cores over a step's work: the bound is read from
the nodes' busy CPU, learns what a PS adds once two PS counts ran, and caps the model."""

from __future__ import annotations

import pytest

from airflow_rover.core.host_bound import HostBound, HostUse
from airflow_rover.core.spec import ResourcePlan
from airflow_rover.core.throughput import Coefficients, JobShape, ThroughputModel


def plan(workers: int, ps: int) -> ResourcePlan:
    return ResourcePlan(num_workers=workers, num_ps=ps)


def use(workers: int, ps: int, busy: float, base: float = 0.02, per_ps: float = 0.004) -> HostUse:
    return HostUse(plan(workers, ps), busy, base + per_ps * ps)


def test_with_one_ps_count_a_ps_adds_nothing_and_the_host_cores_bound() -> None:
    bound = HostBound.fit(2.0, [use(1, 2, busy=1.2)])
    assert bound.step_per_ps == pytest.approx(0.0, abs=1e-4)
    assert bound.cores == 2.0  # 60% busy: the host is not yet the bound
    assert bound.max_steps_per_s(plan(3, 1)) == pytest.approx(2.0 / 0.028, rel=0.01)


def test_two_ps_counts_tell_what_a_ps_adds() -> None:
    bound = HostBound.fit(2.0, [use(1, 1, 1.3), use(2, 1, 1.7), use(2, 2, 1.8)])
    assert bound.step_base == pytest.approx(0.02, rel=0.05)
    assert bound.step_per_ps == pytest.approx(0.004, rel=0.1)
    assert bound.max_steps_per_s(plan(2, 1)) > bound.max_steps_per_s(plan(2, 2))


def test_a_saturated_host_bounds_at_what_the_job_kept_busy() -> None:
    """The master, the OS and other jobs hold the rest of the cores."""
    assert HostBound.fit(2.0, [use(3, 1, busy=1.84)]).cores == pytest.approx(1.84)


@pytest.mark.parametrize(
    ("cores", "uses", "message"),
    [
        (0.0, [use(1, 1, 1.0)], "host_cores"),
        (2.0, [], "uses"),
        (2.0, [HostUse(plan(1, 1), 1.0, 0.0)], "step_cost"),
    ],
)
def test_bad_input_names_what_is_wrong(cores: float, uses: list[HostUse], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HostBound.fit(cores, uses)


def test_the_bound_caps_the_models_throughput() -> None:
    shape = JobShape.sized(512, 16)
    coefficients = Coefficients.paper().scaled_to(shape, plan(1, 1), 0.01)  # 100 steps/s
    free = ThroughputModel(coefficients, shape)
    more = plan(8, 2)
    steps = free.throughput(more) / 512
    assert steps > 200  # dedicated nodes: more workers, more steps
    capped = ThroughputModel(coefficients, shape, HostBound(2.0, 4.0 / steps, 0.0))
    assert capped.throughput(more) / 512 == pytest.approx(steps / 2)  # the host's half of it
    one = plan(1, 1)  # below the bound: the equation's time
    assert capped.iteration_time(one) == free.iteration_time(one)
