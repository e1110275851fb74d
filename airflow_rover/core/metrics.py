"""Evaluation metrics, pure numpy so the master, workers and tests share one definition.

AUC is computed exactly (Mann-Whitney U from average ranks) rather than with a binned
approximation, so two runs that produce the same scores report the same AUC bit for bit.
"""

from __future__ import annotations

import numpy as np


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for binary ``labels`` (1 = positive).

    Uses the Mann-Whitney statistic: the probability that a random positive scores higher
    than a random negative, with tied scores counted as half (ranks averaged over ties).
    Scores only need to be monotone in the predicted probability (logits work as well).
    """
    y = np.asarray(labels)
    s = np.asarray(scores)
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {y.shape}")
    if s.ndim != 1:
        raise ValueError(f"scores must be 1-D, got shape {s.shape}")
    if y.shape[0] != s.shape[0]:
        raise ValueError(
            f"labels and scores must have the same length, got {y.shape[0]} labels "
            f"and {s.shape[0]} scores"
        )
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("labels must contain only 0 and 1 (or False/True)")
    if not np.all(np.isfinite(s)):
        raise ValueError("scores must be finite (no NaN or inf)")
    positive = y == 1
    num_pos = int(np.count_nonzero(positive))
    num_neg = int(y.shape[0]) - num_pos
    if num_pos == 0 or num_neg == 0:
        raise ValueError(
            f"labels must contain both classes to define AUC, got {num_pos} positives "
            f"and {num_neg} negatives"
        )
    ranks = average_ranks(s)
    rank_sum = float(np.sum(ranks[positive], dtype=np.float64))
    u_statistic = rank_sum - num_pos * (num_pos + 1) / 2.0
    return float(u_statistic / (float(num_pos) * float(num_neg)))


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks of ``values``, ties given the mean of the ranks they span (as
    ``scipy.stats.rankdata(method="average")``, without importing scipy.stats on every
    evaluation)."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return (ends - (counts - 1) / 2.0)[inverse.reshape(-1)]
