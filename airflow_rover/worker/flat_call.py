"""A traced step called on its flat inputs, without TensorFlow's per-call argument binding.

Calling a ``ConcreteFunction`` binds its arguments to the structured signature first: each
array is cast against its ``TensorSpec`` and converted through ``tf.constant``'s wrappers.
For a step of 14 inputs that is most of the training thread's Python, paid on the critical
path of every step. The inputs here come from the loop itself, in the signature's flattened
order, so the binding checks nothing a trace has not fixed already: arrays become tensors
directly and the traced function runs on them. TensorFlow versions without these internals
(``ConcreteFunction._call_flat``, ``ops.EagerTensor``) get the ordinary structured call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf


class FlatCall:
    """``fn`` called on its inputs in flattened order (``tf.nest.flatten`` of its arguments);
    numpy arrays must have the dtype their ``TensorSpec`` says (they are not cast)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self._structure = fn.structured_input_signature[0]
        self.direct = _direct_call_available(fn)
        if self.direct:
            from tensorflow.python.eager import context
            from tensorflow.python.framework import ops

            self._tensor = ops.EagerTensor
            self._device = context.context().device_name

    def __call__(self, flat: Sequence[np.ndarray | tf.Tensor]) -> Any:
        if not self.direct:
            return self.fn(*tf.nest.pack_sequence_as(self._structure, list(flat)))
        tensors = [
            a if isinstance(a, tf.Tensor) else self._tensor(a, self._device, None) for a in flat
        ]
        return self.fn._call_flat(tensors, self.fn.captured_inputs)


def _direct_call_available(fn: Any) -> bool:
    try:
        from tensorflow.python.framework import ops
    except ImportError:
        return False
    return callable(getattr(fn, "_call_flat", None)) and hasattr(ops, "EagerTensor")
