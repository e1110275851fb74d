"""A job's feature config: the user's, or the default one derived from the dataset's schema.

Resolved once, when the job is submitted (``launchers.base.write_job``), and written into the
job's spec: every process of the job reads the same tables from ``job.json``.
"""

from __future__ import annotations

from airflow_rover.core.spec import FeatureConfig, JobSpec, default_features
from airflow_rover.data.reader import open_split


def resolve_features(spec: JobSpec) -> FeatureConfig:
    """The spec's features, or one table per categorical column of its training data."""
    if spec.features is not None:
        return spec.features
    schema = open_split(spec, spec.train_data).schema
    columns = [(c.name, c.vocab_size) for c in schema.categorical]
    return default_features(columns, schema.num_dense, spec.model, spec.embedding_dim)


def with_resolved_features(spec: JobSpec) -> JobSpec:
    """``spec`` with its features written out (itself if they already are)."""
    if spec.features is not None:
        return spec
    return spec.model_copy(update={"features": resolve_features(spec)})
