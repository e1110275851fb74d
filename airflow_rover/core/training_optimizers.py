"""Optimizers the PS applies to embedding rows and dense weights, with per-row state.

Formulas match Keras 3 (so a PS-trained model follows the single-process one). For embedding
rows every row carries its own state, including Adam's step count: a row touched in 10 of
10,000 steps is bias-corrected for its 10 updates ("lazy" Adam), as sparse training needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from airflow_rover.core.id_probe import PROBE

OptimizerName = Literal["sgd", "adagrad", "adam"]
ADAGRAD_INITIAL_ACCUMULATOR = 0.1  # Keras' default
EPSILON = 1e-7  # Keras' default for Adagrad and Adam
ADAM_BETA_1 = 0.9
ADAM_BETA_2 = 0.999


@dataclass(frozen=True)
class Optimizer:
    """``apply`` updates ``param`` and ``state`` in place from ``grad``.

    For rows, ``param`` is (n, dim) and per-row scalars such as Adam's ``step`` are (n, 1);
    for a dense variable ``step`` is 0-d. Broadcasting makes one formula serve both.
    """

    name: OptimizerName
    learning_rate: float

    def state_names(self) -> tuple[str, ...]:
        return {"sgd": (), "adagrad": ("accum",), "adam": ("m", "v", "step")}[self.name]

    def init_state(self, shape: tuple[int, ...], rows: bool) -> dict[str, np.ndarray]:
        if self.name == "adagrad":
            return {"accum": np.full(shape, ADAGRAD_INITIAL_ACCUMULATOR, dtype=np.float32)}
        if self.name == "adam":
            step_shape = (shape[0], 1) if rows else ()
            return {
                "m": np.zeros(shape, dtype=np.float32),
                "v": np.zeros(shape, dtype=np.float32),
                "step": np.zeros(step_shape, dtype=np.float32),
            }
        return {}

    def apply(self, param: np.ndarray, state: dict[str, np.ndarray], grad: np.ndarray) -> None:
        lr = np.float32(self.learning_rate)
        if self.name == "sgd":
            param -= lr * grad
        elif self.name == "adagrad":
            accum = state["accum"]
            if _adagrad_in_one_pass(param, accum, grad):
                PROBE.adagrad_flat(param, accum, grad, lr, np.float32(EPSILON))
                return
            accum += grad * grad
            param -= lr * grad / np.sqrt(accum + np.float32(EPSILON))
        else:
            step = state["step"]
            step += 1
            m, v = state["m"], state["v"]
            m += (grad - m) * np.float32(1 - ADAM_BETA_1)
            v += (grad * grad - v) * np.float32(1 - ADAM_BETA_2)
            alpha = lr * np.sqrt(1 - ADAM_BETA_2**step) / (1 - ADAM_BETA_1**step)
            param -= (m * alpha / (np.sqrt(v) + np.float32(EPSILON))).astype(np.float32)

    def clamp_state(self, state: dict[str, np.ndarray]) -> None:
        """Put state that was not produced by ``apply`` (an ECRM degraded read, off by an
        update in flight) back into the range ``apply`` keeps it in, in place."""
        if self.name == "adagrad":
            np.maximum(state["accum"], np.float32(ADAGRAD_INITIAL_ACCUMULATOR), out=state["accum"])
        elif self.name == "adam":
            np.maximum(state["v"], np.float32(0), out=state["v"])
            np.maximum(np.rint(state["step"]), np.float32(0), out=state["step"])


def _adagrad_in_one_pass(param: np.ndarray, accum: np.ndarray, grad: np.ndarray) -> bool:
    """Whether ``PROBE.adagrad_flat`` can step these arrays (its C loop or its numpy twin, the
    same bits either way): float32, C-contiguous, of one shape with at least one dimension,
    and what it writes writeable (the C loop would not refuse a read-only array)."""
    arrays = (param, accum, grad)
    return (
        all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)
        and param.ndim > 0
        and param.shape == accum.shape == grad.shape
        and param.flags.writeable
        and accum.flags.writeable
    )
