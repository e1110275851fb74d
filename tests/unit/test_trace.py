"""``bench/_trace.py``'s arbiter policy: the rows it gives ``core.budget_arbiter.allocate`` and
what it does with the answer (a job that does not fit starts with one worker, an allowed
proposal changes the plan, no proposal while a change is under way), and on a short trace its
mean JCT against FIFO's."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from airflow_rover.core.cluster_budget import smallest_plan  # noqa: E402
from bench._trace import (  # noqa: E402
    POLICIES,
    TraceJob,
    _arbiter,
    _row,
    cores,
    make_jobs,
    simulate_trace,
)


def one_job() -> TraceJob:
    return make_jobs(1, seed=0, mean_gap_s=130.0)[0]


def test_a_job_whose_plan_does_not_fit_starts_with_one_worker() -> None:
    job = one_job()
    smaller = smallest_plan({}, job.fastest)
    assert cores(smaller) < cores(job.fastest)
    waiting = [job]
    _arbiter([], waiting, budget=cores(smaller), now=job.arrival)
    assert waiting == []
    assert job.plan == smaller
    assert job.start == job.arrival


def test_a_job_waits_when_not_even_one_worker_fits() -> None:
    job = one_job()
    waiting = [job]
    _arbiter([], waiting, budget=cores(smallest_plan({}, job.fastest)) - 1, now=job.arrival)
    assert waiting == [job]
    assert job.plan is None


def test_a_running_job_takes_its_proposal_once_its_launch_is_over() -> None:
    job = one_job()
    low = smallest_plan({}, job.fastest)
    _arbiter([], [job], budget=cores(low), now=job.arrival)
    launched = job.arrival + 120.0
    assert _row(job, job.arrival + 1.0).proposal is None  # still launching
    job.advance(launched)
    row = _row(job, launched)
    assert row.proposal is not None and row.proposal.expected_gain is not None
    assert row.proposal.expected_gain > 0
    _arbiter([job], [], budget=1000.0, now=launched)
    assert job.plan == row.proposal.plan
    assert job.events  # the change takes time, as bench/_simcore.transition says


def test_the_arbiter_beats_fifo_on_a_short_trace() -> None:
    means = {}
    for policy in POLICIES:
        started = time.perf_counter()
        jct = simulate_trace(make_jobs(20, seed=0, mean_gap_s=130.0), 1000.0, policy)
        means[policy] = statistics.fmean(jct)
        print(f"{policy}: mean JCT {means[policy]:.0f} s ({time.perf_counter() - started:.2f} s)")
    assert means["arbiter"] < means["fifo"]


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="policy: 'greedy'; accepted: fifo, arbiter"):
        simulate_trace(make_jobs(2, seed=0, mean_gap_s=130.0), 1000.0, "greedy")
