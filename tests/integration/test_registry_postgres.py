"""The history store and the cluster budget's registry on a real PostgreSQL server (Debian's
``postgresql``, ``tests/pg_server.py``), where triggers on many hosts share them: the schema
and every row round-trip, deciders in separate processes never grant more than the budget
(on SQLite too, for comparison), and an Airflow connection leads the hook there."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from budget_deciders import BASE, GROWN, Answer, job_at, run_rounds, used
from pg_server import PostgresServer
from sqlalchemy import inspect

from airflow_rover.core.spec import ClusterBudget, FeatureConfig, TableConfig
from airflow_rover.core.warm_start import JobTraits
from airflow_rover.history.records import JobRecord
from airflow_rover.history.registry import RunningJobRegistry
from airflow_rover.history.store import HistoryStore
from airflow_rover.hooks.history_store import HistoryStoreHook

pytestmark = pytest.mark.integration

FEATURES = FeatureConfig(
    num_dense=13, tables=(TableConfig(name="a", column="C1", vocab_size=100, dim=8),)
)
DECIDERS = 4
ROUNDS = 25
# Four jobs hold BASE (2 cores, 2048 MB each) and each asks for one more worker (+1 core,
# +1024 MB): the cores would admit three, the memory admits two.
BUDGET = ClusterBudget(name="shared", cpu=8 + 3, memory_mb=4 * 2048 + 2 * 1024)
GRANTS = 2


def a_record(job_id: str) -> JobRecord:
    return JobRecord(
        job_id=job_id,
        model="dlrm",
        outcome="succeeded",
        initial_plan=BASE.model_dump(),
        final_plan=GROWN.model_dump(),
        dag_id="daily",
        task_id="train",
        run_id="r1",
        features=FEATURES,
        dataset_samples=20_000,
        samples_per_second=123.5,
        train_seconds=60.0,
        finished_at=time.time(),
        plans=[{"at": 1.0, "plan": BASE.model_dump(), "state": "initial", "applied": True}],
        throughput=[{"at": 2.0, "plan": BASE.model_dump(), "samples_per_second": 123.5}],
        nodes=[{"node_id": "ps-0", "role": "ps", "restarts": 2, "peak_memory_mb": 812.5}],
    )


def test_the_store_and_the_registry_round_trip_on_postgres(postgres_url: str) -> None:
    """Both create their tables on a fresh PostgreSQL database; a job record (JSON columns,
    child rows) and registry rows read back as written; a decision reserves its plan."""
    began = time.perf_counter()
    with HistoryStore(postgres_url) as store:
        store.record_job(a_record("daily.train-1"))
        store.record_job(a_record("daily.train-1"))  # the upsert: still one job
        job = store.get_job("daily.train-1")
        assert job is not None
        assert job["final_plan"] == GROWN.model_dump() and job["tables"] == [["a", 8, 100]]
        assert [n["node_id"] for n in job["nodes"]] == ["ps-0"]
        assert [j["job_id"] for j in store.list_jobs(dag_id="daily")] == ["daily.train-1"]
        assert [f.ps_failures for f in store.failure_history("daily", "train")] == [2]
        traits = JobTraits.of("dlrm", FEATURES, 20_000, "daily", "train")
        assert [m.job.job_id for m in store.similar_jobs(traits)] == ["daily.train-1"]
        tables = set(inspect(store.engine).get_table_names())
    assert {"rover_jobs", "rover_job_plans", "rover_job_nodes"} <= tables

    with RunningJobRegistry(HistoryStore(postgres_url)) as registry:
        asking = job_at("job-a", BASE, 7)
        registry.register(job_at("job-b", BASE, None))
        registry.register(asking)
        rows = registry.jobs("shared")
        assert [r.job_id for r in rows] == ["job-a", "job-b"] and rows[0] == asking
        decision = registry.decide(asking, BUDGET)
        assert decision.allowed("job-a"), decision.verdicts
        held = {r.job_id: r.plan for r in registry.jobs("shared")}
        assert held == {"job-a": GROWN, "job-b": BASE}
        assert registry.remove("job-a") and not registry.remove("job-a")
        tables = set(inspect(registry.engine).get_table_names())
    assert {"rover_running_jobs", "rover_budget_locks"} <= tables
    print(f"round trip on postgres: {time.perf_counter() - began:.2f} s")


@pytest.fixture(params=["postgresql", "sqlite"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database that every decider process opens by URL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database(f"deciders_{uuid.uuid4().hex[:8]}")


def test_concurrent_deciders_never_grant_more_than_the_budget(shared_url: str) -> None:
    """Four processes (four hosts' triggers, each with its own connections) create the schema
    at once, then in every round ask at the same instant to grow their job by one worker.
    The memory admits exactly two: every round exactly two are granted, whoever asks first;
    what the granted plans hold fits the budget; every decision is answered, and every granted
    plan is reserved in its job's row (and no other is)."""
    seconds: list[float] = []
    cpu, memory = BUDGET.cpu or 0.0, BUDGET.memory_mb or 0

    def check(number: int, answers: list[Answer], registry: RunningJobRegistry) -> None:
        assert [a.error for a in answers] == [None] * DECIDERS, answers
        assert sorted(a.job_id for a in answers) == [f"job-{i}" for i in range(DECIDERS)]
        assert all(a.round == number for a in answers)
        granted = {a.job_id for a in answers if a.allowed}
        holds = [used(GROWN if a.job_id in granted else BASE) for a in answers]
        assert sum(c for c, _ in holds) <= cpu and sum(m for _, m in holds) <= memory, granted
        assert len(granted) == GRANTS, (number, answers)  # no lost grant, no extra one
        assert all(a.cpu_used <= cpu and a.memory_mb_used <= memory for a in answers)
        rows = {r.job_id: r.plan for r in registry.jobs("shared")}
        assert rows == {a.job_id: GROWN if a.allowed else BASE for a in answers}
        seconds.extend(a.seconds for a in answers)

    began = time.perf_counter()
    run_rounds(shared_url, BUDGET, DECIDERS, ROUNDS, check)
    backend = shared_url.split(":", 1)[0]
    seconds.sort()
    print(
        f"{backend}: {DECIDERS} deciders x {ROUNDS} rounds in {time.perf_counter() - began:.2f} s;"
        f" decide median {seconds[len(seconds) // 2] * 1000:.1f} ms, "
        f"slowest {seconds[-1] * 1000:.1f} ms"
    )


def test_an_airflow_connection_leads_the_hook_to_postgres(
    postgres_server: PostgresServer, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``postgres`` connection (URI in an env var) and a ``rover_history`` one (the URL in
    its host, the password in its own field) both resolve to the server's database; the hook
    records a job through each and reads it back."""
    server = postgres_server
    database = postgres_url.rsplit("/", 1)[1]
    where = f"{server.host}:{server.port}/{database}"
    monkeypatch.setenv(
        "AIRFLOW_CONN_ROVER_PG", f"postgres://{server.user}:{server.password}@{where}"
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_ROVER_HISTORY_PG",
        json.dumps(
            {
                "conn_type": "rover_history",
                "host": f"postgresql+psycopg2://{server.user}@{where}",
                "password": server.password,
            }
        ),
    )
    expected = {
        "rover_pg": f"postgresql://{server.user}:{server.password}@{where}",
        "rover_history_pg": postgres_url,
    }
    for conn_id, url in expected.items():
        hook = HistoryStoreHook(conn_id)
        assert hook.get_url() == url
        ok, message = hook.test_connection()
        assert ok, message
        hook.record_job(a_record(f"via.{conn_id}"))
        with hook.get_conn() as store:
            assert store.url.get_backend_name() == "postgresql"
            assert store.get_job(f"via.{conn_id}") is not None
