"""Reference models and the loading of user model factories.

A model factory takes the job's ``FeatureConfig`` and returns a Keras model whose inputs are a
dict: ``DENSE_INPUT`` (batch, num_dense) and one (batch, dim) tensor per embedding table, already
looked up and pooled by the runtime; its output is one logit per sample. The embedding tables
themselves live on the parameter servers, never in the Keras model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import keras

from airflow_rover.core.spec import FeatureConfig

ModelFactory = Callable[[FeatureConfig], keras.Model]
# Not "dense": Keras names a model's first Dense layer "dense", and names must be unique.
DENSE_INPUT = "dense_features"


def _inputs(features: FeatureConfig) -> dict[str, keras.KerasTensor]:
    inputs = {DENSE_INPUT: keras.Input((features.num_dense,), name=DENSE_INPUT)}
    for table in features.tables:
        inputs[table.name] = keras.Input((table.dim,), name=table.name)
    return inputs


def wide_deep(features: FeatureConfig, hidden: tuple[int, ...] = (256, 128)) -> keras.Model:
    """Wide & Deep (Cheng et al. 2016): a linear model over dense features and 1-dim
    per-id weights, plus an MLP over dense features and the wider embeddings."""
    inputs = _inputs(features)
    wide_parts = [keras.layers.Dense(1, name="wide_dense")(inputs[DENSE_INPUT])]
    wide_parts += [inputs[t.name] for t in features.tables if t.dim == 1]
    wide = keras.layers.Add(name="wide")(wide_parts) if len(wide_parts) > 1 else wide_parts[0]
    deep_in = [inputs[DENSE_INPUT]] + [inputs[t.name] for t in features.tables if t.dim > 1]
    x = keras.layers.Concatenate(name="deep_input")(deep_in)
    for i, units in enumerate(hidden):
        x = keras.layers.Dense(units, activation="relu", name=f"deep_{i}")(x)
    deep = keras.layers.Dense(1, name="deep_logit")(x)
    logit = keras.layers.Add(name="logit")([wide, deep])
    return keras.Model(inputs=inputs, outputs=logit, name="wide_deep")


def _linear(features: FeatureConfig, inputs: dict[str, keras.KerasTensor]) -> keras.KerasTensor:
    """First-order term: a linear layer on dense features plus any 1-dim per-id weights."""
    parts = [keras.layers.Dense(1, name="linear_dense")(inputs[DENSE_INPUT])]
    parts += [inputs[t.name] for t in features.tables if t.dim == 1]
    return keras.layers.Add(name="linear")(parts) if len(parts) > 1 else parts[0]


def _fields(features: FeatureConfig, inputs: dict[str, keras.KerasTensor]) -> keras.KerasTensor:
    """(batch, fields, dim) stack of the embeddings that interact (the widest common dim)."""
    dims = [t.dim for t in features.tables if t.dim > 1]
    if not dims:
        raise ValueError("features.tables: this model needs embedding tables with dim > 1")
    dim = max(set(dims), key=dims.count)
    fields = [inputs[t.name] for t in features.tables if t.dim == dim]
    return keras.layers.Lambda(lambda xs: keras.ops.stack(xs, axis=1), name="fields")(fields)


def _mlp(x: keras.KerasTensor, hidden: tuple[int, ...], prefix: str) -> keras.KerasTensor:
    for i, units in enumerate(hidden):
        x = keras.layers.Dense(units, activation="relu", name=f"{prefix}_{i}")(x)
    return keras.layers.Dense(1, name=f"{prefix}_logit")(x)


def _deep_input(features: FeatureConfig, inputs: dict[str, keras.KerasTensor]) -> keras.KerasTensor:
    parts = [inputs[DENSE_INPUT]] + [inputs[t.name] for t in features.tables if t.dim > 1]
    return keras.layers.Concatenate(name="deep_input")(parts)


def deepfm(features: FeatureConfig, hidden: tuple[int, ...] = (256, 128)) -> keras.Model:
    """DeepFM (Guo et al. 2017): linear + factorization-machine pairwise term + MLP."""
    inputs = _inputs(features)
    fields = _fields(features, inputs)

    def fm(v: keras.KerasTensor) -> keras.KerasTensor:
        summed = keras.ops.sum(v, axis=1)
        pairwise = keras.ops.square(summed) - keras.ops.sum(keras.ops.square(v), axis=1)
        return 0.5 * keras.ops.sum(pairwise, axis=1, keepdims=True)

    fm_term = keras.layers.Lambda(fm, name="fm")(fields)
    deep = _mlp(_deep_input(features, inputs), hidden, "deep")
    logit = keras.layers.Add(name="logit")([_linear(features, inputs), fm_term, deep])
    return keras.Model(inputs=inputs, outputs=logit, name="deepfm")


class CrossLayer(keras.layers.Layer):
    """One DCN cross layer: x_{l+1} = x0 * (x_l . w) + b + x_l (Wang et al. 2017)."""

    def build(self, input_shape: tuple) -> None:
        width = input_shape[0][-1]
        self.w = self.add_weight(shape=(width, 1), initializer="glorot_uniform", name="w")
        self.b = self.add_weight(shape=(width,), initializer="zeros", name="b")

    def call(self, inputs: list) -> keras.KerasTensor:
        x0, x = inputs
        return x0 * keras.ops.matmul(x, self.w) + self.b + x


def dcn(
    features: FeatureConfig, cross_layers: int = 3, hidden: tuple[int, ...] = (256, 128)
) -> keras.Model:
    """Deep & Cross Network: explicit bounded-degree feature crosses beside an MLP."""
    inputs = _inputs(features)
    x0 = _deep_input(features, inputs)
    x = x0
    for i in range(cross_layers):
        x = CrossLayer(name=f"cross_{i}")([x0, x])
    deep = x0
    for i, units in enumerate(hidden):
        deep = keras.layers.Dense(units, activation="relu", name=f"deep_{i}")(deep)
    both = keras.layers.Concatenate(name="cross_deep")([x, deep])
    logit = keras.layers.Add(name="logit")(
        [keras.layers.Dense(1, name="out")(both), _linear(features, inputs)]
    )
    return keras.Model(inputs=inputs, outputs=logit, name="dcn")


class CompressedInteraction(keras.layers.Layer):
    """xDeepFM's CIN layer: vector-wise interactions of the previous maps with the fields."""

    def __init__(self, maps: int, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.maps = maps

    def build(self, input_shape: tuple) -> None:
        fields, prev = input_shape[0][1], input_shape[1][1]
        self.kernel = self.add_weight(
            shape=(prev * fields, self.maps), initializer="glorot_uniform", name="kernel"
        )

    def call(self, inputs: list) -> keras.KerasTensor:
        x0, xk = inputs  # (batch, m, d), (batch, h, d)
        z = keras.ops.einsum("bhd,bmd->bdhm", xk, x0)
        shape = keras.ops.shape(z)
        z = keras.ops.reshape(z, (shape[0], shape[1], shape[2] * shape[3]))
        return keras.ops.transpose(keras.ops.matmul(z, self.kernel), (0, 2, 1))  # (b, maps, d)


def xdeepfm(
    features: FeatureConfig, cin: tuple[int, ...] = (64, 64), hidden: tuple[int, ...] = (256, 128)
) -> keras.Model:
    """xDeepFM (Lian et al. 2018): linear + Compressed Interaction Network + MLP."""
    inputs = _inputs(features)
    x0 = _fields(features, inputs)
    xk, pooled = x0, []
    for i, maps in enumerate(cin):
        xk = CompressedInteraction(maps, name=f"cin_{i}")([x0, xk])
        pooled.append(keras.layers.Lambda(lambda t: keras.ops.sum(t, axis=2), name=f"pool_{i}")(xk))
    cin_out = keras.layers.Dense(1, name="cin_logit")(keras.layers.Concatenate()(pooled))
    deep = _mlp(_deep_input(features, inputs), hidden, "deep")
    logit = keras.layers.Add(name="logit")([_linear(features, inputs), cin_out, deep])
    return keras.Model(inputs=inputs, outputs=logit, name="xdeepfm")


REFERENCE_FACTORIES: dict[str, ModelFactory] = {
    "wide_deep": wide_deep,
    "deepfm": deepfm,
    "dcn": dcn,
    "xdeepfm": xdeepfm,
}


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
