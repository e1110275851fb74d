"""Where a training task's job lives and under which id: one job per (dag, task, run, map
index), found again by every try of the task."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path


def default_jobs_root() -> Path:
    """Where jobs live unless ``output_dir`` is given: ``$AIRFLOW_HOME/rover/jobs``."""
    home = os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))
    return Path(home) / "rover" / "jobs"


def job_id_for(dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> str:
    """A DNS-safe job id, unique per (dag, task, run, map index), stable across tries."""
    key = f"{dag_id}/{task_id}/{run_id}/{map_index}"
    readable = re.sub(r"[^a-z0-9.-]+", "-", f"{dag_id}.{task_id}".lower()).strip("-.")[:48]
    return f"{readable or 'job'}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def path_segment(value: str) -> str:
    """``value`` as one directory name: as it is when it is already a plain name; else made
    safe and suffixed with a hash of ``value``, so two values never share a directory (run ids
    ``...T00:00:00+00:00`` and ``...T00_00_00_00_00``) and none is ``.``, ``..`` or hidden."""
    safe = _UNSAFE.sub("_", value).lstrip(".")
    if value and safe == value:
        return value
    return f"{safe or 'run'}-{hashlib.sha1(value.encode()).hexdigest()[:8]}"
