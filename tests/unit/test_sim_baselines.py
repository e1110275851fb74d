"""The simulator's baselines do what their sources say: Optimus allocates greedily in one round
until its model's marginal gain runs out, and DLRover's Brain sizes a new job from similar past
jobs by the rules of its Go code; both stay within the job's budget and bounds."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from airflow_rover.core.optimizer import PlanBounds  # noqa: E402
from bench._brain import (  # noqa: E402
    CreationPlan,
    PastRun,
    UsageSample,
    brain_creation_plan,
    major_cluster,
)
from bench._policies import DLRoverHeuristic, Optimus, Setting, optimus_speed  # noqa: E402
from bench._simcore import Config, JobView, Report, simulate  # noqa: E402
from bench.worlds.dlrover_rm import worlds  # noqa: E402

# f(p, w) = w / (10 + 1.0*w/p + 0.05*w + 2.0*p): a worker always gains a little (10 > 0), a
# PS gains while 1.0*w/(p*(p+1)) > 2.0, i.e. at 32 workers up to p = 4 (32/12 > 2 >= 32/20).
THETA = np.array([10.0, 1.0, 0.05, 2.0])
SIZES = (1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0)
SETTING = Setting(200.0, PlanBounds(max_workers=32, max_ps=16, worker_cpus=SIZES, ps_cpus=SIZES))


def _optimus(setting: Setting = SETTING) -> Optimus:
    return Optimus(worker_cpu=1.0, ps_cpu=4.0, setting=setting)


def _within(cfg: Config, setting: Setting) -> bool:
    bounds = setting.bounds
    return (
        cfg.cores <= setting.budget
        and 1 <= cfg.workers <= bounds.max_workers
        and 1 <= cfg.num_ps <= bounds.max_ps
        and cfg.worker_cpu <= max(bounds.worker_cpus)
        and max(cfg.ps_cpu) <= max(bounds.ps_cpus)
    )


# -- Optimus ------------------------------------------------------------------------------------
def test_optimus_round_adds_several_units_and_stops_where_the_gain_runs_out() -> None:
    start = Config(1, 1.0, (4.0,))
    plan = _optimus().allocate(THETA, start, remaining=10_000.0)
    assert plan == Config(32, 1.0, (4.0,) * 4)  # 31 workers and 3 PS in one round
    # The fifth PS would make the model slower though the budget has room for it.
    assert plan.cores + 4.0 <= SETTING.budget
    assert optimus_speed(THETA, 5, 32) < optimus_speed(THETA, 4, 32)


def test_optimus_stops_at_the_ps_gain_even_with_room_for_more() -> None:
    # Workers at their bound: only PS may come, while 1.5*8/(p*(p+1)) > 1.2, i.e. up to p = 3.
    setting = Setting(200.0, PlanBounds(max_workers=8, max_ps=16))
    theta = np.array([5.0, 1.5, 0.1, 1.2])
    plan = _optimus(setting).allocate(theta, Config(8, 1.0, (4.0,)), remaining=10_000.0)
    assert plan == Config(8, 1.0, (4.0,) * 3)
    assert plan.cores + 4.0 <= setting.budget


def test_optimus_fills_the_budget_and_bounds_when_every_unit_gains() -> None:
    theta = np.array([10.0, 1.0, 0.05, 0.0])  # t3 = 0: every PS and every worker gains
    for setting in (
        Setting(50.0, PlanBounds(max_workers=32, max_ps=16)),
        Setting(200.0, PlanBounds(max_workers=20, max_ps=3)),
    ):
        plan = _optimus(setting).allocate(theta, Config(1, 1.0, (4.0,)), remaining=10_000.0)
        assert _within(plan, setting)
        more_workers = Config(plan.workers + 1, 1.0, plan.ps_cpu)
        more_ps = Config(plan.workers, 1.0, (*plan.ps_cpu, 4.0))
        assert not _within(more_workers, setting) and not _within(more_ps, setting)
        print(f"budget {setting.budget:g}, bounds {setting.bounds}: {plan.describe()}")


def _reports(cfg: Config, since: float, count: int) -> list[Report]:
    """Noise-free reports of ``cfg`` under the speed model ``THETA``."""
    iteration_s = cfg.workers / optimus_speed(THETA, cfg.num_ps, cfg.workers)
    return [
        Report(since + 10.0 * (k + 1), cfg, iteration_s, cfg.workers / iteration_s, 1.0, (1.0,))
        for k in range(count)
    ]


def test_optimus_decides_the_whole_greedy_plan_as_one_change() -> None:
    optimus = _optimus()
    explored = [Config(1, 1.0, (4.0,)), Config(2, 1.0, (4.0,)), Config(2, 1.0, (4.0,) * 2)]
    reports: list[Report] = []
    for i, cfg in enumerate(explored):
        reports += _reports(cfg, since=100.0 * i, count=3)
        optimus.speeds[(cfg.num_ps, cfg.workers)] = [r.iteration_s for r in reports[-3:]]
    current = Config(5, 1.0, (4.0,) * 2)
    reports += _reports(current, since=300.0, count=3)
    view = JobView(340.0, current, 300.0, 1_000.0, 11_000.0, SETTING.budget, reports)
    # Four distinct points fit the four parameters exactly; the round goes to the same plan
    # the true model gives, 27 workers and 2 PS more, in one change.
    assert optimus.decide(view) == Config(32, 1.0, (4.0,) * 4)


# -- DLRover's Brain ----------------------------------------------------------------------------
def test_major_cluster_is_brains_compute_major_cluster() -> None:
    assert major_cluster([100.0, 3.0, 1.0, 4.0, 2.0]) == [2.0, 3.0, 4.0]  # the outlier left out
    assert major_cluster([8.0, 60.0, 10.0, 10.0]) == [8.0, 10.0, 10.0]  # len // 2 + 1 of 4
    assert major_cluster([1.0, 2.0, 3.0]) == [2.0, 3.0]  # a tie takes the right neighbour
    assert major_cluster([5.0]) == [5.0]
    assert major_cluster([]) == []


def _sample(ps: tuple[float, ...], worker: float = 1.0, **memory: tuple[float, ...]) -> UsageSample:
    return UsageSample(ps, (worker,), **memory)


# Three past jobs of the scenario. A: total PS CPU 6, 8, 8, 18 -> major cluster [6, 8, 8],
# mean 22/3; its PS used 4.75 and 5.25 on average. B: 12 each time, PS 4 each. C (failed): 50,
# PS 10 each. Across jobs: [22/3, 12, 50] -> [22/3, 12], mean 29/3; total x 1.5 = 14.5. A PS:
# the busiest PS mean of any job (C's 10) + 4 = 14 cores; count = ceil(14.5 / 14) = 2. Memory:
# the largest PS sample (1200) x 2 < the largest total (C: 5 x 900) -> ceil(4500 / 2) = 2250,
# + 20% = 2700. The first worker: completed jobs only (C's 30 cores and 90,000 MiB left out):
# ceil(14.2) = 15 cores, 1.5 x 20,000 = 30,000 MiB.
HISTORY = (
    PastRun(
        (
            _sample((3.0, 3.0), 10.0, ps_memory_mib=(1000.0, 1000.0)),
            _sample((4.0, 4.0), 14.2, ps_memory_mib=(1200.0, 1100.0)),
            _sample((3.0, 5.0), 11.0, worker_memory_mib=(20_000.0,)),
            _sample((9.0, 9.0), 12.0),
        )
    ),
    PastRun(tuple(_sample((4.0, 4.0, 4.0), 3.0) for _ in range(3))),
    PastRun(
        (
            _sample((10.0,) * 5, 30.0, ps_memory_mib=(900.0,) * 5),
            _sample((10.0,) * 5, 30.0, worker_memory_mib=(90_000.0,)),
        ),
        completed=False,
    ),
)


def test_brain_creation_plan_is_the_formula_of_its_go_code() -> None:
    plan = brain_creation_plan(HISTORY)
    assert plan == CreationPlan(
        ps=2,
        ps_cpu=14.0,
        worker_cpu=15.0,
        ps_memory_mib=pytest.approx(2700.0),  # type: ignore[arg-type]
        worker_memory_mib=30_000.0,
        cold=False,
    )
    assert plan.config(SETTING) == Config(1, 15.0, (14.0, 14.0))


def test_brain_caps_at_15_ps_and_spreads_the_total_over_them() -> None:
    # 60 PS of 1 core: total 60 x 1.5 = 90 over 1 + 4 cores = 18 PS > 15 -> 15 x ceil(90/15).
    plan = brain_creation_plan([PastRun((_sample((1.0,) * 60),))])
    assert (plan.ps, plan.ps_cpu, plan.ps_memory_mib) == (15, 6.0, None)


def test_brain_falls_back_to_its_cold_plan_without_an_estimate() -> None:
    cold = (4, 12.0, 12.0, 16 * 1024.0, True)
    for history in (
        [],
        [PastRun(())],
        [PastRun((_sample((0.0, 0.0)),))],  # no PS CPU used
        [PastRun((_sample((3.0,), ps_memory_mib=(0.0,)),))],  # memory recorded, all zero
    ):
        plan = brain_creation_plan(history)
        assert (plan.ps, plan.ps_cpu, plan.worker_cpu, plan.ps_memory_mib, plan.cold) == cold


def test_brain_plan_fits_the_budget_and_the_largest_node() -> None:
    small = Setting(40.0, SETTING.bounds)
    cold = brain_creation_plan([])  # 4 PS x 12 + a worker of 12 > 40
    assert cold.config(small) == Config(1, 12.0, (12.0, 12.0))
    big = CreationPlan(2, 40.0, 12.0, None, 16_384.0, cold=False)  # PS above a 32-core node
    assert big.config(SETTING) == Config(1, 12.0, (32.0,) * 3)
    narrow = Setting(200.0, PlanBounds(worker_cpus=(1.0, 8.0), ps_cpus=(4.0, 16.0)))
    assert big.config(narrow) == Config(1, 8.0, (16.0,) * 5)  # 80 cores in PS of 16 at most
    for plan, setting in ((cold, small), (big, SETTING), (brain_creation_plan(HISTORY), small)):
        assert _within(plan.config(setting), setting)
    with pytest.raises(ValueError, match="budget must hold"):
        cold.config(Setting(20.0, SETTING.bounds))


def test_dlrover_starts_from_brains_plan_given_a_history() -> None:
    # Wide&Deep-like, a short job in a small world (Setting.of walks every plan of it).
    world = replace(worlds()[0], total_steps=20_000.0, max_workers=16, max_ps=8)
    setting = Setting.of(world)
    past = DLRoverHeuristic(setting)
    assert past.initial() == Config(1, 16.0, (16.0,))  # its own cold create: limit / 5 cores
    simulate(world, past, seed=0)
    history = [PastRun.of_reports(past.observed)]
    assert len(history[0].samples) == len(past.observed) > 10
    warm = DLRoverHeuristic(setting, history)
    assert warm.creation == brain_creation_plan(history) and not warm.creation.cold
    assert warm.initial() == warm.creation.config(setting) != past.initial()
    assert _within(warm.initial(), setting)
    print(f"cold {past.initial().describe()}, from Brain {warm.initial().describe()}")


def test_dlrover_asks_for_no_more_workers_than_the_bounds() -> None:
    # PS at 2% utilisation: workers *= 0.9 / 0.019 = 48, and the budget has room for 34 of
    # 5.3 cores; the bounds say 32, and a plan beyond them would never run.
    start = Config(1, 16.0, (16.0,))
    reports = [Report(10.0 * (k + 1), start, 0.1, 10.0, 5.3, (0.3,)) for k in range(5)]
    view = JobView(400.0, start, 0.0, 1_000.0, 50_000.0, SETTING.budget, reports)
    plan = DLRoverHeuristic(SETTING).decide(view)
    assert plan == Config(32, 5.3, (16.0,))
