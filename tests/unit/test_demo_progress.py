"""``scripts/demo_progress.py``: what the demo prints while ``airflow dags test`` runs.

A re-run of a date finds the date's earlier job in the folder: its final state is not this run's
progress. Statuses are real ``state.json`` mirrors in a real job directory (no master runs,
so the status is the mirror's).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from airflow_rover.core.job_dir import JobDir, atomic_write_json

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "demo_progress.py"


@pytest.fixture(scope="module")
def demo_progress() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demo_progress", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mirrored(job_dir: JobDir, state: str, started_at: float, done: int) -> None:
    job_dir.root.mkdir(parents=True, exist_ok=True)
    status: dict[str, Any] = {
        "job_id": "rover_daily_retrain.train",
        "state": state,
        "started_at": started_at,
        "progress": {
            "samples_done": done,
            "samples_resumed": 0,
            "samples_total": 200_000,
            "shards": {"todo": 0, "doing": 0, "done": done // 8_000, "quarantined": 0},
        },
        "throughput": 0.0,
    }
    atomic_write_json(job_dir.state_file, status)


def test_only_the_job_this_run_launched_is_shown(
    demo_progress: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log, job_dir = tmp_path / "demo.log", JobDir(tmp_path / "models" / "2026-11-25")
    since = time.time()
    log.write_text("[DAG TEST] starting task_id=generate_day_data map_index=-1\n")
    mirrored(job_dir, "succeeded", since - 3600, 200_000)  # yesterday's run of the date
    progress = demo_progress.Progress(log, job_dir, since)
    progress.show()
    with log.open("a") as out:
        out.write("[DAG TEST] starting task_id=train map_index=-1\n")
    mirrored(job_dir, "succeeded", since + 1, 200_000)
    progress.show()
    progress.show()  # nothing new: nothing printed
    lines = capsys.readouterr().out.splitlines()
    print("\n".join(lines))
    assert [line.split(" ", 3)[-1] for line in lines] == [
        "task generate_day_data started",
        "task train started",
        "training job: succeeded, 200000/200000 samples, shards 25/25 done, 0.0 samples/s",
    ]
