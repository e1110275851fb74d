"""Summarise a demo run: did the DAG run succeed, where are the model and the metrics."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--metrics", type=Path, required=True)
    parser.add_argument("--since", type=float, required=True, help="epoch seconds of the start")
    parser.add_argument("--airflow-home", type=Path, help="where the UI's job page is printed from")
    args = parser.parse_args()
    log = args.log.read_text(errors="replace")
    finished = re.findall(r"DagRun Finished: .*?state=(\w+)", log)
    deferred = "Pausing task as DEFERRED" in log and "running trigger in line" in log
    fresh = args.metrics.exists() and args.metrics.stat().st_mtime >= args.since
    if not finished or finished[-1] != "success" or not fresh:
        tail = "\n".join(log.splitlines()[-60:])
        print(f"{tail}\n\nDAG run did not succeed (state: {finished[-1:] or 'unknown'}).")
        return 1
    metrics = json.loads(args.metrics.read_text())
    print(
        "DAG run rover_daily_retrain: success"
        + (" (train task deferred, trigger polled)" if deferred else "")
    )
    print(f"  model:       {metrics['model_dir']}")
    print(f"  metrics:     {args.metrics}")
    print(f"  held-out AUC {metrics['auc']:.4f} on {metrics['eval_samples']} samples")
    print(
        f"  trained      {metrics['samples_trained']} samples in {metrics['train_seconds']} s"
        f" ({metrics['samples_per_second']} samples/s), plan {metrics['plan']}"
    )
    acc = metrics["accounting"]
    print(f"  shards       {acc['done_once']}/{acc['shards']} done exactly once")
    if args.airflow_home:
        print_job_page(args.airflow_home, "rover_daily_retrain")
    return 0


def print_job_page(airflow_home: Path, dag_id: str) -> None:
    """Where the newest job of ``dag_id`` is in the Airflow UI, and how to start the UI."""
    from airflow_rover.history.launches import LaunchIndex
    from airflow_rover.history.store import HistoryStore

    with HistoryStore(f"sqlite:///{airflow_home / 'rover' / 'history.db'}") as store:
        launches = LaunchIndex(store).list(dag_id=dag_id, limit=1)
    if not launches:
        return
    home = airflow_home.resolve()
    print(f"  job page     http://localhost:8080/rover/jobs/{launches[0].job_id}")
    print(f"    start the UI: AIRFLOW_HOME={home} .venv/bin/airflow api-server --port 8080")
    print(f"    log in as admin, password in {home}/simple_auth_manager_passwords.json.generated")


if __name__ == "__main__":
    sys.exit(main())
