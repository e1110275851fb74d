"""``init_from`` of ``ElasticTrainingOperator``: which model a job starts from, resolved at
submission into the spec's ``init`` (``core.incremental``).

``"previous"`` is the model of the last successful run of the same DAG and task (and map
index), as the history store recorded it when that job ended (``result.model_folder``); no
path is guessed. A path names a model folder or a checkpoint. Either must have the job's
layout (``core.model_layout``): any difference fails the task, naming it.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from airflow_rover.core.incremental import PREVIOUS, InitSource, day_number
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.model_layout import layout_differences, layout_of
from airflow_rover.core.spec import FeatureConfig, JobSpec
from airflow_rover.hooks.history_store import HistoryStoreHook


class NoModelToStartFrom(ValueError):
    """``init_from`` names a model that cannot be used (gone, unreadable, incompatible)."""


def job_day(context: Any) -> int:
    """The day a run trains for: its data interval's start, else its logical date, else today
    (UTC), as days since 1970-01-01."""
    for key in ("data_interval_start", "logical_date"):
        when = context.get(key) if hasattr(context, "get") else None
        if isinstance(when, dt.datetime | dt.date):
            return day_number(when)
    return day_number(dt.datetime.now(dt.UTC))


def rendered_source(value: Any) -> Any:
    """The rendered ``init_from``: None for None, "" or "None" (a template choosing no
    source), else the value stripped (checked by ``check_init_option``)."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "None")):
        return None
    return value.strip() if isinstance(value, str) else value


def rendered_days(owner: str, value: Any) -> int | None:
    """The rendered ``evict_after_days``: None (also empty or "None"), else an integer."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "None")):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{owner}: evict_after_days={value!r}: must render to a whole number of days >= 0"
        ) from None


def previous_source(
    hook: HistoryStoreHook, dag_id: str, task_id: str, map_index: int, run_id: str
) -> tuple[str, str] | None:
    """(model folder, description) of the last successful run of this task other than
    ``run_id``; None when the history has none. A run recorded without its model folder is
    an error naming it (the history does not say where its model is)."""
    with hook.get_conn() as store:
        row = store.last_success(dag_id, task_id, map_index, other_than_run=run_id)
    if row is None:
        return None
    result = row.get("result") or {}
    folder = result.get("model_folder") if isinstance(result, dict) else None
    described = f"run {row.get('run_id')!r} of {dag_id}.{task_id} (job {row.get('job_id')})"
    if not folder:
        raise NoModelToStartFrom(
            f"init_from='previous': the last successful {described} has no model folder in the "
            "history store (recorded before models were; run it again or give init_from a path)"
        )
    return str(folder), described


def resolve(
    init_from: str | None,
    evict_after_days: int | None,
    hook: HistoryStoreHook,
    ti: Any,
) -> InitSource | None:
    """The spec's ``init`` for a rendered ``init_from`` (None: train from scratch, also when
    ``"previous"`` finds no successful run)."""
    if not init_from:
        return None
    if init_from == PREVIOUS:
        index = ti.map_index if ti.map_index is not None else -1
        found = previous_source(hook, ti.dag_id, ti.task_id, index, ti.run_id)
        if found is None:
            return None
        location, origin = found
    else:
        location = str(Path(init_from.removeprefix("file://")).resolve())
        origin = f"init_from={init_from!r}"
    return InitSource(location=location, origin=origin, evict_after_days=evict_after_days)


def source_layout(folder: Path) -> dict[str, Any]:
    """The layout a source was trained with: its ``model.json`` (a model folder), else the
    spec of the job whose checkpoint it is (``<job dir>/checkpoints/ckpt-<n>``)."""
    if not folder.is_dir():
        raise NoModelToStartFrom(f"init_from: {folder} does not exist (or is not a folder)")
    card = folder / "model.json"
    if card.is_file():
        saved = JobDir(folder).read_json(card) or {}
        features = FeatureConfig.model_validate(saved.get("features"))
        return layout_of(saved.get("model"), features)
    job = JobDir(folder.parent.parent)
    if job.spec_file.is_file():
        spec = job.read_spec()
        return layout_of(spec.model, spec.resolved_features)
    raise NoModelToStartFrom(
        f"init_from: {folder} has no model.json and is not a checkpoint inside a job "
        "directory: its tables cannot be checked against this job's"
    )


def check_compatible(source: InitSource, spec: JobSpec, features: FeatureConfig) -> None:
    """Fail, naming every difference, when the source's layout is not the job's."""
    differences = layout_differences(
        source_layout(Path(source.location)), layout_of(spec.model, features)
    )
    if differences:
        raise NoModelToStartFrom(
            f"init_from: {source.location} ({source.origin}) cannot be continued by this job: "
            + "; ".join(differences)
            + ". Set init_from=None to train from scratch."
        )
