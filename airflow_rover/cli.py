"""``rover``: run a job on the local launcher without Airflow (development, benchmarks).

    rover data gen --out DIR [--num-train N] [--num-eval N] [--seed S]
    rover train --config job.yaml [--job-dir DIR]
    rover status --job-dir DIR [--full]
    rover stop --job-dir DIR
    rover plan --job-dir DIR [--workers N] [--ps M] [--apply]
    rover budget [--name NAME] [--history-url URL] [--last N]

``status`` prints the job's status as JSON on stdout and, for a job with data workers, a short
block on them on stderr (their last decisions; ``--full``: all of them). ``status``, ``stop``
and ``plan`` work on any job directory, local or Kubernetes (through
``ElasticJobHook``). ``plan`` asks the running job for other counts; an Airflow task's trigger
applies it, ``--apply`` applies it at once (a job started with ``rover train`` has no trigger).
``budget`` shows the jobs that hold or wait for a cluster budget and the arbiter's latest
decisions, from the history store (default: SQLite in ``$AIRFLOW_HOME/rover``).

``job.yaml`` holds the fields of ``JobSpec`` (the operator validates the same schema).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import ValidationError

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.job_status import data_workers_lines, progress_line, without_history
from airflow_rover.core.plan_limits import check_start_plan
from airflow_rover.core.spec import JobSpec, describe_errors
from airflow_rover.core.states import TERMINAL_STATES, JobState
from airflow_rover.data.offset_index import ENV_INDEX_DIR, job_index_dir
from airflow_rover.data.preflight import PreflightError
from airflow_rover.launchers.local import LocalBackend, local_job_status
from airflow_rover.worker.preflight import preflight

STATUS_DECISIONS = 5  # the data workers' decisions a short ``rover status`` prints


def load_spec(path: Path) -> JobSpec:
    """A ``JobSpec`` from YAML; ``job_id`` defaults to the file's name."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SystemExit(f"--config {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise SystemExit(f"--config {path}: expected a mapping of JobSpec fields")
    raw.setdefault("job_id", re.sub(r"[^a-z0-9.-]+", "-", path.stem.lower()).strip("-.") or "job")
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise SystemExit(f"--config {path}: {describe_errors(exc, JobSpec)}") from None
    try:
        check_start_plan(spec.autoscale, spec.plan)
    except ValueError as exc:
        raise SystemExit(f"--config {path}: {exc}") from None
    return spec


def run_job(
    spec: JobSpec, job_dir: Path, poll_s: float = 1.0, quiet: bool = False
) -> dict[str, Any]:
    """Preflight, launch and wait for a local job; returns its final status."""
    os.environ[ENV_INDEX_DIR] = str(job_index_dir(job_dir.resolve()))  # as the job's processes
    preflight(spec)
    directory = JobDir(job_dir.resolve())
    LocalBackend().launch(directory, spec)
    while True:
        status = local_job_status(directory)
        if status["state"] in TERMINAL_STATES:
            return status
        if not quiet:
            print(progress_line(status), file=sys.stderr)
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rover", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    data = sub.add_parser("data", help="datasets").add_subparsers(
        dest="data_command", required=True
    )
    data.add_parser("gen", help="generate synthetic Criteo-shaped data (--help for flags)")
    train = sub.add_parser("train", help="run a job on the local launcher and wait for it")
    train.add_argument("--config", type=Path, required=True)
    train.add_argument("--job-dir", type=Path, help="default: ./.rover/jobs/<job_id>")
    for name in ("status", "stop"):
        cmd = sub.add_parser(name, help=f"{name} of a job")
        cmd.add_argument("--job-dir", type=Path, required=True)
        cmd.add_argument(
            "--full",
            action="store_true",
            help="with the throughput and checkpoint histories and every data-worker "
            "decision (default: left out, the last few decisions)",
        )
    plan = sub.add_parser("plan", help="ask a running job for other worker/PS counts")
    plan.add_argument("--job-dir", type=Path, required=True)
    plan.add_argument("--workers", type=int)
    plan.add_argument("--ps", type=int)
    plan.add_argument("--apply", action="store_true", help="apply it now (no trigger)")
    budget = sub.add_parser("budget", help="who holds or waits for a cluster budget, and why")
    budget.add_argument("--name", help="one budget (default: every budget)")
    budget.add_argument("--history-url", help="the history store's SQLAlchemy URL")
    budget.add_argument("--last", type=int, default=20, help="decisions to show (default 20)")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["data", "gen"]:  # its own parser: flags belong to the generator
        from airflow_rover.data.synthetic import generate_main

        return generate_main(argv[2:])
    args = parser.parse_args(argv)
    if args.command == "train":
        spec = load_spec(args.config)
        job_dir = args.job_dir or Path(".rover") / "jobs" / spec.job_id
        try:
            status = run_job(spec, job_dir)
        except PreflightError as exc:
            print(f"rover train: {exc}", file=sys.stderr)
            return 2
        print(
            json.dumps(
                {k: status.get(k) for k in ("job_id", "state", "message", "result")}, indent=2
            )
        )
        return 0 if status["state"] == JobState.SUCCEEDED else 1
    if args.command == "budget":
        return show_budget(args.name, args.history_url, args.last)
    from airflow_rover.hooks.elastic_job import ElasticJobHook

    hook = ElasticJobHook(args.job_dir.resolve())
    if args.command == "stop":
        hook.stop("stopped with rover stop")
    if args.command == "plan":
        if args.workers is None and args.ps is None:
            print("rover plan: give --workers and/or --ps", file=sys.stderr)
            return 2
        try:
            record = hook.request_plan(args.workers, args.ps, "requested with rover plan")
            if args.apply:
                record = asyncio.run(hook.async_apply_plan(record.id))
        except (httpx.HTTPStatusError, RuntimeError) as exc:
            detail = exc.response.text if isinstance(exc, httpx.HTTPStatusError) else str(exc)
            print(f"rover plan: {detail}", file=sys.stderr)
            return 1
        print(json.dumps(record.to_json(), indent=2))
        return 0
    status = hook.get_status()
    print(json.dumps(status if args.full else without_history(status), indent=2))
    for line in data_workers_lines(status, None if args.full else STATUS_DECISIONS):
        print(line, file=sys.stderr)  # for a person: stdout stays JSON
    return 0


def show_budget(name: str | None, url: str | None, last: int) -> int:
    from airflow_rover.history.budget_report import budget_report
    from airflow_rover.history.registry import RunningJobRegistry
    from airflow_rover.history.store import HistoryStore
    from airflow_rover.hooks.history_store import default_history_url

    with RunningJobRegistry(HistoryStore(url or default_history_url())) as registry:
        print(budget_report(registry, name, last))
    return 0


if __name__ == "__main__":
    sys.exit(main())
