"""Real local jobs without Airflow (``rover``'s ``run_job``): user models, every reference
model, every optimizer, several PS."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_rover.cli import run_job
from airflow_rover.core.spec import JobSpec, ResourcePlan, TrainingConfig
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset

pytestmark = [pytest.mark.integration, pytest.mark.slow]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory):
    return generate_dataset(
        tmp_path_factory.mktemp("data"), SyntheticConfig(num_train=30_000, num_eval=10_000, seed=5)
    )


def run(data, tmp_path: Path, **fields) -> dict:
    spec = JobSpec.model_validate(
        {
            "job_id": "runtime-test",
            "train_data": str(data.train_dir),
            "eval_data": str(data.eval_dir),
            "training": {"shard_size": 4096},
            **fields,
        }
    )
    status = run_job(spec, tmp_path / "job", poll_s=0.5, quiet=True)
    assert status["state"] == "succeeded", status.get("message")
    return status["result"]


def test_a_user_model_from_an_import_path_trains(data, tmp_path, monkeypatch) -> None:
    """The worker processes import ``user_models:small_tower`` and it learns (AUC > 0.65)."""
    monkeypatch.setenv("PYTHONPATH", f"{FIXTURES}:{__import__('os').environ.get('PYTHONPATH', '')}")
    monkeypatch.syspath_prepend(str(FIXTURES))
    result = run(data, tmp_path, model="user_models:small_tower")
    assert result["auc"] > 0.65
    assert result["accounting"]["done_once"] == result["accounting"]["shards"]


@pytest.mark.parametrize(
    ("model", "optimizer", "learning_rate", "num_ps", "num_workers"),
    [
        ("deepfm", "adagrad", 0.2, 2, 1),
        ("xdeepfm", "adam", 0.001, 1, 1),
        ("wide_deep", "sgd", 0.5, 2, 2),
    ],
)
def test_reference_models_and_optimizers_train_on_several_ps(
    data, tmp_path, model: str, optimizer: str, learning_rate: float, num_ps: int, num_workers: int
) -> None:
    training = TrainingConfig(optimizer=optimizer, learning_rate=learning_rate, shard_size=4096)
    result = run(
        data,
        tmp_path,
        model=model,
        plan=ResourcePlan(num_workers=num_workers, num_ps=num_ps).model_dump(),
        training=training.model_dump(),
    )
    assert result["auc"] > 0.6, (model, optimizer, result["auc"])  # ~60 steps: it learns
    assert sorted(p.name for p in Path(result["model_dir"]).glob("ps-*.npz")) == [
        f"ps-{i}.npz" for i in range(num_ps)
    ]
