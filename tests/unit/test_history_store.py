"""The job history store: schema on first use, one record per job (upsert), plan history,
throughput samples and peak memory when the status has them, no secret ever stored; URLs from
Airflow connections; and the training operator recording its job when it ends."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import DAG, Connection
from airflow.sdk.exceptions import AirflowException
from sqlalchemy import func, inspect, select
from structlog.testing import capture_logs

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.spec import (
    FeatureConfig,
    JobSpec,
    ResourcePlan,
    TableConfig,
    TrainingConfig,
)
from airflow_rover.history.records import record_from_status
from airflow_rover.history.store import HistoryStore, jobs, nodes, plans, safe_url, throughput
from airflow_rover.hooks.history_store import (
    HistoryStoreHook,
    default_history_url,
    url_from_connection,
)
from airflow_rover.operators.training import ElasticTrainingOperator

TOKEN = "s3cr3t-job-token-0123456789abcdef"
FEATURES = FeatureConfig(
    num_dense=13, tables=(TableConfig(name="a", column="C1", vocab_size=100, dim=8),)
)
INITIAL = ResourcePlan(num_workers=1, num_ps=1)
SCALED = ResourcePlan(num_workers=4, num_ps=2, ps_memory_mb=4096)


def spec_for(job_id: str = "daily.train-abc", plan: ResourcePlan = INITIAL) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        train_data="/data/train",
        features=FEATURES,
        plan=plan,
        training=TrainingConfig(epochs=2, batch_size=256),
    )


def final_status(job_id: str = "daily.train-abc", **extra: Any) -> dict[str, Any]:
    """What ``JobMaster.status()`` returns once a job has succeeded (today's shape)."""
    return {
        "job_id": job_id,
        "state": "succeeded",
        "message": "trained 20000 samples",
        "progress": {"samples_done": 20_000, "samples_total": 20_000, "fraction": 1.0},
        "throughput": 0.0,
        "plan": INITIAL.model_dump(),
        "nodes": [
            {
                "id": "ps-0",
                "role": "ps",
                "state": "succeeded",
                "steps": 0,
                "samples": 0,
                "step_time_ms": 0.0,
                "exit_code": 0,
                "restarts": 0,
            },
            {
                "id": "worker-0",
                "role": "worker",
                "state": "succeeded",
                "steps": 40,
                "samples": 20_000,
                "step_time_ms": 12.5,
                "exit_code": 0,
                "restarts": 1,
            },
        ],
        "evaluation": {"auc": 0.75, "logloss": 0.5, "samples": 5000},
        "started_at": 1000.0,
        "finished_at": 1010.0,
        "duration_s": 10.0,
        "recovery": {"node_restarts": 1},
        "result": {
            "samples_trained": 20_000,
            "train_seconds": 8.0,
            "samples_per_second": 2500.0,
            "auc": 0.75,
            "logloss": 0.5,
            "model_dir": "/jobs/x/model",
            "plan": INITIAL.model_dump(),
            "accounting": {"shards": 3, "done_once": 3},
        },
        **extra,
    }


PLANS = [
    {"at": 1000.0, "plan": INITIAL.model_dump(), "reason": "warm start", "applied": True},
    {"at": 1004.0, "plan": SCALED.model_dump(), "reason": "optimizer: +3 workers", "applied": True},
    {"at": 1008.0, "plan": {**SCALED.model_dump(), "num_workers": 8}, "reason": "too soon",
     "applied": False},
]  # fmt: skip
PROFILE = {
    "throughput": [
        {
            "at": 1002.0,
            "plan": INITIAL.model_dump(),
            "samples_per_second": 900.0,
            "step_time_ms": 40.0,
        },
        {
            "at": 1006.0,
            "plan": SCALED.model_dump(),
            "samples_per_second": 3100.0,
            "step_time_ms": 45.0,
        },
    ],
    "peak_memory_mb": {"ps-0": 812.5, "worker-0": 1500.0, "worker-1": 1400.0},
}


@pytest.fixture
def store(tmp_path: Path) -> Any:
    with HistoryStore(f"sqlite:///{tmp_path / 'sub' / 'history.db'}") as history:
        yield history


def count(store: HistoryStore, table: Any) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table)).scalar_one())


# -- schema ----------------------------------------------------------------------------------
def test_the_schema_is_created_on_first_use_and_again_is_harmless(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new' / 'dir' / 'history.db'}"
    first, second = HistoryStore(url), HistoryStore(url)
    assert first.list_jobs() == []  # directory and tables created on first use
    second.ensure_schema()
    first.ensure_schema()
    names = set(inspect(first.engine).get_table_names())
    assert names >= {"rover_jobs", "rover_job_plans", "rover_job_throughput", "rover_job_nodes"}
    first.close()
    second.close()


# -- recording -------------------------------------------------------------------------------
def test_a_status_with_plans_and_profile_records_all_of_it(store: HistoryStore) -> None:
    status = final_status(plans=PLANS, profile=PROFILE)
    record = record_from_status(
        status, spec_for(), dag_id="daily", task_id="train", run_id="r1", try_number=1
    )
    store.record_job(record)
    job = store.get_job("daily.train-abc")
    assert job is not None
    assert job["outcome"] == "succeeded"
    assert (job["dag_id"], job["task_id"], job["run_id"], job["try_number"]) == (
        "daily",
        "train",
        "r1",
        1,
    )
    assert job["model"] == "wide_deep" and job["features"] == FEATURES.model_dump(mode="json")
    assert job["tables"] == [["a", 8, 100]] and job["embedding_params"] == 800
    assert job["dataset_samples"] == 10_000  # 20000 samples over 2 epochs
    assert job["initial_plan"] == INITIAL.model_dump()
    assert job["final_plan"] == SCALED.model_dump()  # the last *applied* plan
    assert (job["samples_per_second"], job["auc"]) == (2500.0, 0.75)
    assert [(p["reason"], p["applied"]) for p in job["plans"]] == [
        ("warm start", True),
        ("optimizer: +3 workers", True),
        ("too soon", False),
    ]
    assert [s["samples_per_second"] for s in job["throughput"]] == [900.0, 3100.0]
    assert job["throughput"][1]["plan"] == SCALED.model_dump()
    peaks = {n["node_id"]: n["peak_memory_mb"] for n in job["nodes"]}
    assert peaks == {"ps-0": 812.5, "worker-0": 1500.0, "worker-1": 1400.0}
    worker = next(n for n in job["nodes"] if n["node_id"] == "worker-0")
    assert (worker["role"], worker["steps"], worker["restarts"]) == ("worker", 40, 1)


def test_the_masters_proposal_records_give_the_initial_and_final_plans(
    store: HistoryStore,
) -> None:
    """The autoscaler's shape: ``state`` proposed / declined / applied and ``previous``; the
    master rewrites job.json with each applied plan, so the initial plan comes from the first
    proposal's ``previous``."""
    proposals = [
        {"id": 1, "at": 1003.0, "plan": SCALED.model_dump(), "previous": INITIAL.model_dump(),
         "rule": "idle_ps", "reason": "PS idle: add workers", "state": "applied",
         "applied_at": 1003.5},
        {"id": 2, "at": 1007.0, "plan": {**SCALED.model_dump(), "num_ps": 3},
         "previous": SCALED.model_dump(), "rule": "hot_ps", "reason": "hot PS",
         "state": "declined", "note": "PS changes need live migration"},
    ]  # fmt: skip
    profile = {**PROFILE, "cpu_used": {"ps-0": 0.9, "worker-0": 1.7}}
    status = final_status(plans=proposals, profile=profile)
    status["result"] = {**status["result"], "plan": SCALED.model_dump()}
    store.record_job(record_from_status(status, spec_for(plan=SCALED)))  # job.json rewritten
    job = store.get_job("daily.train-abc")
    assert job is not None
    assert job["initial_plan"] == INITIAL.model_dump()
    assert job["final_plan"] == SCALED.model_dump()
    assert [(p["state"], p["rule"], p["applied"]) for p in job["plans"]] == [
        ("initial", None, True),
        ("applied", "idle_ps", True),
        ("declined", "hot_ps", False),
    ]
    cpu = {n["node_id"]: n["cpu_used"] for n in job["nodes"]}
    assert cpu == {"ps-0": 0.9, "worker-0": 1.7, "worker-1": None}


def test_a_status_without_plans_or_profile_still_records_the_job(store: HistoryStore) -> None:
    """Today's status has neither: the plan history is the initial plan alone."""
    store.record_job(record_from_status(final_status(), spec_for(), dag_id="daily"))
    job = store.get_job("daily.train-abc")
    assert job is not None
    assert job["final_plan"] == INITIAL.model_dump()
    assert [(p["plan"], p["reason"], p["applied"]) for p in job["plans"]] == [
        (INITIAL.model_dump(), "initial plan", True)
    ]
    assert job["throughput"] == []
    assert {n["node_id"]: n["peak_memory_mb"] for n in job["nodes"]} == {
        "ps-0": None,
        "worker-0": None,
    }


def test_recording_the_same_job_again_replaces_it(store: HistoryStore) -> None:
    """A retry (or execute_complete run twice) upserts: one job row, children not doubled."""
    failed = {**final_status(plans=PLANS, profile=PROFILE), "state": "failed", "result": None}
    store.record_job(record_from_status(failed, spec_for(), try_number=1))
    first = store.get_job("daily.train-abc")
    assert first is not None and first["outcome"] == "failed"
    for _ in range(2):
        store.record_job(
            record_from_status(final_status(plans=PLANS, profile=PROFILE), spec_for(), try_number=2)
        )
    job = store.get_job("daily.train-abc")
    assert job is not None
    assert (job["outcome"], job["try_number"]) == ("succeeded", 2)
    assert job["recorded_at"] == first["recorded_at"] and job["updated_at"] >= job["recorded_at"]
    assert count(store, jobs) == 1
    assert (count(store, plans), count(store, throughput), count(store, nodes)) == (3, 2, 3)


def test_concurrent_records_of_one_job_leave_one_row(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    errors: list[BaseException] = []

    def record(i: int) -> None:
        try:
            with HistoryStore(url) as history:
                status = final_status(plans=PLANS, profile=PROFILE)
                history.record_job(record_from_status(status, spec_for(), try_number=i))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=record, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with HistoryStore(url) as history:
        assert count(history, jobs) == 1 and count(history, plans) == 3


def test_no_secret_is_ever_stored(store: HistoryStore, tmp_path: Path) -> None:
    status = final_status(plans=PLANS, profile=PROFILE)
    status["result"] = {**status["result"], "token": TOKEN, "auth": {"Authorization": TOKEN}}
    status["plans"] = [{**PLANS[0], "plan": {**INITIAL.model_dump(), "password": TOKEN}}]
    store.record_job(record_from_status(status, spec_for()))
    job = store.get_job("daily.train-abc")
    assert TOKEN not in json.dumps(job, default=str)
    assert TOKEN.encode() not in (tmp_path / "sub" / "history.db").read_bytes()


def test_jobs_are_listed_most_recent_first_and_filtered(store: HistoryStore) -> None:
    for i, (dag_id, state) in enumerate([("a", "succeeded"), ("b", "failed"), ("a", "stopped")]):
        status = {**final_status(f"job-{i}"), "state": state, "finished_at": 100.0 + i}
        store.record_job(record_from_status(status, spec_for(f"job-{i}"), dag_id=dag_id))
    assert [j["job_id"] for j in store.list_jobs()] == ["job-2", "job-1", "job-0"]
    assert [j["job_id"] for j in store.list_jobs(dag_id="a")] == ["job-2", "job-0"]
    assert [j["job_id"] for j in store.list_jobs(outcome="failed")] == ["job-1"]
    assert [c.job_id for c in store.candidates()] == ["job-0"]  # only successes warm-start


def test_a_tasks_failure_history_counts_its_ps_restarts_per_run(store: HistoryStore) -> None:
    """What the operator turns into the failure rate its checkpoint policy plans with: each
    past run of the task, how long it trained, on how many PS, how many PS restarts."""
    for i, ps_restarts in enumerate([2, 0]):
        status = final_status(f"job-{i}", finished_at=100.0 + i)
        status["result"] = {**status["result"], "plan": SCALED.model_dump()}
        status["nodes"] = [
            {**status["nodes"][0], "id": f"ps-{p}", "restarts": ps_restarts if p == 0 else 1}
            for p in range(2)
        ] + status["nodes"][1:]  # the worker's restart is not a PS failure
        store.record_job(
            record_from_status(status, spec_for(f"job-{i}", SCALED), dag_id="d", task_id="train")
        )
    other = final_status("job-other")
    store.record_job(record_from_status(other, spec_for("job-other"), dag_id="elsewhere"))
    runs = store.failure_history("d", "train")
    assert [(r.seconds, r.num_ps, r.ps_failures) for r in runs] == [(8.0, 2, 1), (8.0, 2, 3)]
    assert store.failure_history("nobody", "train") == []


# -- where the store lives -------------------------------------------------------------------
def test_the_default_store_is_sqlite_in_airflow_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    expected = f"sqlite:///{tmp_path / 'home' / 'rover' / 'history.db'}"
    assert default_history_url() == expected
    assert HistoryStoreHook().get_url() == expected
    assert HistoryStoreHook(None).test_connection()[0] is True
    assert (tmp_path / "home" / "rover" / "history.db").exists()


@pytest.mark.parametrize(
    ("connection", "url"),
    [
        (
            Connection(conn_id="c", conn_type="sqlite", host="/var/rover/h.db"),
            "sqlite:////var/rover/h.db",
        ),
        (
            Connection(conn_id="c", conn_type="sqlite", schema="/var/rover/h.db"),
            "sqlite:////var/rover/h.db",
        ),
        (
            Connection(
                conn_id="c",
                conn_type="postgres",
                host="db",
                login="u",
                password="p@ss",
                schema="hist",
                port=5432,
            ),
            "postgresql://u:p%40ss@db:5432/hist",
        ),
        (
            Connection(
                conn_id="c", conn_type="mysql", host="db", login="u", password="pw", schema="hist"
            ),
            "mysql://u:pw@db/hist",
        ),
        (
            Connection(
                conn_id="c",
                conn_type="rover_history",
                extra=json.dumps({"sqlalchemy_url": "sqlite:////tmp/r.db"}),
            ),
            "sqlite:////tmp/r.db",
        ),
        (
            Connection(
                conn_id="c",
                conn_type="rover_history",
                host="postgresql+psycopg2://db:5432/rover",
                login="rover",
                password="pw",
            ),
            "postgresql+psycopg2://rover:pw@db:5432/rover",
        ),
    ],
)
def test_connections_become_sqlalchemy_urls(connection: Connection, url: str) -> None:
    assert url_from_connection(connection) == url


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("postgresql://u:pw@db:5432/hist", "psycopg2"),  # SQLAlchemy 2.1 alone: psycopg 3
        ("postgres://u@db/hist", "psycopg2"),
        ("postgresql+psycopg2://u@db/hist", "psycopg2"),
    ],
)
def test_a_postgres_url_without_a_driver_opens_with_psycopg2(url: str, driver: str) -> None:
    """The driver installed with the project; no connection is opened here."""
    with HistoryStore(url) as store:
        assert store.engine.dialect.driver == driver
        assert store.url.get_backend_name() == "postgresql"


def test_a_history_connection_without_a_url_is_refused() -> None:
    with pytest.raises(ValueError, match="sqlalchemy_url"):
        url_from_connection(Connection(conn_id="c", conn_type="rover_history"))


def test_the_hook_reads_an_airflow_connection_and_hides_its_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_ROVER_HISTORY", f"sqlite:///{tmp_path / 'c.db'}")
    hook = HistoryStoreHook("rover_history")
    assert hook.get_url() == f"sqlite:///{tmp_path / 'c.db'}"
    ok, message = hook.test_connection()
    assert ok, message
    assert safe_url("postgresql://u:hunter22@db/x") == "postgresql://u:***@db/x"


# -- the training operator records its job ---------------------------------------------------
def operator_and_context(tmp_path: Path, **kwargs: Any) -> tuple[ElasticTrainingOperator, Any]:
    job_dir = tmp_path / "job"
    layout = JobDir(job_dir)
    layout.root.mkdir(parents=True)
    layout.write_spec(spec_for())
    (job_dir / "token").write_text(TOKEN)
    with DAG(dag_id="daily", schedule=None, start_date=datetime(2026, 1, 1)):
        operator = ElasticTrainingOperator(
            task_id="train",
            train_data="/data/train",
            output_dir=str(job_dir),
            export_saved_model=False,  # no model folder here (tests/integration exports)
            **kwargs,
        )
    ti = SimpleNamespace(
        dag_id="daily", task_id="train", run_id="manual__1", map_index=-1, try_number=1
    )
    return operator, {"ti": ti, "outlet_events": defaultdict(SimpleNamespace)}


def event(status: str, job: dict[str, Any]) -> dict[str, Any]:
    return {"status": status, "job_id": job["job_id"], "message": job["message"], "job": job}


def test_execute_complete_records_the_job_once_even_when_run_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    operator, context = operator_and_context(tmp_path)
    failed = {**final_status(), "state": "failed", "message": "worker-0 died", "result": None}
    with pytest.raises(AirflowException, match="worker-0 died"):
        operator.execute_complete(context, event("failed", failed))
    context["ti"].try_number = 2
    for _ in range(2):  # the retry's result, then the same result returned again
        result = operator.execute_complete(context, event("success", final_status()))
        assert result["samples_trained"] == 20_000
    with HistoryStore(default_history_url()) as history:
        rows = history.list_jobs()
        job = history.get_job("daily.train-abc")
    assert len(rows) == 1
    assert job is not None
    assert (job["outcome"], job["try_number"], job["run_id"]) == ("succeeded", 2, "manual__1")
    assert job["tables"] == [["a", 8, 100]] and job["dataset_samples"] == 10_000
    assert TOKEN.encode() not in (tmp_path / "home" / "rover" / "history.db").read_bytes()


def test_a_job_still_running_is_not_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``error`` event from the trigger while the job runs: nothing to record yet."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    operator, context = operator_and_context(tmp_path)
    running = {**final_status(), "state": "running", "message": "poll failed"}
    with pytest.raises(AirflowException):
        operator.execute_complete(context, event("error", running))
    with HistoryStore(default_history_url()) as history:
        assert history.list_jobs() == []


def test_a_broken_history_store_never_fails_the_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be")
    monkeypatch.setenv("AIRFLOW_CONN_BROKEN", f"sqlite:///{blocker}/sub/h.db")
    operator, context = operator_and_context(tmp_path, history_conn_id="broken")
    result = operator.execute_complete(context, event("success", final_status()))
    assert result["state"] == "succeeded"


def test_the_task_plans_checkpoints_with_the_failure_rate_of_its_past_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two past runs of 8 s on 2 PS with 3 PS failures in all: 32 PS-seconds over 3 failures
    and the prior's 1/2, so a PS of a 2-PS job fails every 32/3.5/2 s; a rate the user gave is
    kept."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    operator, context = operator_and_context(tmp_path)
    spec = spec_for()
    assert operator._with_failure_rate(context, spec) is spec  # no history: unchanged
    for i, ps_restarts in enumerate([2, 1]):
        status = final_status(f"job-{i}", finished_at=100.0 + i)
        status["result"] = {**status["result"], "plan": SCALED.model_dump()}
        status["nodes"] = [{**status["nodes"][0], "restarts": ps_restarts}]
        with HistoryStore(default_history_url()) as history:
            history.record_job(
                record_from_status(status, spec_for(f"job-{i}"), dag_id="daily", task_id="train")
            )
    planned = operator._with_failure_rate(context, spec_for(plan=SCALED))
    assert planned.checkpoint.mtbf_s == pytest.approx(32 / 3.5 / 2)
    given = spec_for().model_copy(
        update={"checkpoint": spec.checkpoint.model_copy(update={"mtbf_s": 99.0})}
    )
    assert operator._with_failure_rate(context, given).checkpoint.mtbf_s == 99.0


def test_one_clean_past_run_is_logged_as_the_little_evidence_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One past run of 10 s on 1 PS without a failure: the MTBF is twice that run (Jeffreys
    prior: 10 PS-seconds / (0 + 1/2)), not the run itself (on main: one failure counted, 10 s),
    and the log line says the evidence, the prior and the interval floor."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    operator, context = operator_and_context(tmp_path)
    status = final_status("job-0", finished_at=100.0)
    status["result"] = {**status["result"], "train_seconds": 10.0}
    with HistoryStore(default_history_url()) as history:
        history.record_job(
            record_from_status(status, spec_for("job-0"), dag_id="daily", task_id="train")
        )
        assert [r.seconds for r in history.failure_history("daily", "train")] == [10.0]
    with capture_logs() as logs:
        planned = operator._with_failure_rate(context, spec_for())
    assert planned.checkpoint.mtbf_s == pytest.approx(20.0)
    lines = [e["event"] % e.get("positional_args", ()) for e in logs]
    line = next(line for line in lines if "Failure rate" in line)
    print(line)
    assert "1 past run(s) trained 10.0 s (10 PS-seconds) with no PS failure" in line
    assert "a job on 1 PS expects a PS failure every 20.0 s" in line
    assert "Jeffreys prior" in line and "never shorter than max(30 s, 20 save pauses)" in line
