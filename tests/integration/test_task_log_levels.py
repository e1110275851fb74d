"""The training task's log under Airflow's own task supervisor: TensorFlow's native notes are
not the errors the supervisor makes of a task's stderr (``worker/tensorflow_notes.py`` sends
them to the debug log), and a real error line still is one.

The fixture DAG ``rover_task_log_test`` (``tests/fixtures/dags/rover_task_log.py``) names a
model module that imports TensorFlow and writes a line of its own to stderr; the preflight
imports it in the task process. ``supervised_task.py`` runs the task under ``supervise_task``
until it defers, then stops the job; the test reads the task's log (JSON lines).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from dag_runs import end_dag_test, tail

from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
SUPERVISED = Path(__file__).with_name("supervised_task.py")
TENSORFLOWS = ("oneDNN", "cpu_feature_guard", "absl::InitializeLog", "I0000 ")


@pytest.fixture(scope="module")
def airflow_env(airflow_env: dict[str, str]) -> dict[str, str]:
    env = {**airflow_env, "AIRFLOW__CORE__DAGS_FOLDER": str(FIXTURES / "dags")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FIXTURES), env.get("PYTHONPATH")]))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # TensorFlow's own default: its notices are written
    return env


def task_log_lines(airflow_env: dict[str, str], tmp_path: Path) -> list[dict[str, Any]]:
    data = generate_dataset(tmp_path / "data", SyntheticConfig(num_train=2_000, num_eval=500))
    job_dir, log = tmp_path / "job", tmp_path / "task.log"
    conf = {"train_data": str(data.train_dir), "job_dir": str(job_dir)}
    started = time.monotonic()
    try:
        done = subprocess.run(
            [
                *(sys.executable, str(SUPERVISED), "rover_task_log_test", "2026-11-20"),
                *("--conf", json.dumps(conf), "--log", str(log)),
            ],
            env=airflow_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        end_dag_test(None, job_dir)  # the job's processes, if any are left
    print(f"supervised task ran {time.monotonic() - started:.1f} s")
    assert "supervised task exited with 0" in done.stdout, done.stdout[-4000:] + done.stderr
    assert log.exists(), tail(tmp_path / "task.log")
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def test_tensorflows_notes_are_no_errors_and_a_real_error_still_is(
    airflow_env: dict[str, str], tmp_path: Path
) -> None:
    """On main before the preflight's capture, TensorFlow's notes and the user's line were
    all ``error`` lines of logger ``task.stderr``."""
    lines = task_log_lines(airflow_env, tmp_path)
    for line in lines:
        if line.get("level") in ("error", "warning") or "tensorflow" in line.get("logger", ""):
            print(line["level"], line.get("logger"), str(line.get("event"))[:100])
    errors = [str(line.get("event")) for line in lines if line.get("level") == "error"]
    assert any("Pausing task as DEFERRED" in str(line.get("event")) for line in lines)
    assert not [e for e in errors if any(t in e for t in TENSORFLOWS)]
    # the model module was imported in the task process (it writes this line on import)
    assert "stderr_model: a line of the user's own on stderr" in errors
