"""Everything checked before any process of a job starts, shared by the operator and the CLI:
the data (``data.preflight``), then the model built once on a few rows of the training data and
called as a worker calls it.

A model factory that raises, or a model that returns other than one logit per row, fails every
worker on its first step and again on each restart; found here, it fails the task once, with the
model named and what it returned or raised. This lives beside the worker's model code it runs
(``data`` may not import it); TensorFlow is imported only when a check runs, never when a DAG
file imports the operator.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.hashing import INIT_SCALE, initial_rows
from airflow_rover.core.spec import FeatureConfig, JobSpec
from airflow_rover.data.preflight import PreflightError, check_data, check_model_importable
from airflow_rover.data.reader import Batch, open_split
from airflow_rover.worker.tensorflow_notes import tensorflow_stderr_to_debug

if TYPE_CHECKING:
    import keras

log = logging.getLogger(__name__)

CHECK_ROWS = 64  # rows of the training data the model is called on
_QUOTE_CHARS = 400  # of an exception's message
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_KERAS_CALL = re.compile(r"Exception encountered when calling (\S+?)\.?\s+")


def preflight(spec: JobSpec) -> FeatureConfig:
    """Validate ``spec`` against its data and its model; returns the resolved feature config.
    Raises ``PreflightError`` naming the field, the column or the model."""
    started = time.monotonic()
    features = check_data(spec)
    data_s = time.monotonic() - started
    check_model(spec, features)
    log.info(
        "preflight passed in %.1f s (data %.2f s, model %r on %d rows %.1f s)",
        time.monotonic() - started,
        data_s,
        spec.model,
        CHECK_ROWS,
        time.monotonic() - started - data_s,
    )
    return features


def check_model(spec: JobSpec, features: FeatureConfig) -> None:
    """Import ``spec.model``, build it from ``features`` as a worker does and call it on the
    first rows of the training data; it must return one float logit per row, shape (rows, 1)."""
    with tensorflow_stderr_to_debug():  # a user's module imports TensorFlow too
        check_model_importable(spec.model)
        _check_model(spec, features)


def _check_model(spec: JobSpec, features: FeatureConfig) -> None:
    model, package = build_model(spec.model, features)
    reader = open_split(spec, spec.train_data)
    batch = reader.read(0, min(CHECK_ROWS, reader.num_samples))
    if len(batch) == 0:
        return  # no rows to call the model on
    columns = [c.name for c in reader.schema.categorical]
    lists = [c.name for c in reader.schema.lists]
    inputs = model_inputs(features, columns, batch, spec.training.seed, lists)
    try:
        logits, _ = model.stateless_call(
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            inputs,
            training=True,
        )
    except Exception as exc:  # whatever the user's model raises
        raise PreflightError(
            f"model={spec.model!r}: calling it on {len(batch)} rows of train_data as a worker "
            f"does raised {quote(exc)}{_where(exc, package)}"
        ) from None
    check_output(spec.model, logits, len(batch))


def model_inputs(
    features: FeatureConfig,
    columns: list[str],
    batch: Batch,
    seed: int,
    lists: Sequence[str] = (),
) -> dict[str, np.ndarray]:
    """A worker's model inputs for ``batch``: its dense features and, per table, each row's
    embedding as the PS initialises it, a list column's pooled (``PSModel._inputs``)."""
    from airflow_rover.worker.models import DENSE_INPUT

    index = {name: i for i, name in enumerate(columns)}
    list_index = {name: j for j, name in enumerate(lists)}
    inputs = {DENSE_INPUT: batch.dense}
    for group in EmbeddingPlacement.from_features(features).groups:
        for table in group.tables:
            if table.column in list_index:
                ragged = batch.lists[list_index[table.column]]
                fused = group.fused_values(table, ragged.values)
                rows = initial_rows(group.name, fused, group.dim, seed, INIT_SCALE)
                inputs[table.name] = _pooled(rows, ragged.row_splits, table.pooling)
            else:
                fused = group.fused_ids(batch.categorical, index, (table,))[:, 0]
                inputs[table.name] = initial_rows(group.name, fused, group.dim, seed, INIT_SCALE)
    return inputs


def _pooled(rows: np.ndarray, row_splits: np.ndarray, pooling: str) -> np.ndarray:
    """Per sample the sum or mean of its rows (zeros for none), as ``worker.pooling.pool``."""
    lengths = np.diff(row_splits)
    out = np.zeros((lengths.size, rows.shape[1]), np.float32)
    np.add.at(out, np.repeat(np.arange(lengths.size), lengths), rows)
    if pooling == "mean":
        out /= np.maximum(lengths, 1)[:, None]
    return out


def build_model(ref: str, features: FeatureConfig) -> tuple[keras.Model, str]:
    """``ref``'s factory called with ``features``, as a worker calls it, and the module that
    defines it; its exception is quoted with the line of that module's package that raised it."""
    import keras

    from airflow_rover.worker.models import load_factory

    try:
        factory = load_factory(ref)
    except ValueError as exc:
        raise PreflightError(str(exc)) from None
    package = getattr(factory, "__module__", None) or ""
    try:
        model = factory(features)
    except Exception as exc:  # whatever the user's factory raises
        raise PreflightError(
            f"model={ref!r}: building it raised {quote(exc)}{_where(exc, package)}; the "
            f"factory was called with the job's features ({features.num_dense} dense, "
            f"{len(features.tables)} tables: {_tables(features)})"
        ) from None
    if not isinstance(model, keras.Model):
        raise PreflightError(
            f"model={ref!r}: the factory returned {type(model).__name__}, expected a "
            "keras.Model taking the dense features and one input per table"
        )
    return model, package


def check_output(ref: str, logits: Any, rows: int) -> None:
    """One float logit per row: shape (rows, 1), as the worker's loss takes it."""
    expected = f"expected ({rows}, 1): one logit per row (end the model with Dense(1))"
    if isinstance(logits, list | tuple | dict):
        raise PreflightError(
            f"model={ref!r} returned {len(logits)} outputs for {rows} rows of train_data; "
            f"{expected}"
        )
    shape = tuple(logits.shape)
    if shape != (rows, 1):
        raise PreflightError(
            f"model={ref!r} returned shape {shape} for {rows} rows of train_data; {expected}"
        )
    if not logits.dtype.is_floating:
        raise PreflightError(f"model={ref!r} returned {logits.dtype.name} logits; expected floats")


def quote(exc: BaseException) -> str:
    """``Type: message``, the message without Keras's argument dump, on one line, bounded."""
    text = _ANSI.sub("", str(exc)).split("Arguments received by")[0]
    text = _KERAS_CALL.sub(r"in \1: ", text)
    text = " ".join(text.split())
    if len(text) > _QUOTE_CHARS:
        text = text[: _QUOTE_CHARS - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _where(exc: BaseException, module_name: str) -> str:
    """`` at file:line in function``: the deepest frame of the traceback in the top-level
    package of ``module_name`` (the user's code, not Keras's or TensorFlow's), else the
    deepest."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    roots = _package_roots(module_name)
    mine = [f for f in frames if any(Path(f.filename).is_relative_to(r) for r in roots)]
    frame = (mine or frames)[-1]
    return f" at {frame.filename}:{frame.lineno} in {frame.name}"


def _package_roots(module_name: str) -> list[Path]:
    """Where the top-level package of ``module_name`` lives (a lone module: its file)."""
    top = sys.modules.get(module_name.partition(".")[0])
    if top is None:
        return []
    paths = [Path(p) for p in getattr(top, "__path__", [])]
    file = getattr(top, "__file__", None)
    return paths or ([Path(file)] if file else [])


def _tables(features: FeatureConfig, shown: int = 3) -> str:
    names = [f"{t.name} (dim {t.dim})" for t in features.tables[:shown]]
    more = len(features.tables) - shown
    return ", ".join(names) + (f", ... {more} more" if more > 0 else "")
