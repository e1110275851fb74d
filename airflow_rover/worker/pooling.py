"""A list column's rows combined into one per sample: the same TensorFlow ops in training
(``worker.ps_model``), in the single-process yardstick and in the served model."""

from __future__ import annotations

import tensorflow as tf


def pool(rows: tf.Tensor, segments: tf.Tensor, samples: tf.Tensor, pooling: str) -> tf.Tensor:
    """(samples, dim): per sample the sum (``pooling="sum"``) or the mean (``"mean"``) of
    ``rows`` (values, dim) whose ``segments`` (values,) name it; a sample without a row gets
    zeros. The gradient reaches each row."""
    summed = tf.math.unsorted_segment_sum(rows, segments, samples)
    if pooling != "mean":
        return summed
    ones = tf.ones_like(segments, dtype=rows.dtype)
    counts = tf.math.unsorted_segment_sum(ones, segments, samples)
    return summed / tf.maximum(counts, 1)[:, None]


def segments_of(lengths: tf.Tensor) -> tf.Tensor:
    """The sample index of each value of samples holding ``lengths`` values each."""
    return tf.repeat(tf.range(tf.size(lengths, out_type=tf.int32)), tf.cast(lengths, tf.int32))
