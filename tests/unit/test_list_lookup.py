"""List columns and shared tables in the worker's lookup: a list column's rows are pooled per
sample (sum, mean, zeros for an empty list), every id's row gets its share of the gradient,
and columns sharing a table read (and push) one set of rows."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from airflow_rover.core.spec import FeatureConfig, TableConfig
from airflow_rover.data.batch import Batch, RaggedIds
from airflow_rover.worker.models import DENSE_INPUT, wide_deep
from airflow_rover.worker.ps_model import PSModel

FEATURES = FeatureConfig(
    num_dense=2,
    tables=(
        TableConfig(name="city", column="city", vocab_size=10, dim=4, table="geo"),
        TableConfig(name="ad", column="ad", vocab_size=7, dim=4),
        TableConfig(
            name="visited", column="visited", vocab_size=10, dim=4, table="geo", pooling="mean"
        ),
        TableConfig(name="tags", column="tags", vocab_size=5, dim=4, multivalued=True),
        TableConfig(name="ad_wide", column="ad", vocab_size=7, dim=1),
    ),
)
VISITED = [[1, 2], [], [2, 2, 5]]
TAGS = [[4], [0, 3], []]


def _ragged(lists: list[list[int]]) -> RaggedIds:
    splits = np.cumsum([0] + [len(x) for x in lists]).astype(np.int64)
    return RaggedIds(np.array([v for x in lists for v in x], np.int64), splits)


def _batch() -> Batch:
    return Batch(
        dense=np.arange(6, dtype=np.float32).reshape(3, 2) / 6,
        categorical=np.array([[1, 0], [3, 6], [9, 2]], np.int64),  # city, ad
        label=np.array([1.0, 0.0, 1.0], np.float32),
        lists=(_ragged(VISITED), _ragged(TAGS)),
    )


@pytest.fixture(scope="module")
def model() -> PSModel:
    keras.utils.set_random_seed(0)
    return PSModel(
        wide_deep(FEATURES, hidden=(8,)),
        FEATURES,
        ["city", "ad"],
        None,
        ["visited", "tags"],  # type: ignore[arg-type]
    )


def _rows(model: PSModel, element: dict[str, Any]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        g.name: rng.normal(size=(element[f"unique/{g.name}"].size, g.dim)).astype(np.float32)
        for g in model.groups
    }


def _inputs(model: PSModel, element: dict[str, Any], rows: dict[str, np.ndarray]) -> dict:
    return model._inputs(
        tf.constant(element["dense"]),
        [rows[g.name] for g in model.groups],
        [element[f"inverse/{g.name}"] for g in model.groups],
        *model._list_inputs(element),
    )


def _row(element: dict[str, Any], rows: dict[str, np.ndarray], fused: int) -> np.ndarray:
    at = int(np.searchsorted(element["unique/dim4"], fused))
    assert element["unique/dim4"][at] == fused
    return rows["dim4"][at]


def test_shared_tables_read_one_set_of_rows_and_lists_join_the_unique_ids(model: PSModel) -> None:
    """city and visited read table geo (offset 0), ad and tags come after it: every id is
    pulled once per batch, whichever columns hold it."""
    element = model.ids_element(_batch())
    geo = {1, 3, 9} | {1, 2, 5}
    ad = {10 + 0, 10 + 6, 10 + 2}
    tags = {17 + 4, 17 + 0, 17 + 3}
    assert element["unique/dim4"].tolist() == sorted(geo | ad | tags)
    assert element["unique/dim1"].tolist() == [0, 2, 6]
    assert element["inverse/dim4"].shape == (3, 2)  # the scalar entries: city, ad


def test_lists_pool_by_sum_and_mean_and_an_empty_list_gives_zeros(model: PSModel) -> None:
    element = model.ids_element(_batch())
    rows = _rows(model, element)
    got = {k: np.asarray(v) for k, v in _inputs(model, element, rows).items()}
    geo = {i: _row(element, rows, i) for i in (1, 2, 3, 5, 9)}
    tag = {i: _row(element, rows, 17 + i) for i in (0, 3, 4)}
    np.testing.assert_allclose(got["visited"][0], (geo[1] + geo[2]) / 2, rtol=1e-6)
    np.testing.assert_array_equal(got["visited"][1], np.zeros(4))
    np.testing.assert_allclose(got["visited"][2], (2 * geo[2] + geo[5]) / 3, rtol=1e-6)
    np.testing.assert_allclose(got["tags"][0], tag[4], rtol=1e-6)
    np.testing.assert_allclose(got["tags"][1], tag[0] + tag[3], rtol=1e-6)
    np.testing.assert_array_equal(got["tags"][2], np.zeros(4))
    np.testing.assert_array_equal(got["city"], np.stack([geo[1], geo[3], geo[9]]))
    assert got[DENSE_INPUT].shape == (3, 2)


def test_each_ids_row_gets_its_share_of_the_gradient(model: PSModel) -> None:
    """A row's gradient is the sum over every place it is read: a scalar column's sample, a
    list's sample (sum: as is; mean: divided by the list's length)."""
    batch = _batch()
    element = model.ids_element(batch)
    rows = _rows(model, element)
    weights = {n: v.numpy() for n, v in zip(model.var_names, model.variables, strict=True)}
    _, row_grads, _ = model.gradients(element, rows, weights)

    inputs = _inputs(model, element, rows)
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        logits = tf.squeeze(model.model(inputs), -1)
        loss = tf.reduce_mean(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=batch.label, logits=logits)
        )
    d = {k: np.asarray(v) for k, v in tape.gradient(loss, inputs).items()}
    expected = np.zeros_like(rows["dim4"])
    unique = list(element["unique/dim4"])
    for i, (city, ad) in enumerate(batch.categorical):
        expected[unique.index(city)] += d["city"][i]
        expected[unique.index(10 + ad)] += d["ad"][i]
        for v in VISITED[i]:
            expected[unique.index(v)] += d["visited"][i] / len(VISITED[i])
        for v in TAGS[i]:
            expected[unique.index(17 + v)] += d["tags"][i]
    np.testing.assert_allclose(row_grads["dim4"], expected, rtol=1e-5, atol=1e-7)
    assert np.abs(expected).sum() > 0


def test_a_list_id_outside_its_table_is_named(model: PSModel) -> None:
    batch = _batch()
    bad = Batch(
        batch.dense, batch.categorical, batch.label, (_ragged(VISITED), _ragged([[5], [], []]))
    )
    with pytest.raises(ValueError, match=r"table 'tags': column 'tags' has ids outside \[0, 5\)"):
        model.ids_element(bad)


def test_entries_sharing_a_table_must_agree_on_its_shape() -> None:
    with pytest.raises(ValueError, match=r"'b' shares table 'geo' with vocab_size 11"):
        FeatureConfig(
            num_dense=0,
            tables=(
                TableConfig(name="a", column="a", vocab_size=10, dim=4, table="geo"),
                TableConfig(name="b", column="b", vocab_size=11, dim=4, table="geo"),
            ),
        )


def _summing(features: FeatureConfig) -> keras.Model:
    """A tower whose logit is the sum of every input: it shows what the lookup fed it."""
    from airflow_rover.worker.models import _inputs as model_inputs_of

    inputs = model_inputs_of(features)
    both = keras.layers.Concatenate()(list(inputs.values()))
    logit = keras.layers.Lambda(lambda x: keras.ops.sum(x, axis=1, keepdims=True))(both)
    return keras.Model(inputs, logit)


def test_the_single_process_yardstick_shares_and_pools_as_the_workers_do() -> None:
    """One Embedding per table (shared by city and visited), lists padded and pooled: the same
    inputs as a worker's first step (preflight's ``model_inputs``, the PS's initial rows)."""
    from airflow_rover.worker.preflight import model_inputs
    from airflow_rover.worker.single_process import in_graph_model, padded_lists

    batch = _batch()
    lists = ["visited", "tags"]
    model = in_graph_model(FEATURES, ["city", "ad"], _summing, 3, lists)
    assert len([w for w in model.weights if "emb_" in w.path]) == 4  # geo, ad, tags, ad_wide
    got = model({"x_dense": batch.dense, "x_ids": batch.categorical} | padded_lists(batch, lists))
    expected = model_inputs(FEATURES, ["city", "ad"], batch, 3, lists)
    want = sum(np.asarray(v, np.float64).sum(axis=1) for v in expected.values())
    np.testing.assert_allclose(np.asarray(got)[:, 0], want, rtol=1e-5)


def test_the_step_function_is_traced_once_whatever_the_batch(model: PSModel) -> None:
    """Batches of other sizes and other numbers of unique ids (and the one-sample warm-up)
    reuse the one trace: no retracing on the hot path."""
    model.warm_up()
    weights = {n: v.numpy() for n, v in zip(model.var_names, model.variables, strict=True)}
    batch = _batch()
    for element in (model.ids_element(batch), model.ids_element(batch[:2])):
        loss, row_grads, _ = model.gradients(element, _rows(model, element), weights)
        assert np.isfinite(loss) and set(row_grads) == {g.name for g in model.groups}
    assert model.traces() == 1
