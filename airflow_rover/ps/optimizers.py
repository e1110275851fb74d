"""Optimizers applied on the PS, in place, to rows and their per-row state."""

from __future__ import annotations

import numpy as np

ADAGRAD_INITIAL_ACCUMULATOR = 0.1  # TensorFlow's default, so results match Keras' Adagrad
ADAGRAD_EPSILON = 1e-7


def adagrad_update(
    param: np.ndarray, accum: np.ndarray, grad: np.ndarray, learning_rate: float
) -> tuple[np.ndarray, np.ndarray]:
    """Return updated (param, accum): ``accum += g^2; param -= lr * g / (sqrt(accum) + eps)``."""
    new_accum = accum + grad * grad
    new_param = param - learning_rate * grad / (np.sqrt(new_accum) + ADAGRAD_EPSILON)
    return new_param.astype(param.dtype, copy=False), new_accum.astype(accum.dtype, copy=False)
