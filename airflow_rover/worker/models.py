"""Reference models and the loading of user model factories.

A model factory takes the job's ``FeatureConfig`` and returns a Keras model whose inputs are a
dict: ``"dense"`` (batch, num_dense) and one (batch, dim) tensor per embedding table, already
looked up and pooled by the runtime; its output is one logit per sample. The embedding tables
themselves live on the parameter servers, never in the Keras model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import keras

from airflow_rover.core.spec import FeatureConfig

ModelFactory = Callable[[FeatureConfig], keras.Model]


def _inputs(features: FeatureConfig) -> dict[str, keras.KerasTensor]:
    inputs = {"dense": keras.Input((features.num_dense,), name="dense")}
    for table in features.tables:
        inputs[table.name] = keras.Input((table.dim,), name=table.name)
    return inputs


def wide_deep(features: FeatureConfig, hidden: tuple[int, ...] = (256, 128)) -> keras.Model:
    """Wide & Deep (Cheng et al. 2016): a linear model over dense features and 1-dim
    per-id weights, plus an MLP over dense features and the wider embeddings."""
    inputs = _inputs(features)
    wide_parts = [keras.layers.Dense(1, name="wide_dense")(inputs["dense"])]
    wide_parts += [inputs[t.name] for t in features.tables if t.dim == 1]
    wide = keras.layers.Add(name="wide")(wide_parts) if len(wide_parts) > 1 else wide_parts[0]
    deep_in = [inputs["dense"]] + [inputs[t.name] for t in features.tables if t.dim > 1]
    x = keras.layers.Concatenate(name="deep_input")(deep_in)
    for i, units in enumerate(hidden):
        x = keras.layers.Dense(units, activation="relu", name=f"deep_{i}")(x)
    deep = keras.layers.Dense(1, name="deep_logit")(x)
    logit = keras.layers.Add(name="logit")([wide, deep])
    return keras.Model(inputs=inputs, outputs=logit, name="wide_deep")


REFERENCE_FACTORIES: dict[str, ModelFactory] = {"wide_deep": wide_deep}


def load_factory(ref: str) -> ModelFactory:
    """A reference model name or ``package.module:function``; errors name the ``model`` field."""
    if ref in REFERENCE_FACTORIES:
        return REFERENCE_FACTORIES[ref]
    module_name, _, attr = ref.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"model={ref!r} cannot be imported: {exc}") from exc
    if not callable(factory):
        raise ValueError(f"model={ref!r} is not callable")
    return factory
