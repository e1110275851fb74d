"""Each checkpoint policy survives a parameter server SIGKILLed mid-job, in a real DAG run.

``rover_policies_test`` (``tests/fixtures/dags/rover_policies.py``) trains a 2-PS job whose
policy comes from the run's conf. Once a checkpoint holding finished shards is committed, the
test kills ``ps-0``; the master relaunches it from that checkpoint and the DAG run succeeds.
``full`` trains the batches the restored PS lost again (nothing lost); ``cpr`` does not (its
lost samples are reported as PLS) and the other PS keep their progress.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from test_retry_resume import node_processes, processes_of, tail

from airflow_rover.core.layout import JobLayout
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.hooks.elastic_job import ElasticJobHook

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
RUN_DAG = Path(__file__).with_name("run_dag.py")
FIXTURE_DAGS = REPO / "tests" / "fixtures" / "dags"
DAG_ID = "rover_policies_test"
NUM_TRAIN = 40_000
RUN_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def airflow_env(airflow_env: dict[str, str]) -> dict[str, str]:
    return {**airflow_env, "AIRFLOW__CORE__DAGS_FOLDER": str(FIXTURE_DAGS)}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("policy-data")
    return generate_dataset(root, SyntheticConfig(num_train=NUM_TRAIN, num_eval=10_000, seed=8))


def run_with_ps_killed(
    policy: str, airflow_env: dict[str, str], dataset: Any, root: Path
) -> dict[str, Any]:
    job_dir = root / f"job-{policy}"
    layout = JobLayout(job_dir)
    out, log_path = root / f"{policy}.json", root / f"{policy}.log"
    conf = {
        "train_data": str(dataset.train_dir),
        "eval_data": str(dataset.eval_dir),
        "job_dir": str(job_dir),
        "checkpoint_policy": policy,
    }
    killed: dict[str, Any] | None = None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, str(RUN_DAG), DAG_ID, "2026-12-02"),
                *("--conf", json.dumps(conf), "--out", str(out)),
            ],
            env=airflow_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    t0 = time.monotonic()
    try:
        while proc.poll() is None:
            assert time.monotonic() - t0 < RUN_TIMEOUT_S, f"dag.test hung:\n{tail(log_path)}"
            if killed is None:
                state = layout.read_json(layout.state_file) or {}
                assert state.get("state") != "succeeded", "the job ended before the kill"
                latest = layout.latest_checkpoint()
                queue = layout.read_json(latest / "queue.json") if latest else None
                ps = node_processes(layout).get("ps-0")
                if state.get("state") == "running" and (queue or {}).get("done") and ps:
                    time.sleep(0.5)  # train on past the checkpoint: the PS loses something
                    ps.send_signal(signal.SIGKILL)
                    killed = {"at_s": round(time.monotonic() - t0, 2), "checkpoint": latest.name}
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with contextlib.suppress(Exception):
            ElasticJobHook(job_dir).stop("test cleanup")
        for leftover in processes_of(job_dir):
            with contextlib.suppress(psutil.Error):
                leftover.kill()
    assert proc.returncode == 0 and out.exists(), f"dag.test failed:\n{tail(log_path)}"
    assert killed is not None, "ps-0 was never killed"
    outcome = json.loads(out.read_text())
    result = outcome["xcom"].get("train:return_value") or {}
    print(
        f"\n{policy}: killed {killed}; recovery {result.get('recovery')}; auc {result.get('auc')}"
    )
    return {**outcome, "result": result}


@pytest.fixture(scope="module")
def runs(
    airflow_env: dict[str, str], dataset: Any, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("policies")
    return {p: run_with_ps_killed(p, airflow_env, dataset, root) for p in ("full", "cpr")}


@pytest.mark.parametrize("policy", ["full", "cpr"])
def test_the_job_survives_a_killed_ps_under_each_policy(
    runs: dict[str, dict[str, Any]], policy: str
) -> None:
    run = runs[policy]
    assert run["state"] == "success" and run["tasks"]["train"] == ["success", 1], run["tasks"]
    result = run["result"]
    recovery = result["recovery"]
    assert recovery["checkpoint_policy"] == policy
    assert recovery["restarts"] >= 1 and "ps" in recovery["recovery_seconds"]
    batches = result["accounting"]["batches"]
    assert batches["trained_once"] == batches["expected"]
    assert result["auc"] > 0.7


def test_full_recovery_loses_nothing_and_partial_recovery_reports_what_it_lost(
    runs: dict[str, dict[str, Any]],
) -> None:
    full, cpr = runs["full"]["result"]["recovery"], runs["cpr"]["result"]["recovery"]
    assert full["lost_batches"] == 0 and full["pls"] == 0
    assert cpr["lost_batches"] > 0 and cpr["lost_samples"] > 0
    total = NUM_TRAIN * 3 * 2  # samples x epochs x embedding PS
    assert cpr["pls"] == pytest.approx(cpr["lost_samples"] / total, abs=1e-6)
