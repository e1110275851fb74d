"""TensorFlow's native log lines in a task process: logged at their own level, not written to
descriptor 2, which Airflow's task supervisor logs at ``error`` level.

The preflight imports the user's model module in the task process (it imports TensorFlow).
Run in a fresh Python process (TensorFlow prints its import notices once per process) with
descriptor 2 a pipe of its own, as under Airflow's supervisor.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from airflow_rover.core.native_logs import line_levels

ROOT = Path(__file__).resolve().parents[2]

PREFLIGHT_IMPORT = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s|%(message)s")
from airflow_rover.data.preflight import PreflightError, check_model_importable
try:
    check_model_importable(sys.argv[1])
except PreflightError as exc:
    print(f"PreflightError|{exc}")
"""


def preflight_import(tmp_path: Path, model_source: str) -> tuple[str, str]:
    """(stdout: the logging records, stderr: what the supervisor would log as errors)."""
    (tmp_path / "user_model.py").write_text(textwrap.dedent(model_source))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    done = subprocess.run(
        [sys.executable, "-c", PREFLIGHT_IMPORT, "user_model:build"],
        env=env,
        cwd=tmp_path,  # not the checkout: ROOT's code, whoever runs the test from where
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def test_tensorflows_import_notices_are_logged_at_info_not_written_to_stderr(
    tmp_path: Path,
) -> None:
    """On main the oneDNN and CPU-instruction notices went to descriptor 2 (error lines in the
    task's log)."""
    stdout, stderr = preflight_import(
        tmp_path,
        """
        import tensorflow


        def build(features):
            return None
        """,
    )
    print(f"stderr: {stderr!r}\nlogged:\n{stdout}")
    assert "oneDNN" not in stderr and "I0000" not in stderr
    assert any(
        line.startswith("INFO|") and "oneDNN custom operations" in line
        for line in stdout.splitlines()
    )


def test_real_errors_still_show(tmp_path: Path) -> None:
    """A line of the user's own on stderr is logged as an error; a module that fails to import
    still fails the preflight, naming it."""
    stdout, _ = preflight_import(
        tmp_path,
        """
        import sys
        import tensorflow
        print("user_model: could not reach the feature store", file=sys.stderr)
        raise RuntimeError("no feature store")
        """,
    )
    assert "ERROR|user_model: could not reach the feature store" in stdout.splitlines()
    assert "PreflightError|model='user_model:build': module 'user_model' does not import" in stdout


@pytest.mark.parametrize(
    ("text", "levels"),
    [
        (
            "WARNING: All log messages before absl::InitializeLog() is called are written to "
            "STDERR\nI0000 00:00:1795698047.180296   24488 port.cc:153] oneDNN custom operations "
            "are on.\n",
            [logging.WARNING, logging.INFO],
        ),
        (
            "I1126 13:00:00.123456   24488 cpu_feature_guard.cc:227] This TensorFlow binary\n"
            "To enable the following instructions: AVX2, rebuild TensorFlow\n\n",
            [logging.INFO, logging.INFO],  # a continuation keeps its line's level
        ),
        (
            "W1126 13:00:00.1 1 a.cc:1] w\nE1126 13:00:00.1 1 a.cc:1] e\n"
            "F1126 13:00:00.1 1 a.cc:1] f\n",
            [logging.WARNING, logging.ERROR, logging.CRITICAL],
        ),
        ("Traceback (most recent call last):\n", [logging.ERROR]),  # not TensorFlow's
        (
            "I1126 13:00:00.1 1 port.cc:153] oneDNN custom operations are on.\n"
            "user_model: could not reach the feature store\n",
            [logging.INFO, logging.ERROR],  # a user's line after TensorFlow's stays an error
        ),
    ],
)
def test_each_line_gets_the_level_its_prefix_says(text: str, levels: list[int]) -> None:
    assert [level for level, _, _ in line_levels(text)] == levels
