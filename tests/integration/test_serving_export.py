"""The SavedModel a job exports scores rows as the PS model does, loaded by
``tf.saved_model.load`` in a process that cannot import airflow_rover."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pyarrow.parquet as pq
import pytest

from airflow_rover.cli import run_job
from airflow_rover.core.checkpoint_files import read_npz
from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.spec import FeatureConfig, JobSpec
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.data.batch import Batch
from airflow_rover.data.reader import open_dataset, open_split
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.data.synthetic_files import parquet_schema, write_parquet
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc.ps_client import PSClient
from airflow_rover.worker.export import DENSE_COLUMN, export_saved_model
from airflow_rover.worker.models import load_factory
from airflow_rover.worker.ps_model import PSModel

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOKEN = "export-test-token"

# Runs with python -I (no PYTHONPATH, no cwd on sys.path) and without the venv's editable
# install of airflow_rover (its finder and any path holding the package are dropped first).
SCORE = """
import sys
sys.meta_path = [f for f in sys.meta_path if "airflow_rover" not in repr(f)]
sys.path = [p for p in sys.path if not __import__("os").path.isdir(p + "/airflow_rover")]
import numpy as np
import tensorflow as tf
try:
    import airflow_rover
    sys.exit("airflow_rover is importable here")
except ImportError:
    pass
inputs = {k: tf.constant(v) for k, v in np.load(sys.argv[2]).items()}
model = tf.saved_model.load(sys.argv[1])
direct = model.serve(inputs)["probability"].numpy()
signature = model.signatures["serving_default"](**inputs)["probability"].numpy()
assert "airflow_rover" not in sys.modules
np.save(sys.argv[3], np.stack([direct, signature]))
"""


def _ps_model_predictions(folder: Path, spec: JobSpec, batch: Batch) -> np.ndarray:
    """The PS model's scores: the saved partitions served by real PS, read by ``PSModel``."""
    card = json.loads((folder / "model.json").read_text())
    features = FeatureConfig.model_validate(card["features"])
    layout = EmbeddingPlacement.from_features(features)
    optimizer = Optimizer(spec.training.optimizer, spec.training.learning_rate)
    servers, addresses = [], []
    for i, part in enumerate(card["partitions"]):
        ps = ParameterServer(i, card["num_ps"], layout, optimizer, spec.training.seed)
        ps.restore(read_npz(folder / part))
        server, port = start_server(ps, TOKEN, threads=2)
        servers.append(server)
        addresses.append(f"127.0.0.1:{port}")
    client = PSClient(addresses, TOKEN, timeout_s=10)
    try:
        keras.utils.set_random_seed(spec.training.seed)
        schema = open_split(spec, spec.train_data).schema
        columns = [c.name for c in schema.categorical]
        lists = [c.name for c in schema.lists]
        model = PSModel(load_factory(spec.model)(features), features, columns, client, lists)
        return model.predict(batch)
    finally:
        client.close()
        for server in servers:
            server.stop(None)


def test_the_saved_model_scores_as_the_ps_model_without_airflow_rover(tmp_path: Path) -> None:
    data = generate_dataset(
        tmp_path / "data", SyntheticConfig(num_train=20_000, num_eval=4_000, seed=3)
    )
    spec = JobSpec.model_validate(
        {
            "job_id": "export-test",
            "train_data": str(data.train_dir),
            "eval_data": str(data.eval_dir),
            "plan": {"num_ps": 2, "num_workers": 1},
            "training": {"shard_size": 4096, "seed": 11},
        }
    )
    status = run_job(spec, tmp_path / "job", poll_s=0.5, quiet=True)
    assert status["state"] == "succeeded", status.get("message")
    folder = (tmp_path / "job" / "model").resolve()

    started = time.monotonic()
    info = export_saved_model(folder)
    print(f"export: {time.monotonic() - started:.2f} s, {info['bytes']} bytes, {info}")

    eval_set = open_dataset(data.eval_dir)
    batch = eval_set.read(0, 2_000)  # eval ids: many never trained (seeded initial rows)
    expected = _ps_model_predictions(folder, spec, batch)
    names = [c.name for c in eval_set.schema.categorical]
    inputs = {DENSE_COLUMN: batch.dense} | {n: batch.categorical[:, j] for j, n in enumerate(names)}
    direct, signature = _score_without_airflow_rover(folder, inputs, tmp_path)
    assert direct.shape == expected.shape == (2_000,)
    np.testing.assert_allclose(direct, expected, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(direct, signature)
    print(f"max |saved model - PS model| = {np.abs(direct - expected).max():.2e}")


def _score_without_airflow_rover(
    folder: Path, inputs: dict[str, np.ndarray], tmp_path: Path
) -> tuple[np.ndarray, np.ndarray]:
    """The SavedModel's scores of ``inputs`` through ``serve`` and through its signature, in a
    ``python -I`` process that cannot import airflow_rover."""
    np.savez(tmp_path / "inputs.npz", **inputs)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            SCORE,
            str(folder / "saved_model"),
            str(tmp_path / "inputs.npz"),
            str(tmp_path / "scores.npy"),
        ],
        check=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    direct, signature = np.load(tmp_path / "scores.npy")
    return direct, signature


def test_string_ids_a_list_column_and_a_shared_table_are_served_as_trained(tmp_path: Path) -> None:
    """Parquet with string ids, a list column (mean) sharing C1's table: the SavedModel takes
    the raw strings and the list's values and lengths, hashes and pools them in the graph,
    and scores as the trained model does."""
    data = generate_dataset(tmp_path / "data", SyntheticConfig(num_train=6_000, num_eval=1_000))
    files = {
        split: write_parquet(
            source,
            tmp_path / split,
            num_files=2,
            string_ids=True,
            list_column=True,
            rows_per_group=1024,
        )
        for split, source in (("train", data.train_dir), ("eval", data.eval_dir))
    }
    schema = parquet_schema(data.train_dir, string_ids=True, list_column=True)
    spec = JobSpec.model_validate(
        {
            "job_id": "export-lists",
            "train_data": str(files["train"]),
            "eval_data": str(files["eval"]),
            "data_schema": schema.model_dump(),
            "plan": {"num_ps": 2, "num_workers": 1},
            "training": {"shard_size": 1024, "seed": 5},
        }
    )
    status = run_job(spec, tmp_path / "job", poll_s=0.5, quiet=True)
    assert status["state"] == "succeeded", status.get("message")
    folder = (tmp_path / "job" / "model").resolve()
    info = export_saved_model(folder)
    assert info["inputs"]["C1"] == ["string", [None]]
    assert info["inputs"]["bag_lengths"] == ["int64", [None]]

    expected = _ps_model_predictions(folder, spec, open_split(spec, spec.eval_data).read(0, 1_000))
    table = pq.read_table(sorted(files["eval"].iterdir())[0]).slice(0, 1_000)
    dense = np.stack([table.column(f"I{i + 1}").to_numpy() for i in range(13)], axis=1)
    inputs = {DENSE_COLUMN: dense.astype(np.float32)}
    inputs |= {f"C{j + 1}": np.array(table.column(f"C{j + 1}").to_pylist(), "S") for j in range(26)}
    bags = table.column("bag").to_pylist()
    inputs["bag"] = np.array([v for bag in bags for v in bag], "S")
    inputs["bag_lengths"] = np.array([len(bag) for bag in bags], np.int64)
    direct, signature = _score_without_airflow_rover(folder, inputs, tmp_path)
    assert direct.shape == expected.shape == (1_000,)
    np.testing.assert_allclose(direct, expected, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(direct, signature)
    print(f"lists: max |saved model - PS model| = {np.abs(direct - expected).max():.2e}")
