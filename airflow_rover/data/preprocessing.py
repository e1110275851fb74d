"""The user's preprocessing and the one path from stored rows to step elements.

A job's ``preprocess`` (``package.module:function``) maps each ``Batch`` read from the data (the
schema's own mapping applied: normalised dense columns, hashed ids) to the ``Batch`` the model
trains on: the same columns, values changed (bucketised, crossed into a column's ids, clipped,
truncated lists). It runs per batch and must be deterministic: a trainer and a data worker, or
a batch read again after a failure, give the step the same element. ``prepared_elements`` is
that path for both, so they cannot drift apart.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator

import numpy as np

from airflow_rover.data.batch import Batch, Schema
from airflow_rover.data.batch_ids import Element, ElementEncoder
from airflow_rover.data.reader import SampleReader

Preprocess = Callable[[Batch], Batch]


class PreprocessError(ValueError):
    """The preprocessing cannot be imported, or gave a batch the model cannot train on."""


def unchanged(batch: Batch) -> Batch:
    """The default preprocessing: the schema's mapping is all there is."""
    return batch


def load_preprocess(ref: str | None) -> Preprocess:
    """The function ``ref`` names (``package.module:function``); None: ``unchanged``."""
    if ref is None:
        return unchanged
    module_name, _, attr = ref.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise PreprocessError(f"preprocess={ref!r} cannot be imported: {exc}") from exc
    if not callable(fn):
        raise PreprocessError(f"preprocess={ref!r} is not callable")
    return fn


def checked(fn: Preprocess, batch: Batch, schema: Schema, ref: str | None = None) -> Batch:
    """``fn(batch)``, refused unless it keeps the rows and the columns of ``schema`` and its
    ids within each column's vocabulary (the model's tables are sized by it)."""
    if fn is unchanged or not len(batch):
        return batch
    name = f"preprocess={ref!r}" if ref else "preprocess"
    try:
        out = fn(batch)
    except Exception as exc:
        raise PreprocessError(f"{name} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(out, Batch):
        raise PreprocessError(f"{name} must return a Batch, got {type(out).__name__}")
    if len(out) != len(batch):
        raise PreprocessError(f"{name} returned {len(out)} rows for {len(batch)}")
    if out.dense.shape[1] != schema.num_dense:
        raise PreprocessError(
            f"{name} returned {out.dense.shape[1]} dense columns, the schema has {schema.num_dense}"
        )
    if out.categorical.shape[1] != schema.num_categorical or len(out.lists) != len(schema.lists):
        raise PreprocessError(
            f"{name} returned {out.categorical.shape[1]} categorical and {len(out.lists)} list "
            f"columns, the schema has {schema.num_categorical} and {len(schema.lists)}"
        )
    for j, column in enumerate(schema.categorical):
        ids = out.categorical[:, j]
        if ids.size and not column.raw and (ids.min() < 0 or ids.max() >= column.vocab_size):
            raise PreprocessError(
                f"{name}: column {column.name!r} holds ids outside [0, {column.vocab_size})"
            )
    for ragged, listed in zip(out.lists, schema.lists, strict=True):
        if (
            ragged.values.size
            and not listed.raw
            and (ragged.values.min() < 0 or ragged.values.max() >= listed.vocab_size)
        ):
            raise PreprocessError(
                f"{name}: list column {listed.name!r} holds ids outside [0, {listed.vocab_size})"
            )
    return out


def prepared_elements(
    reader: SampleReader,
    preprocess: Preprocess,
    encoder: ElementEncoder,
    start: int,
    end: int,
    batch_size: int,
    ref: str | None = None,
) -> Iterator[Element]:
    """The step elements of samples ``[start, end)``, ``batch_size`` at a time: read once,
    then per batch preprocessed and encoded."""
    samples = reader.read(start, end)
    for lo in range(0, len(samples), batch_size):
        batch = checked(preprocess, samples[lo : lo + batch_size], reader.schema, ref)
        yield encoder.element(batch)


def same_elements(a: Element, b: Element) -> bool:
    """Whether two elements hold the same arrays (names, dtypes, shapes and values)."""
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a
    )
