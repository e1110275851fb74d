"""Preflight builds the job's model once on the first rows of its training data, as a worker
does: a factory that raises, or a model that returns other than one logit per row, fails
before any process starts, with the model named and what it raised or returned."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_rover.core.spec import JobSpec
from airflow_rover.data.preflight import PreflightError
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.worker.preflight import CHECK_ROWS, preflight
from airflow_rover.worker.tensorflow_notes import tensorflow_stderr_to_debug

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BAD_MODELS = FIXTURES / "bad_models.py"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory):
    return generate_dataset(
        tmp_path_factory.mktemp("data"), SyntheticConfig(num_train=300, num_eval=100, seed=5)
    )


@pytest.fixture(autouse=True)
def fixture_models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


def spec(data, model: str) -> JobSpec:
    return JobSpec(
        job_id="pre", train_data=str(data.train_dir), eval_data=str(data.eval_dir), model=model
    )


def line_of(text: str) -> int:
    """The line of ``bad_models.py`` that holds ``text``."""
    return next(i for i, line in enumerate(BAD_MODELS.read_text().splitlines(), 1) if text in line)


def test_a_raising_factory_is_quoted_with_the_users_line(data) -> None:
    """The factory's exception, type and message, at the line of the user's code that raised
    it, with the features it was called with; no traceback."""
    with pytest.raises(PreflightError) as info:
        preflight(spec(data, "bad_models:raising_tower"))
    message = str(info.value)
    raised_at = line_of('raise ValueError(f"hidden units')
    assert message.startswith(
        "model='bad_models:raising_tower': building it raised ValueError: hidden units must be "
        f"positive, got -974 at {BAD_MODELS}:{raised_at} in raising_tower; the factory was "
        "called with the job's features (13 dense, 26 tables: C1 (dim 16),"
    ), message
    assert "Traceback" not in message and len(message) < 600


@pytest.mark.parametrize(
    ("model", "shape"),
    [
        ("bad_models:four_wide", f"({CHECK_ROWS}, 4)"),
        ("bad_models:flat_logits", f"({CHECK_ROWS},)"),
    ],
)
def test_a_model_returning_other_than_one_logit_per_row_is_named(data, model, shape) -> None:
    """4 logits per row (the issue's case), or one per row shaped (rows,), which the worker's
    loss cannot take either (it squeezes the last axis)."""
    with pytest.raises(PreflightError) as info:
        preflight(spec(data, model))
    assert str(info.value) == (
        f"model={model!r} returned shape {shape} for {CHECK_ROWS} rows of train_data; expected "
        f"({CHECK_ROWS}, 1): one logit per row (end the model with Dense(1))"
    )


def test_a_model_that_raises_when_called_is_quoted_with_the_users_line(data) -> None:
    """It builds (the batch size is unknown then) but raises on real rows."""
    with pytest.raises(PreflightError) as info:
        preflight(spec(data, "bad_models:fixed_batch"))
    raised_at = line_of('raise ValueError(f"this tower')
    assert str(info.value) == (
        f"model='bad_models:fixed_batch': calling it on {CHECK_ROWS} rows of train_data as a "
        "worker does raised ValueError: in Lambda.call(): this tower takes batches of 32 rows, "
        f"got {CHECK_ROWS} at {BAD_MODELS}:{raised_at} in _batch_of_32"
    )


def test_a_factory_returning_no_model_is_named(data) -> None:
    with pytest.raises(PreflightError, match=r"^model='bad_models:not_a_model': the factory "):
        preflight(spec(data, "bad_models:not_a_model"))


@pytest.mark.parametrize(
    "model", ["wide_deep", "deepfm", "dcn", "xdeepfm", "user_models:small_tower"]
)
def test_the_reference_models_and_a_user_model_pass(data, model: str) -> None:
    preflight(spec(data, model))


@pytest.mark.parametrize("model", ["wide_deep", "user_models:small_tower"])
def test_preflight_writes_no_tensorflow_notes_to_stderr(data, model: str) -> None:
    """A task log shows stderr as errors: TensorFlow's start-up notes, written to file
    descriptor 2 when preflight first imports it (itself, or the user's module does), go to the
    debug log instead. In a fresh interpreter, as a task process is."""
    code = (
        "import json, sys; from airflow_rover.core.spec import JobSpec; "
        "from airflow_rover.worker.preflight import preflight; "
        "preflight(JobSpec.model_validate(json.loads(sys.argv[1]))); "
        "print('tensorflow' in sys.modules)"
    )
    path = os.pathsep.join(p for p in (str(FIXTURES), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec(data, model).model_dump(mode="json"))],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"  # it did import TensorFlow
    assert proc.stderr == ""


def test_tensorflow_notes_go_to_the_debug_log_and_other_output_to_stderr(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """What the block's code writes to file descriptor 2: TensorFlow's notes (as TensorFlow
    2.21 writes them) are logged at debug level, anything else reaches stderr unchanged."""
    notes = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1795697615.859026    2548 port.cc:153] oneDNN custom operations are on.\n"
        "W0000 00:00:1795697618.195768    2548 local_rendezvous.cc:412] Local rendezvous is "
        "aborting with status: INVALID_ARGUMENT\n"
    )
    caplog.set_level(logging.DEBUG, logger="airflow_rover.worker.tensorflow_notes")
    with tensorflow_stderr_to_debug():
        os.write(2, notes.encode())
        os.write(2, b"a line of the user's own\n")
    assert capfd.readouterr().err == "a line of the user's own\n"
    logged = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert logged == [(logging.DEBUG, f"tensorflow: {line}") for line in notes.splitlines()]
