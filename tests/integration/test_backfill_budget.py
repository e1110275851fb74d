"""A backfill on one cluster budget, end to end: a real Airflow (scheduler with the
LocalExecutor, dag-processor, triggerer, api-server: ``airflow_rig.py``) on a real PostgreSQL
server, which also holds the history store and the budget's registry.

``airflow backfill create`` runs the five dates of ``rover_backfill_budget_test``
(``tests/fixtures/dags/rover_backfill_budget.py``) with ``--max-active-runs 3``: three jobs at a
time would start, but the budget (5 cores) holds only two jobs' plans (2 cores each), and each
running job may grow by a worker. While the backfill runs, the test samples twice a second what
the registry says each job holds, the task instances' states and triggers (metadata DB) and the
jobs' live processes. Then it reads each date's XCom and task log through the api-server.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psutil
import pytest
from airflow_rig import AirflowRig, running_airflow
from dag_runs import end_dag_test
from pg_server import PostgresServer

from airflow_rover.core.job_dir import ENV_JOB_DIR, ENV_NODE_ID
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.launchers.local_processes import JobRole, role_of
from airflow_rover.launchers.process_identity import running
from airflow_rover.operators.job_identity import job_id_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FIXTURE_DAGS = REPO / "tests" / "fixtures" / "dags"
DAG_ID = "rover_backfill_budget_test"
DATES = [f"2026-01-0{day}" for day in range(1, 6)]  # the DAG's schedule: these five only
BUDGET_NAME, BUDGET_CPU = "e2e-backfill", 5.0  # as in the fixture DAG
JOB_CPU = 2.0  # each job's starting plan: 1 worker + 1 PS of 1 core
NUM_TRAIN, NUM_EVAL = 16_000, 1_000
EPOCHS, SHARD_SIZE, BATCH_SIZE = 6, 2048, 256  # as in the fixture DAG
NODE_LINE = re.compile(r"\[(master|ps-\d+|worker-\d+|evaluator)\] ")
ADMISSION_TRIGGER = "airflow_rover.triggers.admission.BudgetAdmissionTrigger"
SAMPLE_EVERY_S = 0.5
BACKFILL_TIMEOUT_S = 540


# -- what the test samples -------------------------------------------------------------------
@dataclass
class Sample:
    """One look at the budget and the jobs, ``at`` seconds after the backfill was created."""

    at: float
    used_cpu: float  # the registry: cores held by fresh rows that do not wait
    waiting: list[str]  # the registry: jobs waiting to start
    live_nodes: dict[str, list[str]]  # each date's live PS and workers (its processes)
    states: dict[str, str]  # each date's train task: its state (+ "/admission" on that trigger)


@dataclass
class WaitingSeen:
    """A date seen deferred on the admission trigger, before and after its processes were
    looked at: what of its job was alive then, and its registry row."""

    at: float
    wall: float  # when its registry row was read (seconds since the epoch)
    ds: str
    job_id: str
    next_method: str | None
    processes: list[str]
    row_waiting: bool | None  # None: no row yet; False: admitted, the task not resumed yet


@dataclass
class Watch:
    samples: list[Sample] = field(default_factory=list)
    waiting: list[WaitingSeen] = field(default_factory=list)


def registry_rows(rig: AirflowRig) -> list[dict[str, Any]]:
    sql = (
        "select job_id, plan, waiting, updated_at, ttl_s from rover_running_jobs "
        "where budget = :budget"
    )
    try:
        return rig.query(sql, rig.history_url, budget=BUDGET_NAME)
    except Exception:  # the first job has not created the registry's tables yet
        return []


def used_cpu(rows: list[dict[str, Any]], now: float) -> float:
    """Cores the registry counts as held: rows that do not wait and have not lapsed."""
    return sum(
        row["plan"]["num_workers"] * row["plan"]["worker_cpu"]
        + row["plan"]["num_ps"] * row["plan"]["ps_cpu"]
        for row in rows
        if not row["waiting"] and row["updated_at"] + row["ttl_s"] >= now
    )


def train_tasks(rig: AirflowRig) -> dict[str, dict[str, Any]]:
    """Each date's ``train`` task instance: state, next method, its trigger's class path."""
    sql = (
        "select dr.logical_date, dr.run_id, ti.state, ti.next_method, t.classpath "
        "from task_instance ti join dag_run dr on dr.dag_id = ti.dag_id and dr.run_id = ti.run_id "
        "left join trigger t on t.id = ti.trigger_id "
        "where ti.dag_id = :dag_id and ti.task_id = 'train'"
    )
    return {row["logical_date"].strftime("%Y-%m-%d"): row for row in rig.query(sql, dag_id=DAG_ID)}


def live_job_processes(job_dirs: dict[str, Path]) -> dict[str, list[str]]:
    """Each date's running job processes (keeper, master, ps-N, worker-N...), in one pass
    over the host's processes."""
    by_dir = {str(path.resolve()): ds for ds, path in job_dirs.items()}
    found: dict[str, list[str]] = {ds: [] for ds in job_dirs}
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            cmdline = proc.cmdline()
            role = role_of(cmdline)
            if role is None:
                continue
            if role is JobRole.NODE:
                env = proc.environ()
                folder, name = env.get(ENV_JOB_DIR), env.get(ENV_NODE_ID) or "node"
            else:
                flags = [i + 1 for i, arg in enumerate(cmdline[:-1]) if arg == "--job-dir"]
                folder, name = (cmdline[flags[0]] if flags else None), role.value
            ds = by_dir.get(str(Path(folder).resolve())) if folder else None
            if ds is not None and running(proc):
                found[ds].append(name)
    return found


def is_admission_wait(task: dict[str, Any] | None) -> bool:
    return (
        task is not None
        and task["state"] == "deferred"
        and task["classpath"] == (ADMISSION_TRIGGER)
    )


def sample(rig: AirflowRig, job_dirs: dict[str, Path], began: float, watch: Watch) -> None:
    now = time.time()
    rows = registry_rows(rig)
    before = train_tasks(rig)
    live = live_job_processes(job_dirs)
    after = train_tasks(rig)
    at = round(time.monotonic() - began, 2)
    nodes = {
        ds: sorted(n for n in names if n.startswith(("ps-", "worker-")))
        for ds, names in live.items()
    }
    states = {
        ds: str(task["state"]) + ("/admission" if is_admission_wait(task) else "")
        for ds, task in after.items()
    }
    watch.samples.append(
        Sample(at, used_cpu(rows, now), [r["job_id"] for r in rows if r["waiting"]], nodes, states)
    )
    job_rows = {row["job_id"]: row for row in rows}
    for ds, task in before.items():
        if is_admission_wait(task) and is_admission_wait(after.get(ds)):
            job_id = job_id_for(DAG_ID, "train", task["run_id"])
            row = job_rows.get(job_id)
            waiting = None if row is None else bool(row["waiting"])
            seen = WaitingSeen(at, now, ds, job_id, task["next_method"], sorted(live[ds]), waiting)
            watch.waiting.append(seen)


def runs_ended(rig: AirflowRig) -> list[dict[str, Any]] | None:
    sql = "select run_id, run_type, state from dag_run where dag_id = :dag_id"
    runs = rig.query(sql, dag_id=DAG_ID)
    ended = len(runs) >= len(DATES) and all(r["state"] in ("success", "failed") for r in runs)
    return runs if ended else None


# -- reading results through the api-server --------------------------------------------------
def api_get(rig: AirflowRig, path: str, **params: Any) -> Any:
    reply = httpx.get(
        f"{rig.api_url}/api/v2{path}",
        params=params,
        headers={"Accept": "application/json"},
        timeout=30,
    )
    assert reply.status_code == 200, f"GET {path}: {reply.status_code} {reply.text[:500]}"
    return reply.json()


def task_path(run_id: str) -> str:
    return f"/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances/train"


def task_log(rig: AirflowRig, run_id: str, try_number: int) -> list[str]:
    """The task's log as the UI shows it (the task's and its triggers' lines), one string a
    line."""
    body = api_get(rig, f"{task_path(run_id)}/logs/{try_number}", full_content="true")
    lines = []
    for entry in body.get("content") or []:
        if isinstance(entry, dict):
            lines.append(str(entry.get("event", "")))
        else:
            lines.append(str(entry))
    return lines


# -- the backfill ----------------------------------------------------------------------------
def watch_backfill(
    rig: AirflowRig, job_dirs: dict[str, Path]
) -> tuple[list[dict[str, Any]], Watch]:
    """Sample until every run of the backfill has ended; its runs and the samples."""
    began = time.monotonic()
    watch = Watch()
    while True:
        assert time.monotonic() - began < BACKFILL_TIMEOUT_S, (
            f"the backfill did not end within {BACKFILL_TIMEOUT_S} s; last sample: "
            f"{watch.samples[-1:]}\n{rig.tails()}"
        )
        rig.check_running()
        sample(rig, job_dirs, began, watch)
        runs = runs_ended(rig)
        if runs is not None:
            return runs, watch
        time.sleep(SAMPLE_EVERY_S)


@pytest.fixture(scope="module")
def backfill(
    postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Run the backfill on a fresh Airflow, watching it; what the tests check (Airflow and
    every job's processes are stopped before they run)."""
    root = tmp_path_factory.mktemp("backfill_budget")
    began = time.monotonic()
    data = generate_dataset(
        root / "data", SyntheticConfig(num_train=NUM_TRAIN, num_eval=NUM_EVAL, seed=26)
    )
    job_root = root / "jobs"
    job_dirs = {ds: job_root / ds for ds in DATES}
    dag_files = [FIXTURE_DAGS / "rover_backfill_budget.py", FIXTURE_DAGS / "fixture_common.py"]
    conf = {
        "train_data": str(data.train_dir),
        "eval_data": str(data.eval_dir),
        "job_root": str(job_root),
    }
    times = {"data_s": time.monotonic() - began}
    try:
        with running_airflow(postgres_server, root / "rig", dag_files) as rig:
            rig.wait_parsed(DAG_ID)
            times["airflow_up_and_parsed_s"] = rig.elapsed()
            rig.airflow(
                *("backfill", "create", "--dag-id", DAG_ID),
                *("--from-date", DATES[0], "--to-date", DATES[-1], "--max-active-runs", "3"),
                *("--dag-run-conf", json.dumps(conf)),
            )
            backfill_began = time.monotonic()
            runs, watch = watch_backfill(rig, job_dirs)
            times["backfill_s"] = time.monotonic() - backfill_began
            outcome = collect(rig, runs, watch, times)
    finally:
        for job_dir in job_dirs.values():
            end_dag_test(None, job_dir)
    times["total_s"] = time.monotonic() - began
    print_summary(outcome)
    return outcome


def collect(
    rig: AirflowRig, runs: list[dict[str, Any]], watch: Watch, times: dict[str, float]
) -> dict[str, Any]:
    """What the tests check, read once the backfill ended (a failure shows the logs)."""
    by_ds: dict[str, dict[str, Any]] = {}
    for run in runs:
        ds = run["run_id"].split("__", 1)[1][:10]
        task = api_get(rig, task_path(run["run_id"]))
        xcom = None
        if task["state"] == "success":
            entry = api_get(rig, f"{task_path(run['run_id'])}/xcomEntries/return_value")
            xcom = entry["value"]
            if isinstance(xcom, str):
                xcom = json.loads(xcom)
        by_ds[ds] = {
            **run,
            "task": task,
            "result": xcom,
            "log": task_log(rig, run["run_id"], max(int(task["try_number"]), 1)),
        }
    decisions = rig.query(
        "select at, job_id, action, plan, reason from rover_budget_decisions "
        "where budget = :budget order by id",
        rig.history_url,
        budget=BUDGET_NAME,
    )
    timing = rig.query(
        "select logical_date, start_date, end_date from dag_run where dag_id = :dag_id "
        "order by logical_date",
        dag_id=DAG_ID,
    )
    return {
        "runs": by_ds,
        "watch": watch,
        "decisions": decisions,
        "times": times,
        "timing": timing,
        "tails": rig.tails(),
    }


def print_summary(outcome: dict[str, Any]) -> None:
    watch: Watch = outcome["watch"]
    times = {k: round(v, 1) for k, v in outcome["times"].items()}
    print(f"\nphases: {times}; {len(watch.samples)} samples")
    for row in outcome["timing"]:
        run_s = (row["end_date"] - row["start_date"]).total_seconds() if row["end_date"] else None
        print(f"  {row['logical_date']:%Y-%m-%d}: run {run_s and round(run_s, 1)} s")
    peak = max((s.used_cpu for s in watch.samples), default=0.0)
    live_peak = max((sum(map(len, s.live_nodes.values())) for s in watch.samples), default=0)
    print(f"peak cores held (registry): {peak}; peak live PS + workers: {live_peak}")
    print(f"samples of a date deferred on the admission trigger: {len(watch.waiting)}")
    counts: dict[str, int] = {}
    for decision in outcome["decisions"]:
        counts[decision["action"]] = counts.get(decision["action"], 0) + 1
    print(f"decisions: {counts}")
    for decision in outcome["decisions"][:40]:
        print(f"  {decision['job_id']} {decision['action']}: {decision['reason'][:150]}")
    for run in outcome["runs"].values():
        result = run["result"] or {}
        batches = (result.get("accounting") or {}).get("batches")
        print(f"  {run['run_id']}: {run['state']}, plan {result.get('plan')}, batches {batches}")


def expected_batches() -> int:
    per_epoch = sum(
        -(-min(SHARD_SIZE, NUM_TRAIN - start) // BATCH_SIZE)
        for start in range(0, NUM_TRAIN, SHARD_SIZE)
    )
    return EPOCHS * per_epoch


# -- tests -----------------------------------------------------------------------------------
def test_the_budget_was_never_exceeded(backfill: dict[str, Any]) -> None:
    """Sampled twice a second through the backfill, the cores the registry counts as held
    never passed the budget, nor did the jobs' live PS and workers (1 core each); and the
    budget was really contended: dates waited for it."""
    watch: Watch = backfill["watch"]
    assert watch.samples, "nothing was sampled"
    over = [s for s in watch.samples if s.used_cpu > BUDGET_CPU]
    assert not over, over[:5]
    crowded = [s for s in watch.samples if sum(map(len, s.live_nodes.values())) > BUDGET_CPU]
    assert not crowded, crowded[:5]
    assert max(s.used_cpu for s in watch.samples) >= 2 * JOB_CPU  # two jobs ran at once
    assert any(s.waiting for s in watch.samples), "no date ever waited for the budget"
    actions = {d["action"] for d in backfill["decisions"]}
    assert {"admit", "wait"} <= actions, actions


def test_every_date_succeeded_with_every_batch_trained_once(backfill: dict[str, Any]) -> None:
    runs = backfill["runs"]
    assert sorted(runs) == DATES, sorted(runs)
    failed = {ds: r["state"] for ds, r in runs.items() if r["state"] != "success"}
    assert not failed, f"{failed}\n{backfill['tails']}"
    assert {r["run_type"] for r in runs.values()} == {"backfill"}
    for ds, run in runs.items():
        batches = run["result"]["accounting"]["batches"]
        assert batches["expected"] == expected_batches(), (ds, batches)
        assert batches["trained_once"] == batches["expected"], (ds, batches)
        assert batches["never_trained"] == batches["partially_trained"] == 0, (ds, batches)
        assert run["result"]["samples_trained"] == NUM_TRAIN * EPOCHS, ds


def test_waiting_jobs_held_no_worker_slot(backfill: dict[str, Any]) -> None:
    """Whenever a date's task was deferred on the admission trigger (seen so before and after
    its processes were looked at), its job had no process alive (no keeper, master or node)
    and its registry row held nothing: it waited, or the budget had just admitted it (an
    ``admit`` decision recorded before the row was read) and the task had not resumed yet."""
    seen: list[WaitingSeen] = backfill["watch"].waiting
    assert seen, "no date was ever seen deferred on the admission trigger"
    assert {w.next_method for w in seen} == {"execute_admitted"}
    alive = [w for w in seen if w.processes]
    assert not alive, alive[:5]
    admitted = {
        d["job_id"]: d["at"] for d in reversed(backfill["decisions"]) if d["action"] == "admit"
    }
    holding = [
        w for w in seen if w.row_waiting is False and admitted.get(w.job_id, w.wall + 1) > w.wall
    ]
    assert not holding, holding[:5]
    waited = {w.ds for w in seen if w.row_waiting}
    assert waited, "no date was seen deferred with a waiting registry row"
    after_admit = sum(w.row_waiting is False for w in seen)
    print(
        f"{len(seen)} samples of dates deferred on admission ({sorted(waited)} seen waiting; "
        f"{after_admit} samples between admission and the task's resumption)"
    )


def test_the_task_log_shows_node_log_lines(backfill: dict[str, Any]) -> None:
    """Each date's task log, read through the api-server, shows its job's master and node log
    lines prefixed by node (streamed by the job's trigger); a date that waited for the budget
    says why it waited and that it was admitted."""
    waited = {w.ds for w in backfill["watch"].waiting if w.row_waiting}
    for ds, run in backfill["runs"].items():
        log = "\n".join(run["log"])
        streamed = [line for line in run["log"] if NODE_LINE.match(line)]
        assert re.search(r"^\[master\] .* started worker-0 ", log, re.M), (ds, log[-3000:])
        nodes = {NODE_LINE.match(line).group(1) for line in streamed}  # type: ignore[union-attr]
        assert nodes - {"master"}, (ds, streamed[:10])  # a PS's, a worker's or the evaluator's
        if ds in waited:
            assert "waits for cluster budget 'e2e-backfill'" in log, (ds, log[-3000:])
            assert "Admitted to the cluster budget" in log, (ds, log[-3000:])
        print(f"{ds}: {len(streamed)} streamed lines from {sorted(nodes)}, e.g. {streamed[:1]}")
