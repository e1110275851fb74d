"""The serving export a training task runs once its job has succeeded: the published model's
SavedModel (``worker/export.py``), in a process of its own so that TensorFlow's memory and
start-up notes stay out of the task's process. Done once per model folder."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from airflow.sdk.exceptions import AirflowException

EXPORT_MODULE = "airflow_rover.worker.export"
EXPORT_TIMEOUT_S = 3600


class TaskLog(Protocol):
    def info(self, event: Any, *args: Any, **kw: Any) -> Any: ...

    def debug(self, event: Any, *args: Any, **kw: Any) -> Any: ...

    def warning(self, event: Any, *args: Any, **kw: Any) -> Any: ...


def ensure_saved_model(model_dir: str | Path, log: TaskLog) -> dict[str, Any]:
    """The SavedModel's ``export.json`` in the model folder ``model_dir`` points at, exporting
    it first if that folder has none. Raises ``AirflowException`` with the exporter's error.
    A model trained on preprocessed features is exported all the same, with a warning that
    its SavedModel takes them preprocessed."""
    folder = Path(model_dir).resolve()
    card = folder / "saved_model" / "export.json"
    info = dict(json.loads(card.read_text())) if card.exists() else _export(folder, card, log)
    if info.get("note"):
        log.warning("SavedModel of %s: %s", folder, info["note"])
    return info


def _export(folder: Path, card: Path, log: TaskLog) -> dict[str, Any]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", EXPORT_MODULE, str(folder)],
        capture_output=True,
        text=True,
        timeout=EXPORT_TIMEOUT_S,
        check=False,
    )
    log.debug("SavedModel export's output:\n%s", proc.stderr[-20_000:])
    if proc.returncode != 0 or not card.exists():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]  # the error, not notes
        raise AirflowException(f"SavedModel export of {folder} failed ({proc.returncode}): {last}")
    info = dict(json.loads(card.read_text()))
    log.info(
        "SavedModel written to %s: %d trained rows, %.1f MB, %.1f s",
        folder / "saved_model",
        info.get("trained_rows", 0),
        info.get("bytes", 0) / 1e6,
        time.monotonic() - started,
    )
    return info
