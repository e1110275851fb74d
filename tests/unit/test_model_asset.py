"""The training task's model Asset: which Asset it declares, and the metadata its event
carries (``operators/model_asset.py``). The real scheduler: test_model_asset_dag.py."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import DAG, Asset
from airflow.sdk.exceptions import AirflowException

from airflow_rover.operators.model_asset import model_asset
from airflow_rover.operators.training import ElasticTrainingOperator


def build(**kwargs: Any) -> ElasticTrainingOperator:
    with DAG(dag_id="ctr", schedule=None, start_date=datetime(2026, 1, 1)):
        return ElasticTrainingOperator(task_id="train", train_data="/data/train", **kwargs)


def test_the_default_asset_follows_the_model_location() -> None:
    """A literal ``output_dir``: its ``model`` link as a file URI; a templated one (a new
    folder per run) or none: one Asset per dag and task."""
    literal = build(output_dir="/models/ctr")
    assert literal.model_asset == Asset(uri="file:///models/ctr/model")
    templated = build(output_dir="/models/ctr/{{ ds }}")
    assert templated.model_asset.uri == "x-rover-model://ctr/train"
    assert build().model_asset == templated.model_asset == model_asset("ctr", "train")
    assert literal.outlets == [literal.model_asset]  # declared: the scheduler knows it


def test_a_users_asset_or_uri_is_the_outlet_and_other_outlets_stay() -> None:
    mine = Asset(name="ctr_model", uri="s3://models/ctr")
    other = Asset(uri="s3://reports/ctr")
    task = build(model_asset=mine, outlets=[other])
    assert task.model_asset is mine and task.outlets == [other, mine]
    assert build(model_asset="s3://models/ctr2").model_asset == Asset(uri="s3://models/ctr2")


@pytest.mark.parametrize("bad", [3, "", "airflow://reserved"])
def test_a_bad_model_asset_fails_at_parse_time_naming_the_parameter(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match="model_asset"):
        build(model_asset=bad)


def _job(tmp_path: Path, state: str = "succeeded") -> dict[str, Any]:
    folder = tmp_path / "job" / "models" / "20261126T000000Z-abc"
    folder.mkdir(parents=True)
    (tmp_path / "job" / "model").symlink_to("models/20261126T000000Z-abc")
    result = {
        "samples_trained": 20_000,
        "auc": 0.75,
        "logloss": 0.5,
        "eval_samples": 5_000,
        "model_dir": str(tmp_path / "job" / "model"),
    }
    return {"job_id": "ctr.train-abc", "state": state, "message": "m", "result": result}


def _context() -> dict[str, Any]:
    start = datetime(2026, 11, 25, tzinfo=UTC)
    end = datetime(2026, 11, 26, tzinfo=UTC)
    return {
        "ti": SimpleNamespace(dag_id="ctr", task_id="train", run_id="scheduled__1", map_index=-1),
        "dag_run": SimpleNamespace(dag_id="ctr", run_id="scheduled__1"),
        "logical_date": start,
        "data_interval_start": start,
        "data_interval_end": end,
        "outlet_events": defaultdict(SimpleNamespace),
    }


def test_a_successful_job_attaches_its_metrics_and_model_to_the_event(tmp_path: Path) -> None:
    """The event names the model's own folder (``model`` moves on with the next run)."""
    task = build(output_dir=str(tmp_path / "job"), export_saved_model=False)
    task._record = lambda *_: None  # type: ignore[method-assign]
    context = _context()
    job = _job(tmp_path)
    task.execute_complete(context, {"status": "success", "job_id": job["job_id"], "job": job})
    extra = context["outlet_events"][task.model_asset].extra
    assert extra == {
        "job_id": "ctr.train-abc",
        "auc": 0.75,
        "logloss": 0.5,
        "samples_trained": 20_000,
        "eval_samples": 5_000,
        "model_uri": (tmp_path / "job" / "models" / "20261126T000000Z-abc").resolve().as_uri(),
        "saved_model_uri": None,  # not exported here
        "dag_id": "ctr",
        "run_id": "scheduled__1",
        "logical_date": "2026-11-25T00:00:00+00:00",
        "data_interval_start": "2026-11-25T00:00:00+00:00",
        "data_interval_end": "2026-11-26T00:00:00+00:00",
        "train_data": "/data/train",
        "eval_data": None,
    }


def test_a_failed_job_attaches_nothing(tmp_path: Path) -> None:
    task = build(output_dir=str(tmp_path / "job"))
    task._record = lambda *_: None  # type: ignore[method-assign]
    context = _context()
    job = _job(tmp_path, state="failed")
    with pytest.raises(AirflowException):
        task.execute_complete(context, {"status": "failed", "job_id": "x", "job": job})
    assert dict(context["outlet_events"]) == {}


def test_an_export_that_fails_fails_the_task_with_the_exporters_error(tmp_path: Path) -> None:
    """A model folder without ``model.json``: the exporter's error, and no event."""
    task = build(output_dir=str(tmp_path / "job"))
    task._record = lambda *_: None  # type: ignore[method-assign]
    context = _context()
    job = _job(tmp_path)
    with pytest.raises(AirflowException, match=r"SavedModel export .* failed .*model\.json"):
        task.execute_complete(context, {"status": "success", "job_id": "x", "job": job})
    assert dict(context["outlet_events"]) == {}


def test_a_model_already_exported_is_not_exported_again(tmp_path: Path) -> None:
    """A task that returns the job it trained before finds the SavedModel's card and reuses it
    (no process is started: the folder holds no partitions to export from)."""
    job = _job(tmp_path)
    saved = Path(job["result"]["model_dir"]).resolve() / "saved_model"
    saved.mkdir()
    (saved / "export.json").write_text('{"trained_rows": 7}')
    task = build(output_dir=str(tmp_path / "job"))
    task._record = lambda *_: None  # type: ignore[method-assign]
    context = _context()
    task.execute_complete(context, {"status": "success", "job_id": "x", "job": job})
    assert context["outlet_events"][task.model_asset].extra["saved_model_uri"] == saved.as_uri()
