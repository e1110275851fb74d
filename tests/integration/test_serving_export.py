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
import pytest

from airflow_rover.cli import run_job
from airflow_rover.core.checkpoint_files import read_npz
from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.spec import FeatureConfig, JobSpec
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.data.reader import open_dataset
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
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


def _ps_model_predictions(folder: Path, spec: JobSpec, batch) -> np.ndarray:
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
        columns = [c.name for c in open_dataset(spec.train_data).schema.categorical]
        model = PSModel(load_factory(spec.model)(features), features, columns, client)
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
    assert direct.shape == expected.shape == (2_000,)
    np.testing.assert_allclose(direct, expected, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(direct, signature)
    print(f"max |saved model - PS model| = {np.abs(direct - expected).max():.2e}")
