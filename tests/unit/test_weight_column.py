"""The weight column (``data_schema.weight``): read into ``Batch.weight`` by every file reader,
carried by slicing and concatenation, checked at preflight (its type, negative weights named by
column and row), and weighting each sample's loss on a worker."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from airflow_rover.core.data_schema import DataSchema
from airflow_rover.core.spec import FeatureConfig, JobSpec, TableConfig
from airflow_rover.data.arrow_columns import DataSchemaError
from airflow_rover.data.batch import Batch, concat_batches
from airflow_rover.data.preflight import PreflightError, check_data
from airflow_rover.data.reader import open_dataset
from airflow_rover.worker.models import wide_deep
from airflow_rover.worker.ps_model import PSModel

ROWS = 500
SCHEMA = DataSchema.model_validate(
    {
        "label": "clicked",
        "weight": "w",
        "dense": [{"name": "price"}],
        "categorical": [{"name": "ad", "buckets": 64}],
    }
)


def _table(weight: pa.Array | list[object]) -> pa.Table:
    rng = np.random.default_rng(3)
    return pa.table(
        {
            "clicked": rng.integers(0, 2, ROWS).astype(np.float32),
            "price": rng.random(ROWS),
            "ad": rng.integers(0, 1000, ROWS),
            "w": weight,
        }
    )


def _weights() -> np.ndarray:
    return np.random.default_rng(4).random(ROWS) * 3


def test_parquet_weights_are_read_across_row_groups(tmp_path: Path) -> None:
    weights = _weights()
    pq.write_table(_table(pa.array(weights)), tmp_path / "part-0.parquet", row_group_size=128)
    reader = open_dataset(tmp_path, schema=SCHEMA)
    batch = reader.read(100, 400)  # three row groups, concatenated
    assert batch.weight is not None and batch.weight.dtype == np.float32
    np.testing.assert_array_equal(batch.weight, weights[100:400].astype(np.float32))
    part = batch[50:60]  # as a worker cuts a shard into batches
    assert part.weight is not None
    np.testing.assert_array_equal(part.weight, weights[150:160].astype(np.float32))


def test_integer_weights_are_read_from_csv(tmp_path: Path) -> None:
    weights = np.arange(ROWS) % 4
    pacsv.write_csv(_table(pa.array(weights)), tmp_path / "part-0.csv")
    batch = open_dataset(tmp_path, schema=SCHEMA).read(0, ROWS)
    assert batch.weight is not None
    np.testing.assert_array_equal(batch.weight, weights.astype(np.float32))


def test_without_a_weight_column_batches_have_none(tmp_path: Path) -> None:
    pq.write_table(_table(pa.array(_weights())), tmp_path / "part-0.parquet")
    unweighted = SCHEMA.model_copy(update={"weight": None})
    assert open_dataset(tmp_path, schema=unweighted).read(0, 10).weight is None


def test_concatenation_carries_weights_and_gives_unweighted_parts_one() -> None:
    def batch(n: int, weight: np.ndarray | None) -> Batch:
        return Batch(
            np.zeros((n, 1), np.float32), np.zeros((n, 1), np.int64), np.zeros(n, np.float32),
            weight=weight,
        )  # fmt: skip

    joined = concat_batches([batch(2, np.array([2, 3], np.float32)), batch(1, None)])
    assert joined.weight is not None
    np.testing.assert_array_equal(joined.weight, [2, 3, 1])
    assert concat_batches([batch(2, None), batch(1, None)]).weight is None
    with pytest.raises(ValueError, match=r"weight must be float32 \(2,\), got float64"):
        batch(2, np.ones(2))


@pytest.mark.parametrize(
    ("weight", "found"),
    [
        (pa.array([f"w{i}" for i in range(ROWS)]), "string"),
        (pa.array([[1.0]] * ROWS), r"list<float> \(a list where a scalar was expected\)"),
        (pa.array([True] * ROWS), "bool"),
    ],
)
def test_a_weight_column_of_another_type_is_named_with_the_file(
    tmp_path: Path, weight: pa.Array, found: str
) -> None:
    path = tmp_path / "part-0.parquet"
    pq.write_table(_table(weight), path)
    with pytest.raises(DataSchemaError) as info:
        open_dataset(tmp_path, schema=SCHEMA)
    assert str(info.value).startswith(f"{path}: weight column 'w' holds ")
    assert info.match(rf"holds {found}; accepted: int, float$")


def test_a_missing_weight_column_is_named(tmp_path: Path) -> None:
    pq.write_table(_table(pa.array(_weights())).drop_columns(["w"]), tmp_path / "p.parquet")
    with pytest.raises(DataSchemaError, match=r"weight column 'w' is missing; the columns found"):
        open_dataset(tmp_path, schema=SCHEMA)


@pytest.mark.parametrize(("bad", "found"), [(-0.5, "-0.5"), (None, "null"), (float("nan"), "nan")])
def test_a_negative_or_null_weight_fails_preflight_naming_column_and_row(
    tmp_path: Path, bad: float | None, found: str
) -> None:
    weights: list[float | None] = [1.0] * ROWS
    weights[37] = bad
    pq.write_table(_table(pa.array(weights, pa.float64())), tmp_path / "part-0.parquet")
    spec = JobSpec.model_validate(
        {"job_id": "weights", "train_data": str(tmp_path), "data_schema": SCHEMA.model_dump()}
    )
    with pytest.raises(PreflightError) as info:
        check_data(spec)
    message = str(info.value)
    assert message.startswith(f"train_data={str(tmp_path)!r}: ")
    assert f"weight column 'w' holds {found} at row 37; a weight is a finite number >= 0" in message


def _ps_model() -> PSModel:
    features = FeatureConfig(
        num_dense=1, tables=(TableConfig(name="ad", column="ad", vocab_size=64, dim=4),)
    )
    keras.utils.set_random_seed(1)
    # The gradients come from the Keras model alone: no parameter server is reached.
    return PSModel(wide_deep(features, hidden=(8,)), features, ["ad"], ps=None)  # type: ignore[arg-type]


def _gradients(model: PSModel, batch: Batch) -> tuple[float, dict[str, np.ndarray]]:
    element = model.ids_element(batch)
    unique = element["unique/" + model.groups[0].name]
    rows = {model.groups[0].name: np.full((len(unique), 4), 0.1, np.float32)}
    dense = {n: v.numpy() for n, v in zip(model.var_names, model.variables, strict=True)}
    loss, _, dense_grads = model.gradients(element, rows, dense)
    return loss, dense_grads


def test_the_loss_weights_each_sample() -> None:
    """The batch's loss is the mean of weight * log loss (Keras's ``sample_weight``): zero
    weights on some samples give the loss and gradients of the others alone, scaled by their
    share of the batch; all weights 1 give the unweighted loss bit for bit."""
    rng = np.random.default_rng(5)
    n, keep = 64, np.arange(64) % 3 != 0
    dense = rng.random((n, 1)).astype(np.float32)
    ids = rng.integers(0, 64, (n, 1))
    label = rng.integers(0, 2, n).astype(np.float32)
    model = _ps_model()
    weighted = Batch(dense, ids, label, weight=keep.astype(np.float32))
    loss, grads = _gradients(model, weighted)
    kept_loss, kept_grads = _gradients(model, Batch(dense[keep], ids[keep], label[keep]))
    share = keep.sum() / n
    assert loss == pytest.approx(kept_loss * share, rel=1e-5)
    for name, grad in grads.items():
        np.testing.assert_allclose(grad, kept_grads[name] * share, rtol=1e-4, atol=1e-7)
    ones = Batch(dense, ids, label, weight=np.ones(n, np.float32))
    assert _gradients(model, ones)[0] == _gradients(model, Batch(dense, ids, label))[0]
    doubled = Batch(dense, ids, label, weight=np.full(n, 2, np.float32))
    assert _gradients(model, doubled)[0] == pytest.approx(2 * _gradients(model, ones)[0])
