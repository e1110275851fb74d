"""The same date run again on a real scheduler path (``dag.test()``, same logical date, so the
same run and job): with the same data it returns the finished result without training; with
the data regenerated smaller and the epochs changed it trains a new model, and the previous
model stays published until the new one has succeeded."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.model_release import published_folder
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "rover_rerun_test"
DATE = "2026-12-02"


@pytest.fixture(scope="module")
def airflow_env(airflow_env: dict[str, str]) -> dict[str, str]:
    return {**airflow_env, "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "fixtures" / "dags")}


class LinkWatch:
    """Where ``model`` points, sampled while a run goes on, with the job's state then."""

    def __init__(self, job_dir: JobDir) -> None:
        self.job_dir, self.seen, self._stop = job_dir, [], threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> list[tuple[str | None, Path | None]]:
        self._thread.start()
        return self.seen

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            state = (self.job_dir.read_json(self.job_dir.state_file) or {}).get("state")
            self.seen.append((state, published_folder(self.job_dir)))


@pytest.fixture(scope="module")
def reruns(run_dag: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("rerun")
    data_dir, job_dir = root / "data", JobDir(root / "job")

    def day_data(num_train: int) -> dict[str, str]:
        shutil.rmtree(data_dir, ignore_errors=True)  # the day's ETL writes it again
        data = generate_dataset(data_dir, SyntheticConfig(num_train=num_train, num_eval=2000))
        return {"train_data": str(data.train_dir), "eval_data": str(data.eval_dir)}

    runs: dict[str, Any] = {}
    conf = {**day_data(8000), "job_dir": str(job_dir.root), "epochs": 1}
    runs["first"] = run_dag(DAG_ID, DATE, conf)
    runs["first_model"] = published_folder(job_dir)
    runs["same"] = run_dag(DAG_ID, DATE, {**conf, **day_data(8000)})
    changed = {**conf, **day_data(6000), "epochs": 2}
    start = time.monotonic()
    with LinkWatch(job_dir) as seen:
        runs["changed"] = run_dag(DAG_ID, DATE, changed)
    runs["changed_s"] = time.monotonic() - start
    runs["seen"], runs["job_dir"] = seen, job_dir
    return runs


def result(run: dict[str, Any]) -> dict[str, Any]:
    assert run["state"] == "success", run["log"][-6000:]
    value: dict[str, Any] = run["xcom"]["train:return_value"]
    return value


def test_the_same_data_returns_the_finished_model_and_says_so(reruns: dict[str, Any]) -> None:
    first, same = result(reruns["first"]), result(reruns["same"])
    assert first["samples_trained_this_run"] == 8000
    assert same == first  # the finished job's result, not a job that trained 0 samples
    assert "Not training again" in reruns["same"]["log"]
    assert "already trained this data with this spec and model" in reruns["same"]["log"]
    assert published_folder(reruns["job_dir"]) is not None


def test_changed_data_trains_anew_and_the_old_model_stays_until_then(
    reruns: dict[str, Any],
) -> None:
    changed = result(reruns["changed"])
    assert changed["samples_trained"] == changed["samples_trained_this_run"] == 6000 * 2
    assert changed["samples_resumed"] == 0
    assert changed["train_seconds"] > 0 and changed["samples_per_second"] > 0
    log = reruns["changed"]["log"]
    assert "it replaces job" in log and "stays in place until the new one succeeds" in log
    old, new = reruns["first_model"], published_folder(reruns["job_dir"])
    assert old is not None and new is not None and new != old
    # while the new job ran (every state before its success) the first model was published;
    # the master swaps the link a moment before it writes "succeeded" (two files, not one
    # write, and the state file is written a few times a second), so the last samples before
    # success may see the new model; never the old one again after it
    before = [(state, folder) for state, folder in reruns["seen"] if state != "succeeded"]
    swapped = next((i for i, (_, folder) in enumerate(before) if folder == new), len(before))
    assert before[:swapped] and {f for _, f in before[:swapped]} == {old}, reruns["seen"][:5]
    assert {f for _, f in before[swapped:]} <= {new}, before[swapped:]
    assert old.is_dir()  # kept beside the new one for readers still loading it
    print(
        f"\nre-run with changed data: {reruns['changed_s']:.1f} s, {len(before)} samples, "
        f"{len(before) - swapped} of them with the new link before success"
    )
