"""roc_auc must equal the textbook definition, ties included, and reject ill-posed input."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import rankdata

from airflow_rover.core.metrics import average_ranks, roc_auc


def _pairwise_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """P(score_pos > score_neg) + 0.5 * P(tie), over all positive/negative pairs."""
    pos = scores[labels == 1][:, None]
    neg = scores[labels == 0][None, :]
    return float(np.mean((pos > neg) + 0.5 * (pos == neg)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_brute_force_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = (rng.random(600) < 0.3).astype(np.float32)
    scores = rng.integers(0, 7, size=600).astype(np.float64) + 0.4 * labels  # many ties
    assert roc_auc(labels, scores) == pytest.approx(_pairwise_auc(labels, scores), abs=1e-12)


@pytest.mark.parametrize("size", [1, 2, 50, 20_000])
def test_average_ranks_are_scipys(size: int) -> None:
    """Bit for bit, so an AUC is the same whichever computed it."""
    rng = np.random.default_rng(size)
    for values in (
        rng.normal(size=size),
        rng.integers(0, 5, size=size).astype(np.float64),  # ties
        np.round(rng.random(size), 2).astype(np.float32),
    ):
        assert np.array_equal(average_ranks(values), rankdata(values, method="average"))


def test_continuous_scores_match_brute_force() -> None:
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, size=500)
    scores = rng.normal(size=500) + labels
    assert roc_auc(labels, scores) == pytest.approx(_pairwise_auc(labels, scores), abs=1e-12)


def test_perfect_inverted_and_constant_scores() -> None:
    labels = np.array([0, 0, 1, 1, 0, 1])
    scores = np.array([0.1, 0.2, 0.8, 0.9, 0.3, 0.7])
    assert roc_auc(labels, scores) == 1.0
    assert roc_auc(labels, -scores) == 0.0
    assert roc_auc(labels, np.zeros(6)) == 0.5


def test_accepts_bool_labels_and_logits() -> None:
    labels = np.array([False, True, False, True])
    assert roc_auc(labels, np.array([-3.0, 2.0, -1.0, 0.5])) == 1.0


def test_length_mismatch_names_both_arguments() -> None:
    with pytest.raises(ValueError, match="labels and scores"):
        roc_auc(np.array([0, 1, 1]), np.array([0.1, 0.2]))


@pytest.mark.parametrize("labels", [np.ones(4), np.zeros(4)])
def test_single_class_is_rejected(labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match="labels must contain both classes"):
        roc_auc(labels, np.arange(4.0))


def test_non_binary_labels_are_rejected() -> None:
    with pytest.raises(ValueError, match="labels must contain only 0 and 1"):
        roc_auc(np.array([0, 1, 2]), np.arange(3.0))


def test_non_finite_scores_are_rejected() -> None:
    with pytest.raises(ValueError, match="scores must be finite"):
        roc_auc(np.array([0, 1]), np.array([0.5, np.nan]))


def test_two_dimensional_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="scores must be 1-D"):
        roc_auc(np.array([0, 1]), np.zeros((2, 1)))
    with pytest.raises(ValueError, match="labels must be 1-D"):
        roc_auc(np.zeros((2, 1)), np.zeros(2))
