"""A real local job on raw 64-bit ids: the dataset's raw column gets tables of index 'ids',
and the model the PS saved holds exactly one row per distinct id trained, none shared, where
a vocabulary of as many rows would fold most ids onto rows of others. Its SavedModel takes
the raw ids and scores the held-out split as the job did."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from airflow_rover.cli import run_job
from airflow_rover.core.metrics import roc_auc
from airflow_rover.core.spec import JobSpec
from airflow_rover.data.reader import open_dataset
from airflow_rover.data.synthetic_raw_ids import RawIdConfig, collision_share, write_raw_id_dataset
from airflow_rover.worker.export import DENSE_COLUMN, export_saved_model, exported_path
from airflow_rover.worker.model_folder import read_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONFIG = RawIdConfig(num_train=8192, num_eval=2048, num_ids=3000, seed=4)


def test_a_raw_id_job_holds_one_row_per_distinct_id(tmp_path: Path) -> None:
    data = write_raw_id_dataset(tmp_path / "data", CONFIG)
    assert (data.train_ids < 0).any() and (data.train_ids > 2**62).any()  # the whole range
    spec = JobSpec.model_validate(
        {
            "job_id": "raw-ids",
            "train_data": str(data.train_dir),
            "eval_data": str(data.eval_dir),
            "plan": {"num_ps": 2, "num_workers": 1},
            "training": {"optimizer": "adagrad", "shard_size": 2048, "batch_size": 256},
        }
    )
    started = time.perf_counter()
    status = run_job(spec, tmp_path / "job", poll_s=0.5, quiet=True)
    print(f"\njob: {time.perf_counter() - started:.1f} s, AUC {status.get('result', {})}")
    assert status["state"] == "succeeded", status.get("message")
    folder = (tmp_path / "job" / "model").resolve()
    _, groups, _ = read_model(folder)
    by_name = {g.group.name: g for g in groups}
    assert {n: g.group.index for n, g in by_name.items()} == {
        "dim1": "vocab",
        "dim16": "vocab",
        "ids_user": "ids",
        "ids_user_wide": "ids",
    }
    for name in ("ids_user", "ids_user_wide"):
        saved = by_name[name].ids
        assert saved.size == data.train_ids.size  # one row per distinct id, across both PS
        np.testing.assert_array_equal(np.sort(saved), data.train_ids)
    shared = collision_share(data.train_ids, data.train_ids.size)
    print(f"{data.train_ids.size} ids; hashed into as many rows, {shared:.0%} would share one")
    assert shared > 0.5

    export_saved_model(folder)
    import tensorflow as tf

    held_out = open_dataset(data.eval_dir).read(0, CONFIG.num_eval)
    serve = tf.saved_model.load(str(exported_path(folder))).signatures["serving_default"]
    scores = serve(
        **{
            DENSE_COLUMN: tf.constant(held_out.dense),
            "user": tf.constant(held_out.categorical[:, 0]),
            "item": tf.constant(held_out.categorical[:, 1]),
        }
    )["probability"].numpy()
    served = roc_auc(held_out.label, scores)
    print(f"held-out AUC: job {status['result']['auc']:.6f}, SavedModel {served:.6f}")
    assert abs(served - status["result"]["auc"]) < 1e-4


def test_a_raw_list_column_trains_one_row_per_id_and_serves_raw(tmp_path: Path) -> None:
    """Parquet with a list<int64> column of raw ids (raw=true): the job trains, the saved
    model holds one row per distinct id any sample's list held, and the SavedModel, given
    the raw values and each list's length, scores the held-out split as the job did."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    n, train = 5000, 4000
    items = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 400)
    liked = set(items[:200].tolist())
    clicks = [list(rng.choice(items, rng.integers(0, 5))) for _ in range(n)]
    label = np.array([sum(c in liked for c in row) > len(row) / 2 for row in clicks])
    price = rng.random(n)
    for split, rows in (("train", slice(0, train)), ("eval", slice(train, n))):
        (tmp_path / split).mkdir()
        columns = {
            "label": label[rows],
            "price": price[rows],
            "clicks": pa.array(clicks[rows], pa.list_(pa.int64())),
        }
        pq.write_table(pa.table(columns), tmp_path / split / "part-0.parquet")
    spec = JobSpec.model_validate(
        {
            "job_id": "raw-lists",
            "train_data": str(tmp_path / "train"),
            "eval_data": str(tmp_path / "eval"),
            "data_schema": {
                "dense": [{"name": "price"}],
                "categorical": [{"name": "clicks", "raw": True, "combiner": "mean"}],
            },
            "plan": {"num_ps": 1, "num_workers": 1},
            "training": {"shard_size": 1000, "batch_size": 250, "epochs": 2},
        }
    )
    status = run_job(spec, tmp_path / "job", poll_s=0.5, quiet=True)
    assert status["state"] == "succeeded", status.get("message")
    assert status["result"]["auc"] > 0.6  # it learns: the label is which ids a list holds
    folder = (tmp_path / "job" / "model").resolve()
    _, groups, _ = read_model(folder)
    by_name = {g.group.name: g for g in groups}
    assert by_name["ids_clicks"].group.index == "ids"
    trained = np.unique([v for row in clicks[:train] for v in row])
    np.testing.assert_array_equal(np.sort(by_name["ids_clicks"].ids), trained)

    export_saved_model(folder)
    import tensorflow as tf

    held_out = clicks[train:]
    serve = tf.saved_model.load(str(exported_path(folder))).signatures["serving_default"]
    scores = serve(
        **{
            DENSE_COLUMN: tf.constant(price[train:, None].astype(np.float32)),
            "clicks": tf.constant(np.array([v for row in held_out for v in row], np.int64)),
            "clicks_lengths": tf.constant([len(row) for row in held_out], tf.int64),
        }
    )["probability"].numpy()
    served = roc_auc(label[train:], scores)
    assert abs(served - status["result"]["auc"]) < 1e-4
