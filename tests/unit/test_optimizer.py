"""The plan optimizer (DLRover-RM 4.2-4.3): NSGA-II candidates are non-dominated, throughput
gain counts what a change costs, ``best_plan`` prefers worker changes, and weighted greedy
keeps the shared budget and favours jobs about to finish."""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_rover.core.optimizer import (
    Budget,
    Candidate,
    JobCandidates,
    PlanBounds,
    Prices,
    ScalingCosts,
    best_plan,
    non_dominated,
    pareto_plans,
    throughput_gain,
    weight,
    weighted_greedy,
)
from airflow_rover.core.spec import ResourcePlan
from airflow_rover.core.throughput import Coefficients, JobShape, ThroughputModel

# Normalised features (one batch, reference width): the paper's coefficients, in 10 ms.
SHAPE = JobShape(batch_size=1, model_size=0.25, bandwidth=1.0, embedding_dim=1)
MODEL = ThroughputModel(Coefficients(*(Coefficients.paper().as_array() * 0.01)), SHAPE)
BOUNDS = PlanBounds(max_workers=16, max_ps=8)
CURRENT = ResourcePlan(num_workers=1, num_ps=1, worker_cpu=4.0, ps_cpu=4.0)
REMAINING = 200_000.0


@pytest.fixture(scope="module")
def front() -> list[Candidate]:
    return pareto_plans(MODEL, CURRENT, REMAINING, BOUNDS, seed=3, generations=30, population=40)


def test_nsga2_output_is_non_dominated(front: list[Candidate]) -> None:
    assert len(front) >= 5
    for a in front:
        for b in front:
            dominates = (
                b.cost <= a.cost and b.gain >= a.gain and (b.cost, b.gain) != (a.cost, a.gain)
            )
            assert not dominates, f"{b} dominates {a}"


def test_nsga2_output_is_within_bounds_sorted_and_consistent(front: list[Candidate]) -> None:
    prices, costs = Prices(), ScalingCosts()
    assert [c.cost for c in front] == sorted(c.cost for c in front)
    for c in front:
        assert 1 <= c.plan.num_workers <= BOUNDS.max_workers
        assert 1 <= c.plan.num_ps <= BOUNDS.max_ps
        assert c.plan.worker_cpu in BOUNDS.worker_cpus and c.plan.ps_cpu in BOUNDS.ps_cpus
        assert c.cost == pytest.approx(prices.cost(c.plan))
        assert c.gain == pytest.approx(throughput_gain(MODEL, CURRENT, c.plan, REMAINING, costs))
    assert len({c.plan for c in front}) == len(front)


def test_nsga2_is_deterministic_for_a_seed() -> None:
    a = pareto_plans(MODEL, CURRENT, REMAINING, BOUNDS, seed=5, generations=10, population=20)
    b = pareto_plans(MODEL, CURRENT, REMAINING, BOUNDS, seed=5, generations=10, population=20)
    assert a == b


def test_a_space_smaller_than_the_search_gets_the_exact_front() -> None:
    """8 x 4 x 2 x 2 = 128 plans, fewer than 60 x 60 evaluations: every plan is scored, so the
    front is exactly the non-dominated set of all plans, and NSGA-II on the same space (a
    smaller search, forced) finds nothing that beats it."""
    small = PlanBounds(max_workers=8, max_ps=4, worker_cpus=(2.0, 4.0), ps_cpus=(2.0, 4.0))
    exact = pareto_plans(MODEL, CURRENT, REMAINING, small)
    every = [
        Candidate(
            p, Prices().cost(p), throughput_gain(MODEL, CURRENT, p, REMAINING, ScalingCosts())
        )
        for p in (
            small.plan((w, ps, wc, pc), like=CURRENT)
            for w in range(1, 9)
            for ps in range(1, 5)
            for wc in range(2)
            for pc in range(2)
        )
    ]
    assert {c.plan for c in exact} == {c.plan for c in non_dominated(every)}
    searched = pareto_plans(MODEL, CURRENT, REMAINING, small, seed=1, generations=5, population=20)
    for found in searched:
        assert not any(
            found.cost <= c.cost
            and found.gain >= c.gain
            and (found.cost, found.gain) != (c.cost, c.gain)
            for c in exact
        )


def test_non_dominated_filters_dominated_and_keeps_ties() -> None:
    plan = ResourcePlan()
    cands = [
        Candidate(plan, 10.0, 5.0),
        Candidate(plan, 12.0, 5.0),  # costs more for the same gain: dominated
        Candidate(plan, 20.0, 9.0),
        Candidate(plan, 20.0, 9.0),  # an equal twin is not dominated
        Candidate(plan, 25.0, 8.0),  # dominated by (20, 9)
    ]
    kept = non_dominated(cands)
    assert [(c.cost, c.gain) for c in kept] == [(10.0, 5.0), (20.0, 9.0), (20.0, 9.0)]


def test_throughput_gain_counts_the_cost_of_a_change() -> None:
    costs = ScalingCosts(worker_start_s=120.0, ps_start_s=20.0, ps_reload_s=100.0)
    assert throughput_gain(MODEL, CURRENT, CURRENT, REMAINING, costs) == 0.0
    more_workers = CURRENT.model_copy(update={"num_workers": 8})
    more_ps = more_workers.model_copy(update={"num_ps": 2})
    ideal = MODEL.throughput(more_workers) - MODEL.throughput(CURRENT)
    gain = throughput_gain(MODEL, CURRENT, more_workers, REMAINING, costs)
    assert 0 < gain < ideal  # the 120 s start is paid, the old workers train meanwhile
    # With little left to train, a PS change (training stops) is worth less than nothing.
    assert throughput_gain(MODEL, CURRENT, more_ps, 500.0, costs) < 0
    # The longer the rest of the job, the closer the gain gets to the ideal one.
    long = throughput_gain(MODEL, CURRENT, more_workers, 1e9, costs)
    assert gain < long == pytest.approx(ideal, rel=1e-3)


def test_best_plan_prefers_leaving_the_ps_alone_on_a_tie() -> None:
    workers = CURRENT.model_copy(update={"num_workers": 2})
    ps = CURRENT.model_copy(update={"num_ps": 2})
    cands = [Candidate(ps, 10.0, 5.0), Candidate(workers, 10.0, 5.0)]
    chosen = best_plan(cands, CURRENT, min_gain=1.0)
    assert chosen is not None and chosen.plan == workers


def test_best_plan_takes_the_most_efficient_useful_candidate() -> None:
    plans = [CURRENT.model_copy(update={"num_workers": n}) for n in (2, 3, 4)]
    cands = [
        Candidate(plans[0], 10.0, 1.0),  # efficient but below min_gain
        Candidate(plans[1], 20.0, 8.0),  # 0.4 per unit
        Candidate(plans[2], 40.0, 12.0),  # 0.3 per unit
        Candidate(CURRENT, 5.0, 100.0),  # the current plan is never "new"
    ]
    chosen = best_plan(cands, CURRENT, min_gain=2.0)
    assert chosen is not None and chosen.plan == plans[1]
    assert best_plan(cands, CURRENT, min_gain=50.0) is None


def _job(
    job_id: str, remaining: float, thr: float, gains: list[tuple[int, float]]
) -> JobCandidates:
    current = ResourcePlan(num_workers=1, num_ps=1, worker_cpu=1.0, ps_cpu=1.0)
    cands = tuple(
        Candidate(current.model_copy(update={"num_workers": w}), float(w + 1), g) for w, g in gains
    )
    return JobCandidates(job_id, current, thr, remaining, cands)


def test_weighted_greedy_keeps_the_budget() -> None:
    jobs = [_job(f"j{i}", 1e5, 10.0, [(4, 30.0), (8, 50.0), (16, 70.0)]) for i in range(4)]
    budget = Budget(cpu=30.0, memory_mb=1e9)
    chosen = weighted_greedy(jobs, budget)
    used = 0.0
    for job in jobs:
        plan = chosen.get(job.job_id, job.current)
        used += Budget.used(plan)[0]
    assert used <= budget.cpu
    assert chosen  # something fits


def test_weighted_greedy_favours_the_job_closer_to_the_end() -> None:
    short = _job("short", 1e4, 10.0, [(8, 40.0)])
    long = _job("long", 1e7, 10.0, [(8, 40.0)])
    chosen = weighted_greedy([long, short], Budget(cpu=4.0 + 9.0, memory_mb=1e9))
    assert set(chosen) == {"short"}  # room for one upgrade: the one that finishes sooner


def test_weight_decreases_with_remaining_time() -> None:
    assert weight(1e3, 10.0) > weight(1e5, 10.0) > weight(1e5, 1.0)
    assert weight(1e5, 10.0, rho=0.0) == 1.0


def test_a_jobs_weight_can_outrank_the_job_closer_to_the_end() -> None:
    """The same two jobs, room for one upgrade: the long one's weight (1000x, its
    ``autoscale.weight``) multiplies its priority past the short one's."""
    short = _job("short", 1e4, 10.0, [(8, 40.0)])
    heavy = replace(_job("long", 1e7, 10.0, [(8, 40.0)]), job_weight=1000.0)
    chosen = weighted_greedy([heavy, short], Budget(cpu=4.0 + 9.0, memory_mb=1e9))
    assert set(chosen) == {"long"}


@pytest.mark.parametrize(("generations", "population"), [(60, 60), (4, 10)], ids=["exact", "nsga2"])
def test_candidates_keep_the_minimum_counts(generations: int, population: int) -> None:
    """With ``min_workers``/``min_ps`` no candidate has fewer, whether every plan is scored
    (a small space) or NSGA-II searches (forced with a tiny search)."""
    bounds = PlanBounds(
        max_workers=12,
        max_ps=6,
        worker_cpus=(1.0, 4.0),
        ps_cpus=(1.0, 4.0),
        min_workers=3,
        min_ps=2,
    )
    front = pareto_plans(
        MODEL, CURRENT, REMAINING, bounds, seed=1, generations=generations, population=population
    )
    assert front
    for c in front:
        assert 3 <= c.plan.num_workers <= 12 and 2 <= c.plan.num_ps <= 6, c.plan


def test_bounds_with_a_minimum_above_the_maximum_are_refused() -> None:
    with pytest.raises(ValueError, match="1 <= min <= max"):
        PlanBounds(max_workers=2, min_workers=3)


def test_the_search_sizes_the_hot_ps_alone() -> None:
    """With the hot PS named, the genome's fifth gene sizes it apart: the model sees the busiest
    PS's load per core, so the hot PS alone bigger buys most of what bigger PS buy, for fewer
    cores, and the exact front holds such plans."""
    shape = JobShape(512, 0.25, 1.0, 16, hot_share=0.5, hot_ps=0)
    model = ThroughputModel(
        Coefficients(*(Coefficients.paper().as_array() * [1, 24, 1, 1, 1])), shape
    )
    bounds = PlanBounds(max_workers=8, max_ps=3, worker_cpus=(2.0,), ps_cpus=(2.0, 8.0), hot_ps=0)
    assert bounds.size == 8 * 3 * 1 * 2 * 2
    current = ResourcePlan(num_workers=4, num_ps=2, worker_cpu=2.0, ps_cpu=2.0)
    hot = bounds.plan((4, 2, 0, 0, 1), like=current)
    assert hot.size_of("ps-0") == (8.0, 2048) and hot.size_of("ps-1") == (2.0, 2048)
    big = current.model_copy(update={"ps_cpu": 8.0})
    assert hot.total_cores < big.total_cores
    assert model.throughput(current) < model.throughput(hot) < model.throughput(big)
    gained = (model.throughput(hot) - model.throughput(current)) / (
        model.throughput(big) - model.throughput(current)
    )
    assert gained > 0.7
    front = pareto_plans(model, current, 1e9, bounds)
    assert any(c.plan.sizes for c in front)
