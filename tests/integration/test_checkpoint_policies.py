"""Each checkpoint policy survives a parameter server SIGKILLed mid-job, in a real DAG run.

``rover_policies_test`` (``tests/fixtures/dags/rover_policies.py``) trains a 2-PS job whose
policy comes from the run's conf. Once a checkpoint holding finished shards is committed, the
test kills ``ps-0``; the master relaunches it from that checkpoint and the DAG run succeeds.
``full`` trains the batches the restored PS lost again (nothing lost); ``cpr`` does not (its
lost samples are reported as PLS; its MFU partial saves give the restored PS its most-used rows
as they were shortly before the kill) and the other PS keep their progress. ``ecrm`` (3 PS,
k=2) restores nothing: the relaunched PS starts empty and is rebuilt from the parity the other
two hold while the workers train again.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dag_runs import end_dag_test, start_dag_test, tail

sys.path.insert(0, str(Path(__file__).parents[1] / "unit"))  # the S3 stand-in's helpers
from moto_server import ACCESS_KEY, SECRET_KEY, moto_server, s3_client

from airflow_rover.core.checkpoint_files import verify_checkpoint
from airflow_rover.core.job_dir import JobDir
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.launchers.local_processes import node_processes
from airflow_rover.storage import AwsSettings, restore_latest_checkpoint, store_for
from airflow_rover.storage.base import parse_checkpoint_uri

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FIXTURE_DAGS = REPO / "tests" / "fixtures" / "dags"
DAG_ID = "rover_policies_test"
NUM_TRAIN = 40_000
RUN_TIMEOUT_S = 240
BUCKET, PREFIX, CONN_ID = "rover", "policies/cpr", "rover_s3"
OPTIONS = {"cpr": {"variant": "mfu", "r": 0.25}, "ecrm": {"k": 2, "rows_per_lock": 4096}}


@pytest.fixture(scope="module")
def airflow_env(airflow_env: dict[str, str]) -> dict[str, str]:
    return {**airflow_env, "AIRFLOW__CORE__DAGS_FOLDER": str(FIXTURE_DAGS)}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("policy-data")
    return generate_dataset(root, SyntheticConfig(num_train=NUM_TRAIN, num_eval=10_000, seed=8))


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as url:
        s3_client(url).create_bucket(Bucket=BUCKET)
        yield url


def run_with_ps_killed(
    policy: str, airflow_env: dict[str, str], dataset: Any, root: Path, uri: str = ""
) -> dict[str, Any]:
    job_dir = root / f"job-{policy}"
    layout = JobDir(job_dir)
    out, log_path = root / f"{policy}.json", root / f"{policy}.log"
    conf = {
        "train_data": str(dataset.train_dir),
        "eval_data": str(dataset.eval_dir),
        "job_dir": str(job_dir),
        "checkpoint_policy": policy,
        "checkpoint_options": OPTIONS.get(policy, {}),
        "checkpoint_uri": uri,
        "aws_conn_id": CONN_ID if uri else "",
        "plan": {"num_ps": 3 if policy == "ecrm" else 2, "num_workers": 2},
        # a spare PS takes over under full and ecrm; under cpr a new process is started
        "standby_ps": policy != "cpr",
    }
    killed: dict[str, Any] | None = None
    proc = start_dag_test(DAG_ID, "2026-12-02", conf, out, log_path, airflow_env)
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
        end_dag_test(proc, job_dir)
    assert proc.returncode == 0 and out.exists(), f"dag.test failed:\n{tail(log_path)}"
    assert killed is not None, "ps-0 was never killed"
    outcome = json.loads(out.read_text())
    result = outcome["xcom"].get("train:return_value") or {}
    print(
        f"\n{policy}: killed {killed}; recovery {result.get('recovery')}; auc {result.get('auc')}"
    )
    master_log = layout.log_file("master").read_text(errors="replace")
    return {
        **outcome,
        "result": result,
        "log": log_path.read_text(errors="replace"),
        "master_log": master_log,
    }


@pytest.fixture(scope="module")
def runs(
    airflow_env: dict[str, str],
    dataset: Any,
    s3_endpoint: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, dict[str, Any]]:
    """``full`` keeps its checkpoints local; ``cpr`` also copies them to S3 (moto on
    loopback) through an Airflow connection the task resolves."""
    root = tmp_path_factory.mktemp("policies")
    connection = {
        "conn_type": "aws",
        "login": ACCESS_KEY,
        "password": SECRET_KEY,
        "extra": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
    }
    env = {**airflow_env, f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps(connection)}
    return {
        "full": run_with_ps_killed("full", env, dataset, root),
        "cpr": run_with_ps_killed("cpr", env, dataset, root, f"s3://{BUCKET}/{PREFIX}"),
        "ecrm": run_with_ps_killed("ecrm", env, dataset, root),
    }


@pytest.mark.parametrize("policy", ["full", "cpr", "ecrm"])
def test_the_job_survives_a_killed_ps_under_each_policy(
    runs: dict[str, dict[str, Any]], policy: str
) -> None:
    run = runs[policy]
    assert run["state"] == "success" and run["tasks"]["train"] == ["success", 1], run["tasks"]
    result = run["result"]
    recovery = result["recovery"]
    assert recovery["checkpoint_policy"] == policy
    # only the PS was relaunched: the workers waited for it and trained on (TensorFlow warm)
    assert recovery["restarts"] == 1 and list(recovery["recovery_seconds"]) == ["ps"]
    assert recovery["standby_takeovers"] == (policy != "cpr")
    batches = result["accounting"]["batches"]
    assert batches["trained_once"] == batches["expected"]
    assert result["auc"] > 0.7


def test_full_recovery_loses_nothing_and_partial_recovery_reports_what_it_lost(
    runs: dict[str, dict[str, Any]],
) -> None:
    full, cpr = runs["full"]["result"]["recovery"], runs["cpr"]["result"]["recovery"]
    assert full["lost_batches"] == 0 and full["pls"] == 0
    assert cpr["lost_batches"] > 0 and cpr["lost_samples"] > 0
    assert cpr["partial_saves"] > 0 and full["partial_saves"] == 0  # CPR-MFU
    total = NUM_TRAIN * 3 * 2  # samples x epochs x embedding PS
    assert cpr["pls"] == pytest.approx(cpr["lost_samples"] / total, abs=1e-6)


def test_ecrm_rebuilds_the_killed_ps_from_parity_while_training_goes_on(
    runs: dict[str, dict[str, Any]],
) -> None:
    run = runs["ecrm"]
    recovery = run["result"]["recovery"]
    assert recovery["lost_batches"] == 0 and recovery["pls"] == 0
    (rebuild,) = recovery["ecrm_rebuilds"]
    assert rebuild["node"] == "ps-0" and rebuild["done"] and "error" not in rebuild
    assert rebuild["rows"] > 0 and rebuild["incarnation"] == 1
    # when the PS finished (its clock), not when the master next asked
    assert (
        rebuild["started_at"] - 1
        < rebuild["finished_at"]
        < rebuild["started_at"] + rebuild["seconds"] + 1
    )
    assert "to rebuild it from parity (ECRM)" in run["master_log"]
    assert "ps-0 rebuilt from parity" in run["master_log"]


def test_cpr_checkpoints_are_in_the_bucket_and_restorable(
    runs: dict[str, dict[str, Any]], s3_endpoint: str, tmp_path: Path
) -> None:
    keys = {
        o["Key"]
        for o in s3_client(s3_endpoint).list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["Contents"]
    }
    latest = runs["cpr"]["result"]["durable_checkpoint"]
    name = latest["name"]
    assert {f"{PREFIX}/{name}/ps-0.npz", f"{PREFIX}/{name}/ps-1.npz"} <= keys
    assert f"{PREFIX}/{name}/queue.json" in keys and f"{PREFIX}/LATEST" in keys
    assert latest["samples"] == NUM_TRAIN * 3  # the final checkpoint: training done
    settings = AwsSettings(
        access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY, endpoint_url=s3_endpoint,
        region_name="us-east-1",
    )  # fmt: skip
    store = store_for(parse_checkpoint_uri(f"s3://{BUCKET}/{PREFIX}"), settings)
    restored = restore_latest_checkpoint(
        store, tmp_path / "checkpoints", runs["cpr"]["result"]["job_id"]
    )
    assert restored is not None and restored.name == name
    assert verify_checkpoint(restored) is None
    assert SECRET_KEY not in runs["cpr"]["log"] and SECRET_KEY not in json.dumps(runs["cpr"])
