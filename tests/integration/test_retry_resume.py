"""An Airflow retry resumes a killed job from its checkpoint and shard queue.

The fixture DAG ``rover_retry_test`` (``tests/fixtures/dags/rover_retry.py``) trains with
``recovery.max_node_restarts=0`` and ``retries=1``. While ``dag.test()`` runs it in a subprocess,
the test waits for a checkpoint holding finished shards, then SIGKILLs a worker: the job fails
beyond recovery, the trigger reports the failure, the first try fails, and the second try
relaunches the job, whose new master resumes from ``checkpoints/LATEST`` and trains only what the
checkpoint did not hold. The DAG run succeeds with every batch applied exactly once.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from dag_runs import end_dag_test, start_dag_test, tail

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.shards import ShardQueue
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.launchers.local_processes import node_processes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FIXTURE_DAGS = REPO / "tests" / "fixtures" / "dags"
DAG_ID = "rover_retry_test"

NUM_TRAIN = 40_000
NUM_EVAL = 10_000
EPOCHS = 3  # as in the fixture DAG
SHARD_SIZE = 2048  # as in the fixture DAG
DONE_SHARDS_BEFORE_KILL = 2  # the checkpoint the retry resumes from holds at least these
RUN_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def airflow_env(airflow_env: dict[str, str]) -> dict[str, str]:
    """conftest's isolated Airflow, reading DAGs from the test fixtures' folder."""
    return {**airflow_env, "AIRFLOW__CORE__DAGS_FOLDER": str(FIXTURE_DAGS)}


# -- helpers ---------------------------------------------------------------------------------
def done_shards(queue: dict[str, Any] | None) -> int:
    return len((queue or {}).get("done", []))


# -- the run ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def retried(
    airflow_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Run the DAG, kill a worker of its first try's job mid-training, return what happened."""
    root = tmp_path_factory.mktemp("retry")
    started = time.monotonic()
    data = generate_dataset(
        root / "data", SyntheticConfig(num_train=NUM_TRAIN, num_eval=NUM_EVAL, seed=7)
    )
    data_s = time.monotonic() - started
    job_dir = root / "job"
    layout = JobDir(job_dir)
    out, log_path = root / "outcome.json", root / "dag_test.log"
    conf = {
        "train_data": str(data.train_dir),
        "eval_data": str(data.eval_dir),
        "job_dir": str(job_dir),
    }
    seen: dict[str, Any] = {"queues": {}, "kill": None, "try1": None}
    proc = start_dag_test(DAG_ID, "2026-12-01", conf, out, log_path, airflow_env)
    t0 = time.monotonic()
    try:
        while proc.poll() is None:
            assert time.monotonic() - t0 < RUN_TIMEOUT_S, f"dag.test hung:\n{tail(log_path)}"
            # Every checkpoint's queue, to know later what the retry resumed from.
            for queue_file in layout.checkpoints.glob("ckpt-*/queue.json"):
                name = queue_file.parent.name
                if name not in seen["queues"]:
                    queue = layout.read_json(queue_file)
                    if queue is not None:
                        seen["queues"][name] = queue
            state = layout.read_json(layout.state_file) or {}
            if seen["kill"] is None:
                assert state.get("state") != "succeeded", (
                    "the first try's job finished before it could be killed: make the data "
                    f"bigger (kill condition never met after {time.monotonic() - t0:.1f} s)"
                )
                latest = layout.latest_checkpoint()
                queue = seen["queues"].get(latest.name) if latest else None
                workers = {
                    n: p for n, p in node_processes(layout).items() if n.startswith("worker-")
                }
                if (
                    state.get("state") == "running"
                    and done_shards(queue) >= DONE_SHARDS_BEFORE_KILL
                    and workers
                ):
                    node = sorted(workers)[0]
                    workers[node].send_signal(signal.SIGKILL)
                    seen["kill"] = {
                        "at_s": round(time.monotonic() - t0, 2),
                        "node": node,
                        "pid": workers[node].pid,
                        "checkpoint": latest.name if latest else None,
                        "samples_done": state["progress"]["samples_done"],
                        "keeper_pid": layout.master_info().get("keeper_pid"),
                    }
            elif seen["try1"] is None and state.get("state") == "failed":
                seen["try1"] = {
                    "at_s": round(time.monotonic() - t0, 2),
                    "message": state.get("message", ""),
                }
            time.sleep(0.1)
        run_s = time.monotonic() - t0
    finally:
        end_dag_test(proc, job_dir)
    log_text = log_path.read_text(errors="replace")
    assert proc.returncode == 0 and out.exists(), f"dag.test failed:\n{log_text[-8000:]}"
    assert seen["kill"] is not None, (
        f"dag.test ended after {run_s:.1f} s without a worker killed (no checkpoint with "
        f"{DONE_SHARDS_BEFORE_KILL} finished shards seen while training): make the data bigger"
    )
    timings = {
        "data_s": round(data_s, 1),
        "kill_at_s": seen["kill"] and seen["kill"]["at_s"],
        "try1_failed_at_s": seen["try1"] and seen["try1"]["at_s"],
        "dag_test_s": round(run_s, 1),
    }
    outcome = json.loads(out.read_text())
    result = outcome["xcom"].get("train:return_value") or {}
    print(
        f"\nretry/resume timings: {timings}; kill: {seen['kill']}; "
        f"tasks: {outcome['tasks']}; samples_resumed={result.get('samples_resumed')}, "
        f"this_run={result.get('samples_trained_this_run')}, "
        f"resumed_from={(result.get('recovery') or {}).get('resumed_from')}, "
        f"auc={result.get('auc')}"
    )
    return {
        **outcome,
        "log": log_text,
        "seen": seen,
        "layout": layout,
    }


# -- tests -----------------------------------------------------------------------------------
def test_the_first_try_failed_beyond_recovery_and_the_retry_succeeded(
    retried: dict[str, Any],
) -> None:
    """A worker was killed mid-training, the job failed (no node restarts allowed), the first
    try failed with the master's reason, and the DAG run succeeded on the second try, which
    found the failed job through ``task_state_store`` and launched it again."""
    kill = retried["seen"]["kill"]
    assert kill is not None, "no worker was killed"
    log = retried["log"]
    reason = f"{kill['node']} exited with code -9; no restarts left"
    assert reason in log and "recovery.max_node_restarts=0" in log, log[-6000:]
    assert "Prior job in terminal state, resubmitting fresh" not in log
    resumed = re.search(r"Resuming job \S+ in \S+ \(failed\): from checkpoint (ckpt-\d+), ", log)
    assert resumed is not None and resumed.group(1) >= kill["checkpoint"], log[-6000:]
    assert log.count("Pausing task as DEFERRED") == 2  # each try deferred once
    assert retried["state"] == "success", retried["tasks"]
    assert retried["tasks"]["train"] == ["success", 2]
    # The retry launched a new job master (a new keeper) in the same job directory.
    keeper = retried["layout"].master_info().get("keeper_pid")
    assert keeper is not None and keeper != kill["keeper_pid"]


def test_the_retry_trained_only_what_the_checkpoint_did_not_hold(retried: dict[str, Any]) -> None:
    """The second try resumed from a checkpoint and trained only the remaining samples."""
    result = retried["xcom"]["train:return_value"]
    total = NUM_TRAIN * EPOCHS
    assert result["state"] == "succeeded"
    assert result["samples_trained"] == total
    assert result["samples_resumed"] > 0
    assert result["samples_trained_this_run"] == total - result["samples_resumed"] < total
    resumed_from = result["recovery"]["resumed_from"]
    assert resumed_from is not None, result["recovery"]
    # It resumed from the newest checkpoint the first try wrote (at or after the one seen at
    # the kill), whose queue held finished shards that the retry did not train again.
    kill = retried["seen"]["kill"]
    name = Path(resumed_from).name
    assert name >= kill["checkpoint"], (name, kill)
    queue = retried["seen"]["queues"].get(name)
    assert queue is not None, f"{name} not seen during the first try"
    assert done_shards(queue) >= DONE_SHARDS_BEFORE_KILL
    # What every PS had applied covers the shards the checkpoint's queue marks done, less at
    # most a few batches (a shard may complete between the PS save and the queue save).
    done_in_checkpoint = ShardQueue.from_dict(queue).done_samples
    assert result["samples_resumed"] >= done_in_checkpoint - 8 * 256, (result, queue)


def test_every_batch_was_trained_exactly_once_across_both_tries(retried: dict[str, Any]) -> None:
    """The PS ledgers account for every batch once: none lost, none applied twice."""
    result = retried["xcom"]["train:return_value"]
    batches = result["accounting"]["batches"]
    assert batches["expected"] == EPOCHS * sum(
        -(-min(SHARD_SIZE, NUM_TRAIN - start) // 256) for start in range(0, NUM_TRAIN, SHARD_SIZE)
    )
    assert batches["trained_once"] == batches["expected"]
    assert batches["never_trained"] == batches["partially_trained"] == 0


def test_the_resumed_model_is_good(retried: dict[str, Any]) -> None:
    """The model trained across two tries scores the held-out split well above chance."""
    result = retried["xcom"]["train:return_value"]
    assert result["auc"] > 0.7, result
    assert result["eval_samples"] == NUM_EVAL
