"""Everything checked before any process of a job starts, shared by the operator and the CLI:
the data (``data.preflight``), then the job's preprocessing run on a few rows of the training
data and the model built once and called on them, as a worker does both.

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

from airflow_rover.core.hashing import INIT_SCALE, initial_rows
from airflow_rover.core.spec import FeatureConfig, JobSpec
from airflow_rover.data.batch_ids import ElementEncoder
from airflow_rover.data.preflight import PreflightError, check_data, check_model_importable
from airflow_rover.data.preprocessing import PreprocessError, load_preprocess, prepared_elements
from airflow_rover.data.reader import Batch, SampleReader, open_split
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
    first rows of the training data, preprocessed by ``spec.preprocess`` (which must keep the
    rows, the columns and the vocabularies); it must return one float logit per row, shape
    (rows, 1)."""
    with tensorflow_stderr_to_debug():  # a user's module imports TensorFlow too
        check_model_importable(spec.model)
        _check_model(spec, features)


def _check_model(spec: JobSpec, features: FeatureConfig) -> None:
    reader = open_split(spec, spec.train_data)
    rows = min(CHECK_ROWS, reader.num_samples)
    columns = [c.name for c in reader.schema.categorical]
    lists = [c.name for c in reader.schema.lists]
    encoder = ElementEncoder(features, columns, lists)
    element = first_element(spec, reader, encoder, rows) if rows else None
    model, package = build_model(spec.model, features)
    if element is None:
        return  # no rows to call the model on
    inputs = element_inputs(encoder, element, spec.training.seed)
    try:
        logits, _ = model.stateless_call(
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            inputs,
            training=True,
        )
    except Exception as exc:  # whatever the user's model raises
        raise PreflightError(
            f"model={spec.model!r}: calling it on {rows} rows of train_data as a worker "
            f"does raised {quote(exc)}{_where(exc, package)}"
        ) from None
    check_output(spec.model, logits, rows)


def first_element(
    spec: JobSpec, reader: SampleReader, encoder: ElementEncoder, rows: int
) -> dict[str, np.ndarray]:
    """The step element of the first ``rows`` rows, made as a trainer or a data worker makes
    it (``prepared_elements``): the job's preprocessing, checked, then the ids. A preprocess
    that cannot be imported, raises, or breaks the columns or the vocabularies fails here."""
    where = f"on {rows} rows of train_data, as a worker runs it"
    try:
        preprocess = load_preprocess(spec.preprocess)
        return next(prepared_elements(reader, preprocess, encoder, 0, rows, rows, spec.preprocess))
    except PreprocessError as exc:
        raise PreflightError(f"{exc} ({where})") from None
    except ValueError as exc:  # ids beyond a table's vocab_size (features smaller than data)
        if spec.preprocess is None:
            raise
        raise PreflightError(f"preprocess={spec.preprocess!r}: {exc} ({where})") from None


def model_inputs(
    features: FeatureConfig,
    columns: list[str],
    batch: Batch,
    seed: int,
    lists: Sequence[str] = (),
) -> dict[str, np.ndarray]:
    """A worker's model inputs for ``batch`` (no preprocessing): see ``element_inputs``."""
    encoder = ElementEncoder(features, columns, lists)
    return element_inputs(encoder, encoder.element(batch), seed)


def element_inputs(
    encoder: ElementEncoder, element: dict[str, np.ndarray], seed: int
) -> dict[str, np.ndarray]:
    """A worker's model inputs for a step element: its dense features and, per table, each
    row's embedding as the PS initialises it, a list column's pooled (``PSModel._inputs``)."""
    from airflow_rover.worker.models import DENSE_INPUT

    inputs = {DENSE_INPUT: element["dense"]}
    samples = len(element["dense"])
    rows = [  # per group, the initial row of each unique id the element pulls
        initial_rows(g.name, element[f"unique/{g.name}"], g.dim, seed, INIT_SCALE)
        for g in encoder.groups
    ]
    for group, group_rows, scalar in zip(encoder.groups, rows, encoder.scalar, strict=True):
        inverse = element[f"inverse/{group.name}"]
        for k, table in enumerate(scalar):
            inputs[table.name] = group_rows[inverse[:, k]]
    for g, table in encoder.lists:
        looked_up = rows[g][element[f"list/{table.name}"]]
        segments = element[f"segments/{table.name}"]
        inputs[table.name] = _pooled(looked_up, segments, samples, table.pooling)
    return inputs


def _pooled(rows: np.ndarray, segments: np.ndarray, samples: int, pooling: str) -> np.ndarray:
    """Per sample the sum or mean of its rows (zeros for none), as ``worker.pooling.pool``."""
    out = np.zeros((samples, rows.shape[1]), np.float32)
    np.add.at(out, segments, rows)
    if pooling == "mean":
        out /= np.maximum(np.bincount(segments, minlength=samples), 1)[:, None]
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
