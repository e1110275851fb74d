"""A job's feature config: the user's, or the default one derived from the dataset's schema.

Resolved once, when the job is submitted (``launchers.base.write_job``), and written into the
job's spec: every process of the job reads the same tables from ``job.json``.
"""

from __future__ import annotations

from typing import Literal

from airflow_rover.core.spec import (
    FeatureColumn,
    FeatureConfig,
    JobSpec,
    default_features,
)
from airflow_rover.data.batch import Schema
from airflow_rover.data.reader import open_split


def resolve_features(spec: JobSpec) -> FeatureConfig:
    """The spec's features, or one table per categorical column of its training data (one
    shared by the columns that name the same table; a list column's pooled by its combiner)."""
    if spec.features is not None:
        return spec.features
    schema = open_split(spec, spec.train_data).schema
    return default_features(
        feature_columns(schema), schema.num_dense, spec.model, spec.embedding_dim
    )


def feature_columns(schema: Schema) -> list[FeatureColumn]:
    """The categorical columns of a dataset as the default features read them: the scalar
    ones, then the lists."""
    columns = [
        FeatureColumn(c.name, c.vocab_size, "sum", c.table, _values(c.values), False, _index(c.raw))
        for c in schema.categorical
    ]
    columns += [
        FeatureColumn(
            c.name,
            c.vocab_size,
            _pooling(c.combiner),
            c.table,
            _values(c.values),
            True,
            _index(c.raw),
        )
        for c in schema.lists
    ]
    return columns


def with_resolved_features(spec: JobSpec) -> JobSpec:
    """``spec`` with its features written out (itself if they already are)."""
    if spec.features is not None:
        return spec
    features = resolve_features(spec)
    return spec.model_copy(update={"features": features})


def _values(values: str) -> Literal["ids", "ints", "strings"]:
    if values == "ints":
        return "ints"
    return "strings" if values == "strings" else "ids"


def _index(raw: bool) -> Literal["vocab", "ids"]:
    """A column of raw int64 ids gets a collisionless table; any other, a vocabulary."""
    return "ids" if raw else "vocab"


def _pooling(combiner: str) -> Literal["sum", "mean"]:
    return "mean" if combiner == "mean" else "sum"
