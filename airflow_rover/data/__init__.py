"""Datasets: a deterministic synthetic Criteo-shaped generator and format-agnostic readers."""

from airflow_rover.data.reader import (
    Batch,
    CategoricalColumn,
    NpyColumnsReader,
    SampleReader,
    Schema,
    open_dataset,
    register_format,
)
from airflow_rover.data.synthetic import (
    GeneratedDataset,
    SyntheticConfig,
    generate_dataset,
    generate_main,
)

__all__ = [
    "Batch",
    "CategoricalColumn",
    "GeneratedDataset",
    "NpyColumnsReader",
    "SampleReader",
    "Schema",
    "SyntheticConfig",
    "generate_dataset",
    "generate_main",
    "open_dataset",
    "register_format",
]
