"""The preprocessing of ``bench/data_workers.py``'s job (``bench._preprocess:crossed``): hashed
feature crosses, costly enough that preparing a batch takes longer than training on it.

Each pair of neighbouring categorical columns ``(2k, 2k + 1)`` is crossed: the pair's ids are
hashed together (``ROUNDS`` rounds of a 64-bit mix, the cost knob) and the hash, modulo column
``2k + 1``'s vocabulary, becomes that column's id. Column ``2k`` keeps its own id. Deterministic,
the same rows and columns, every id within its column's vocabulary (``checked`` enforces it).
The vocabularies are the synthetic data's (``DEFAULT_VOCAB_SIZES``); a batch of other columns is
refused.
"""

from __future__ import annotations

import numpy as np

from airflow_rover.data.batch import Batch
from airflow_rover.data.synthetic import DEFAULT_VOCAB_SIZES

ROUNDS = 5000  # mixing rounds per batch: sets what a batch costs to prepare
_MIX = np.uint64(0x9E3779B97F4A7C15)
_SHIFT_A, _SHIFT_B = np.uint64(31), np.uint64(27)
_FIRST = np.arange(0, len(DEFAULT_VOCAB_SIZES) - 1, 2)  # 0, 2, ..., 24
_SECOND = _FIRST + 1  # 1, 3, ..., 25: the columns that take the crosses
_VOCAB = np.array(DEFAULT_VOCAB_SIZES, dtype=np.uint64)[_SECOND]


def cross_ids(first: np.ndarray, second: np.ndarray, rounds: int = ROUNDS) -> np.ndarray:
    """The hash (uint64) of each row's pair of ids: ``first`` and ``second`` (int64, same
    shape) mixed ``rounds`` times."""
    with np.errstate(over="ignore"):
        x = first.astype(np.uint64) * _MIX ^ second.astype(np.uint64)
        for _ in range(rounds):
            x ^= x >> _SHIFT_A
            x *= _MIX
            x ^= x >> _SHIFT_B
    return x


def crossed(batch: Batch) -> Batch:
    """``batch`` with each odd categorical column's ids replaced by its cross with the column
    before it."""
    columns = batch.categorical.shape[1]
    if columns != len(DEFAULT_VOCAB_SIZES):
        raise ValueError(
            f"bench._preprocess:crossed takes the synthetic data's {len(DEFAULT_VOCAB_SIZES)} "
            f"categorical columns, got {columns}"
        )
    ids = batch.categorical
    hashed = cross_ids(ids[:, _FIRST], ids[:, _SECOND])
    categorical = ids.copy()
    categorical[:, _SECOND] = (hashed % _VOCAB).astype(np.int64)
    return Batch(batch.dense, categorical, batch.label, batch.lists, batch.weight)
