"""Datasets: format-agnostic readers here; the synthetic Criteo-shaped generator in
``airflow_rover.data.synthetic`` (not imported here: it pulls in scipy, which a PS, started
anew on every relaunch, does not need)."""

from airflow_rover.data.reader import (
    Batch,
    CategoricalColumn,
    NpyColumnsReader,
    SampleReader,
    Schema,
    open_dataset,
    register_format,
)

__all__ = [
    "Batch",
    "CategoricalColumn",
    "NpyColumnsReader",
    "SampleReader",
    "Schema",
    "open_dataset",
    "register_format",
]
