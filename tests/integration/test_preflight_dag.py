"""A user's mistakes that would show only inside the job fail the task before any node starts,
at once and without a retry.

The fixture DAG ``rover_preflight_test`` (``tests/fixtures/dags/rover_preflight.py``) has three
training tasks, each with ``retries=2``: a model factory that raises, a model that returns 4
logits per row, and training data whose ids of one column all lie outside its table's
vocabulary. ``dag.test()`` runs the three; each must fail on its first try
(``AirflowFailException``), within 60 s of the task's start, with a message naming the model or
the column, and leave no job behind. Before preflight caught them, they took 168 s, 141 s and
~4.5 min (node restarts, then Airflow's retry, which repeated it all).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pendulum
import pytest

from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
DAG_ID = "rover_preflight_test"
TASKS = ("raising_factory", "four_wide_output", "ids_outside_vocab")  # as in the fixture DAG
FAIL_WITHIN_S = 60  # the bound, from the task's start
BAD_COLUMN = 4  # C5: every id of it is moved past its vocabulary


@pytest.fixture(scope="module")
def airflow_env(airflow_env: dict[str, str]) -> dict[str, str]:
    """conftest's isolated Airflow, reading DAGs from the fixtures' folder, which also holds
    the broken models (``bad_models.py``)."""
    path = os.pathsep.join(p for p in (str(FIXTURES), airflow_env.get("PYTHONPATH")) if p)
    return {
        **airflow_env,
        "AIRFLOW__CORE__DAGS_FOLDER": str(FIXTURES / "dags"),
        "PYTHONPATH": path,
    }


@pytest.fixture(scope="module")
def outcome(run_dag: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("preflight")
    config = SyntheticConfig(num_train=4000, num_eval=1000, seed=11)
    data = generate_dataset(root / "data", config)
    bad_ids = root / "bad_ids"
    shutil.copytree(data.train_dir, bad_ids)
    ids = np.load(bad_ids / "categorical.npy", mmap_mode="r+")
    ids[:, BAD_COLUMN] += config.vocab_sizes[BAD_COLUMN]
    ids.flush()
    conf = {
        "train_data": str(data.train_dir),
        "train_data_bad_ids": str(bad_ids),
        "eval_data": str(data.eval_dir),
        "jobs_root": str(root / "jobs"),
    }
    started = time.monotonic()
    result: dict[str, Any] = run_dag(DAG_ID, "2026-12-01", conf, timeout=300)
    result["dag_test_s"] = time.monotonic() - started
    result["jobs_root"] = root / "jobs"
    result["vocab"] = config.vocab_sizes[BAD_COLUMN]
    failed_after = {task: seconds(result, task) for task in TASKS}
    print(
        f"\npreflight DAG: dag.test {result['dag_test_s']:.1f} s; time to failure from task "
        f"start: {', '.join(f'{t} {s:.1f} s' for t, s in failed_after.items())}; "
        f"tasks (state, try): {result['tasks']}"
    )
    return result


def seconds(outcome: dict[str, Any], task: str) -> float:
    """From the task's start to its failure, as the metadata DB records them."""
    start, end, _ = outcome["times"][task]
    return float((pendulum.parse(end) - pendulum.parse(start)).total_seconds())


@pytest.mark.parametrize("task", TASKS)
def test_the_task_fails_on_its_first_try_without_a_retry(outcome: dict[str, Any], task) -> None:
    """``retries=2``, yet one try: the failure was ``AirflowFailException``."""
    assert outcome["state"] == "failed"
    assert outcome["tasks"][task] == ["failed", 1], outcome["tasks"]


@pytest.mark.parametrize("task", TASKS)
def test_the_task_fails_within_60_s_of_its_start(outcome: dict[str, Any], task) -> None:
    assert seconds(outcome, task) < FAIL_WITHIN_S, outcome["times"][task]


@pytest.mark.parametrize("task", TASKS)
def test_no_job_was_started(outcome: dict[str, Any], task) -> None:
    """Preflight ran before the launch: no job files, no process, in the task's job dir."""
    job_dir = outcome["jobs_root"] / task
    assert not (job_dir / "job.json").exists() and not (job_dir / "master.json").exists()


def test_the_messages_name_the_model_or_the_column(outcome: dict[str, Any]) -> None:
    log = outcome["log"]
    assert "AirflowFailException" in log
    assert (
        "raising_factory: model='bad_models:raising_tower': building it raised ValueError: "
        "hidden units must be positive, got -974 at "
    ) in log
    assert (
        "four_wide_output: model='bad_models:four_wide' returned shape (64, 4) for 64 rows of "
        "train_data; expected (64, 1): one logit per row"
    ) in log
    vocab = outcome["vocab"]
    bad_ids = outcome["jobs_root"].parent / "bad_ids"
    assert re.search(
        rf"ids_outside_vocab: train_data='{re.escape(str(bad_ids))}': column 'C5' holds id "
        rf"\d+ at row 0; table 'C5' reads it with vocab_size {vocab}, so its ids must be in "
        rf"\[0, {vocab}\); \d+ of the \d+ rows sampled hold one outside",
        log,
    ), log[-4000:]
    assert "Can not squeeze" not in log
