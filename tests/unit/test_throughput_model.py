"""The throughput model (DLRover-RM section 4.1): its formula, and NNLS recovering known
coefficients from synthetic iteration times."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from airflow_rover.core.spec import ResourcePlan
from airflow_rover.core.throughput import (
    BusyShare,
    Coefficients,
    JobShape,
    ThroughputModel,
    features,
)

SHAPE = JobShape(batch_size=512, model_size=40.0, bandwidth=1250.0, embedding_dim=16)
# Known coefficients on the scale of SHAPE's features (m and D in units of the paper's batch of
# 512 and width of 16: both 1 here): each term a sizeable part of an iteration (tens of ms),
# so every one of them is identifiable from the timings.
TRUE = Coefficients(grad=179.2, upd=90.0, sync=900.0, emb=32.768, bias=12.0)


def _plans() -> list[ResourcePlan]:
    """A spread of plans like the ones a job visits: workers, PS and their sizes all vary."""
    grid = itertools.product((1, 2, 4, 8, 16, 32), (1, 2, 4, 8), (1.0, 4.0, 16.0), (2.0, 8.0))
    return [
        ResourcePlan(num_workers=w, num_ps=p, worker_cpu=wc, ps_cpu=pc) for w, p, wc, pc in grid
    ]


def test_iteration_time_is_the_papers_formula() -> None:
    plan = ResourcePlan(num_workers=8, num_ps=4, worker_cpu=4.0, ps_cpu=8.0)
    c = TRUE
    m, d = 512 / 512, 16 / 16  # in the paper's units
    expected = (
        c.grad * m / 4.0
        + c.upd * 8 / (4 * 8.0)
        + c.sync * (40.0 / 4) / (1250.0 / 8)
        + c.emb * m * d / 4
        + c.bias
    )
    model = ThroughputModel(TRUE, SHAPE)
    assert model.iteration_time(plan) == pytest.approx(expected)
    assert model.throughput(plan) == pytest.approx(8 * 512 / expected)
    assert features(plan, SHAPE)[-1] == 1.0


def test_nnls_recovers_known_coefficients_within_5_percent() -> None:
    rng = np.random.default_rng(7)
    truth = ThroughputModel(TRUE, SHAPE)
    observations = []
    for plan in _plans():
        for _ in range(3):  # three noisy reports per plan, 2% log-normal noise
            observations.append(
                (plan, truth.iteration_time(plan) * float(np.exp(rng.normal(0, 0.02))))
            )
    fitted = ThroughputModel.fit(SHAPE, observations).coefficients
    for got, want in zip(fitted.as_array(), TRUE.as_array(), strict=True):
        assert got == pytest.approx(want, rel=0.05)


def test_exact_timings_give_exact_coefficients() -> None:
    truth = ThroughputModel(TRUE, SHAPE)
    observations = [(plan, truth.iteration_time(plan)) for plan in _plans()]
    fitted = ThroughputModel.fit(SHAPE, observations).coefficients
    np.testing.assert_allclose(fitted.as_array(), TRUE.as_array(), rtol=1e-6)


def test_coefficients_stay_non_negative() -> None:
    """Timings that would want a negative term get 0 for it, not a negative value."""
    plans = _plans()[:12]
    observations = [(p, 50.0 + 0.001 * i) for i, p in enumerate(plans)]  # flat: no term matters
    fitted = ThroughputModel.fit(SHAPE, observations).coefficients
    assert (fitted.as_array() >= 0).all()
    assert fitted.bias == pytest.approx(50.0, rel=0.01)


def test_prior_fills_what_one_plan_cannot_tell() -> None:
    """One plan observed many times pins one direction only: the prior decides the rest, and
    the fit still reproduces the observed time."""
    plan = ResourcePlan(num_workers=2, num_ps=2, worker_cpu=4.0, ps_cpu=4.0)
    seconds = ThroughputModel(TRUE, SHAPE).iteration_time(plan)
    prior = Coefficients(*(TRUE.as_array() * 1.3))
    fitted = ThroughputModel.fit(SHAPE, [(plan, seconds)] * 6, prior=prior, prior_weight=0.01)
    assert fitted.iteration_time(plan) == pytest.approx(seconds, rel=0.01)
    got = fitted.coefficients.as_array()
    # Every term stays near the prior (none is dropped to 0 or blown up), pulled down just
    # enough to match the timing the prior over-predicts by 30%.
    assert (got > 0.5 * prior.as_array()).all()
    assert (got <= prior.as_array() * 1.001).all()


def test_busy_shares_tell_the_compute_and_update_terms_apart_from_one_plan() -> None:
    """A compute-bound job whose PS idle, seen under one plan: the prior (the paper's
    proportions) alone puts a third of the time in the PS terms and says more PS help; the
    profile (workers busy 80% of an iteration, the busiest PS 2%) pins both terms."""
    truth = Coefficients(grad=300.0, upd=1.0, sync=5.0, emb=2.0, bias=20.0)
    model = ThroughputModel(truth, SHAPE)
    plan = ResourcePlan(num_workers=4, num_ps=4, worker_cpu=4.0, ps_cpu=4.0)
    seconds = model.iteration_time(plan)
    terms = features(plan, SHAPE) * truth.as_array()
    busy = BusyShare(plan, seconds, worker=terms[0] / seconds, ps=terms[1] / seconds)
    prior = Coefficients.paper().scaled_to(SHAPE, plan, seconds)
    blind = ThroughputModel.fit(SHAPE, [(plan, seconds)], prior, 0.01)
    seeing = ThroughputModel.fit(SHAPE, [(plan, seconds)], prior, 0.01, busy=[busy])
    assert seeing.coefficients.grad == pytest.approx(truth.grad, rel=0.15)
    assert seeing.coefficients.upd < 0.1 * blind.coefficients.upd
    # Cores moved from the PS to the workers: the profile's model says how much it gains.
    moved = ResourcePlan(num_workers=4, num_ps=4, worker_cpu=7.0, ps_cpu=1.0)  # same 32 cores
    gain = model.throughput(moved) / model.throughput(plan)
    assert seeing.throughput(moved) / seeing.throughput(plan) == pytest.approx(gain, rel=0.1)
    assert blind.throughput(moved) < blind.throughput(plan)  # the prior's guess: a loss


@pytest.mark.parametrize(
    "observations, match",
    [([], "at least one"), ([(ResourcePlan(), 0.0)], "must be > 0")],
)
def test_bad_observations_are_rejected(observations: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ThroughputModel.fit(SHAPE, observations)
