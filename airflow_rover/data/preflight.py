"""Checks run before any process of a job starts, shared by the operator and the CLI.

A job that would fail in its first seconds on every node (a missing dataset, a table reading
a column the data lacks, a model path that does not import) fails here instead, with a
message naming the field and what is accepted.
"""

from __future__ import annotations

import importlib

from airflow_rover.core.spec import REFERENCE_MODELS, FeatureConfig, JobSpec
from airflow_rover.data.features import resolve_features
from airflow_rover.data.reader import SampleReader, open_dataset


class PreflightError(ValueError):
    """The job spec cannot run; the message names the field."""


def _open(field: str, path: str) -> SampleReader:
    try:
        return open_dataset(path)
    except (OSError, ValueError) as exc:
        raise PreflightError(f"{field}={path!r}: {exc}") from None


def check_model_importable(ref: str) -> None:
    """A reference model, or ``module:attr`` that imports and is callable."""
    if ref in REFERENCE_MODELS:
        return
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure of user code
        raise PreflightError(
            f"model={ref!r}: module {module_name!r} does not import: {exc}"
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise PreflightError(f"model={ref!r}: {module_name!r} has no callable {attr!r}")


def preflight(spec: JobSpec) -> FeatureConfig:
    """Validate ``spec`` against its data and code; returns the resolved feature config."""
    train = _open("train_data", spec.train_data)
    schema = train.schema
    if spec.eval_data is not None:
        eval_schema = _open("eval_data", spec.eval_data).schema
        if eval_schema != schema:
            raise PreflightError(
                f"eval_data={spec.eval_data!r}: its columns differ from train_data's"
            )
    features = resolve_features(spec)
    if features.num_dense != schema.num_dense:
        raise PreflightError(
            f"features.num_dense={features.num_dense}: the dataset has {schema.num_dense}"
        )
    vocab = {c.name: c.vocab_size for c in schema.categorical}
    for i, table in enumerate(features.tables):
        if table.column not in vocab:
            raise PreflightError(
                f"features.tables[{i}].column={table.column!r} is not a column of "
                f"{spec.train_data!r}; accepted: {sorted(vocab)}"
            )
        if table.vocab_size < vocab[table.column]:
            raise PreflightError(
                f"features.tables[{i}].vocab_size={table.vocab_size} is smaller than column "
                f"{table.column!r}'s vocabulary ({vocab[table.column]})"
            )
    check_model_importable(spec.model)
    return features
