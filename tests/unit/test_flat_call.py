"""A traced step called on its flat inputs gives what its structured call gives."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from airflow_rover.worker.flat_call import FlatCall

SIGNATURE = (
    tf.TensorSpec([None, 3], tf.float32),
    [tf.TensorSpec([None, 2], tf.float32), tf.TensorSpec([None, 1], tf.float32)],
    [tf.TensorSpec([None], tf.int32)],
    tf.TensorSpec([], tf.float32),
)


def _step(
    x: tf.Tensor, rows: list[tf.Tensor], ids: list[tf.Tensor], scale: tf.Tensor
) -> tuple[tf.Tensor, list[tf.Tensor]]:
    with tf.GradientTape() as tape:
        tape.watch(rows)
        picked = [tf.gather(r, ids[0]) for r in rows]
        loss = scale * (tf.reduce_sum(x) + tf.add_n([tf.reduce_sum(p * p) for p in picked]))
    return loss, [tf.convert_to_tensor(g) for g in tape.gradient(loss, rows)]


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "structured-fallback"])
def test_flat_inputs_give_the_structured_call_s_outputs(direct: bool) -> None:
    rng = np.random.default_rng(0)
    fn = tf.function(_step, input_signature=SIGNATURE).get_concrete_function()
    x = tf.constant(rng.normal(size=(4, 3)).astype(np.float32))  # a tensor, as tf.data gives
    rows = [rng.normal(size=(5, d)).astype(np.float32) for d in (2, 1)]  # arrays, as the PS
    ids = np.array([0, 3, 3, 4], np.int32)
    scale = np.float32(0.5)
    call = FlatCall(fn)
    assert call.direct  # this TensorFlow has the internals; a test per path below
    call.direct = direct
    loss, grads = call([x, *rows, ids, scale])
    want_loss, want_grads = fn(x, rows, [ids], scale)
    assert float(loss) == float(want_loss)
    assert len(grads) == 2
    for got, want in zip(grads, want_grads, strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_array_equal(grads[1].numpy()[3], 2 * 2 * 0.5 * rows[1][3])  # id 3 twice
