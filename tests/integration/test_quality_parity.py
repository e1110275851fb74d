"""Training on parameter servers loses nothing: the same samples give the same held-out AUC
as the model trained in one process with in-graph Keras embeddings (within 0.002)."""

from __future__ import annotations

import pytest

from airflow_rover.cli import run_job
from airflow_rover.core.spec import JobSpec
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.worker.single_process import train_single_process

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory):
    return generate_dataset(
        tmp_path_factory.mktemp("data"), SyntheticConfig(num_train=60_000, num_eval=20_000, seed=9)
    )


@pytest.mark.parametrize(
    ("model", "learning_rate"),
    [("wide_deep", 0.2), ("dcn", 0.05)],  # DCN's cross layers diverge at 0.2 (in Keras too)
)
def test_ps_training_matches_single_process_keras(data, tmp_path, model, learning_rate) -> None:
    spec = JobSpec.model_validate(
        {
            "job_id": f"parity-{model.replace('_', '-')}",
            "train_data": str(data.train_dir),
            "eval_data": str(data.eval_dir),
            "model": model,
            "plan": {"num_workers": 1, "num_ps": 1},
            "training": {
                "optimizer": "adagrad",
                "learning_rate": learning_rate,
                "shard_size": 4096,
                "batch_size": 512,
            },
        }
    )
    status = run_job(spec, tmp_path / "job", poll_s=0.5, quiet=True)
    assert status["state"] == "succeeded", status.get("message")
    rover = status["result"]["auc"]
    keras = train_single_process(spec)["auc"]
    assert keras > 0.65, f"the yardstick did not learn: {keras}"
    assert abs(rover - keras) <= 0.002, f"{model}: rover AUC {rover:.4f} vs Keras {keras:.4f}"
