"""The trained model as an Airflow Asset: the outlet a training task declares, and the metadata
its event carries once the job has succeeded (what a DAG scheduled on the Asset reads).

.. seealso:: ``docs/serving.md`` and ``dags/score_on_new_model.py``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, Context

MODEL_ASSET_SCHEME = "x-rover-model"
"""The default Asset's scheme when the model's location is templated (one per dag and task)."""


def model_asset(dag_id: str, task_id: str, output_dir: str | None = None) -> Asset:
    """The Asset a training task publishes by default: ``file://<output_dir>/model`` when its
    ``output_dir`` is a literal path, else ``x-rover-model://<dag_id>/<task_id>`` (a templated
    location such as ``/models/{{ ds }}`` changes every run; the Asset must not). A DAG
    scheduled on another DAG's model calls this with the same arguments."""
    if output_dir and "{{" not in output_dir and "{%" not in output_dir:
        return Asset(uri=(Path(output_dir).absolute() / "model").as_uri())
    return Asset(uri=f"{MODEL_ASSET_SCHEME}://{dag_id}/{task_id}")


def outlet_of(owner: str, value: Asset | str | None, default: Asset) -> Asset:
    """The ``model_asset`` parameter as an Asset (a string is its URI); errors name it."""
    if value is None:
        return default
    if isinstance(value, Asset):
        return value
    if isinstance(value, str) and value.strip():
        try:
            return Asset(uri=value)
        except ValueError as exc:
            raise ValueError(f"{owner}: model_asset={value!r} is not an Asset URI: {exc}") from None
    raise TypeError(
        f"{owner}: model_asset must be an airflow.sdk.Asset, an Asset URI or None (the "
        f"default, derived from output_dir), got {type(value).__name__}"
    )


def _iso(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, dt.datetime) else None


def event_extra(result: dict[str, Any], context: Context, data: dict[str, Any]) -> dict[str, Any]:
    """The model event's metadata: quality, size, where the model and its SavedModel are, and
    which run, data interval and ``data`` (``train_data``, ``eval_data``, and whatever else
    a consumer needs to read them) trained it (all plain JSON)."""
    folder = Path(result["model_dir"]).resolve() if result.get("model_dir") else None
    saved = folder / "saved_model" if folder is not None else None
    dag_run = context.get("dag_run")
    return {
        "job_id": result.get("job_id"),
        "auc": result.get("auc"),
        "logloss": result.get("logloss"),
        "samples_trained": result.get("samples_trained"),
        "eval_samples": result.get("eval_samples"),
        "model_uri": folder.as_uri() if folder is not None else None,
        "saved_model_uri": saved.as_uri() if saved is not None and saved.is_dir() else None,
        "dag_id": getattr(dag_run, "dag_id", None),
        "run_id": getattr(dag_run, "run_id", None),
        "logical_date": _iso(context.get("logical_date")),
        "data_interval_start": _iso(context.get("data_interval_start")),
        "data_interval_end": _iso(context.get("data_interval_end")),
        **data,
    }


def attach_model_event(
    asset: Asset, result: dict[str, Any], context: Context, data: dict[str, Any]
) -> dict[str, Any]:
    """Set the outlet event's metadata (Airflow sends it when the task succeeds)."""
    extra = event_extra(result, context, data)
    context["outlet_events"][asset].extra = extra
    return extra
