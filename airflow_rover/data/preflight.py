"""The data half of the checks run before any process of a job starts (``worker.preflight``
runs them, then builds the model).

A job that would fail on every node (a missing dataset, a table reading a column the data
lacks, ids outside a table's vocabulary, a model path that does not import) fails here instead,
with a message naming the field and what is accepted.
"""

from __future__ import annotations

import importlib

from airflow_rover.core.spec import REFERENCE_MODELS, FeatureConfig, JobSpec
from airflow_rover.data.features import resolve_features
from airflow_rover.data.reader import SampleReader, open_split
from airflow_rover.data.vocab_check import first_id_outside_vocab


class PreflightError(ValueError):
    """The job spec cannot run; the message names the field."""


def _open(spec: JobSpec, field: str, path: str) -> SampleReader:
    try:
        return open_split(spec, path)
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


def check_data(spec: JobSpec) -> FeatureConfig:
    """Check ``spec``'s datasets and features against each other; returns the resolved
    feature config."""
    train = _open(spec, "train_data", spec.train_data)
    schema = train.schema
    readers = {"train_data": (spec.train_data, train)}
    if spec.eval_data is not None:
        evaluated = _open(spec, "eval_data", spec.eval_data)
        if evaluated.schema != schema:
            raise PreflightError(
                f"eval_data={spec.eval_data!r}: its columns differ from train_data's"
            )
        readers["eval_data"] = (spec.eval_data, evaluated)
    features = resolve_features(spec)
    if features.num_dense != schema.num_dense:
        raise PreflightError(
            f"features.num_dense={features.num_dense}: the dataset has {schema.num_dense}"
        )
    vocab = {c.name: c.vocab_size for c in schema.categorical}
    vocab |= {c.name: c.vocab_size for c in schema.lists}
    raw = {c.name for c in schema.categorical if c.raw} | {c.name for c in schema.lists if c.raw}
    for i, table in enumerate(features.tables):
        if table.column not in vocab:
            raise PreflightError(
                f"features.tables[{i}].column={table.column!r} is not a column of "
                f"{spec.train_data!r}; accepted: {sorted(vocab)}"
            )
        if table.index == "ids" and table.values != "ids" and table.column not in raw:
            raise PreflightError(
                f"features.tables[{i}].index='ids' reads {table.values} of column "
                f"{table.column!r}, which the reader hashes into {vocab.get(table.column)} "
                "buckets: give the column raw=true in data_schema (its values then reach the "
                "table unfolded, as the served model takes them)"
            )
        if table.index == "vocab" and table.vocab_size < vocab[table.column]:
            raise PreflightError(
                f"features.tables[{i}].vocab_size={table.vocab_size} is smaller than column "
                f"{table.column!r}'s vocabulary ({vocab[table.column]})"
            )
    for field, (path, reader) in readers.items():
        check_ids(field, path, reader, features, spec.training.shard_size)
    return features


def check_ids(
    field: str, path: str, reader: SampleReader, features: FeatureConfig, shard_size: int
) -> None:
    """A sample of the dataset's ids fits each table's vocabulary (``data.vocab_check``)."""
    try:
        found = first_id_outside_vocab(reader, features, shard_size)
    except ValueError as exc:  # a sampled row the reader refuses: a negative weight, a null label
        raise PreflightError(f"{field}={path!r}: {exc}") from None
    if found is None:
        return
    raise PreflightError(
        f"{field}={path!r}: column {found.column!r} holds id {found.id} at row {found.row}; "
        f"table {found.table!r} reads it with vocab_size {found.vocab_size}, so its ids must be "
        f"in [0, {found.vocab_size}); {found.bad_rows} of the {found.sampled_rows} rows sampled "
        "hold one outside, and every batch holding one fails on every worker. Map the column's "
        "ids into that range, or raise the vocab_size (the table's in features.tables, or the "
        "column's in the dataset's manifest.json where the features are left to default)"
    )
