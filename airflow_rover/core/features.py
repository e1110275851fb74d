"""Resolve a job's feature config: the user's, or the default one derived from the dataset."""

from __future__ import annotations

from airflow_rover.core.spec import FeatureConfig, JobSpec, default_features
from airflow_rover.data.reader import open_dataset


def resolve_features(spec: JobSpec) -> FeatureConfig:
    """The same answer in every process of a job: derived only from the spec and the manifest."""
    if spec.features is not None:
        return spec.features
    schema = open_dataset(spec.train_data).schema
    columns = [(c.name, c.vocab_size) for c in schema.categorical]
    return default_features(columns, schema.num_dense, spec.model, spec.embedding_dim)
