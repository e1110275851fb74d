"""Sharing a cluster budget across concurrent jobs: the pure arbiter (weighted greedy by
RE * WG, worked by hand here), the registry of running jobs in the history database (upsert,
delete, TTL, decisions that reserve), the trigger applying only what the arbiter selects, and
the operator's ``cluster_budget`` parameter."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncGenerator
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred
from airflow.triggers.base import TriggerEvent

from airflow_rover.core.budget_arbiter import allocate
from airflow_rover.core.cluster_budget import (
    RunningJob,
    proposal_gain,
    running_job,
    ttl_for,
)
from airflow_rover.core.plans import PlanRecord, plan_records
from airflow_rover.core.spec import AutoscaleConfig, ClusterBudget, ResourcePlan
from airflow_rover.core.throughput import JobShape
from airflow_rover.history.registry import RunningJobRegistry
from airflow_rover.history.store import HistoryStore
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.hooks.history_store import default_history_url
from airflow_rover.master.autoscaler import Autoscaler
from airflow_rover.operators.training import ElasticTrainingOperator
from airflow_rover.triggers.elastic_job import ElasticJobTrigger

NOW = 1_000_000.0
MB = 1024  # every node below has 1 core and 1024 MB: cost = cores * 1.0 + GB * 0.1 (Prices())


def plan(workers: int, ps: int = 1, ps_memory_mb: int = MB) -> ResourcePlan:
    return ResourcePlan(
        num_workers=workers,
        num_ps=ps,
        worker_cpu=1.0,
        ps_cpu=1.0,
        worker_memory_mb=MB,
        ps_memory_mb=ps_memory_mb,
    )


def job(
    job_id: str,
    current: ResourcePlan,
    proposed: ResourcePlan | None,
    sps: float,
    remaining: float,
    gain: float | None = None,
    updated_at: float = NOW,
    proposal_id: int = 1,
) -> RunningJob:
    return RunningJob(
        job_id=job_id,
        budget="default",
        plan=current,
        remaining_samples=remaining,
        samples_per_second=sps,
        updated_at=updated_at,
        ttl_s=60.0,
        proposal=(
            PlanRecord(id=proposal_id, plan=proposed, expected_gain=gain) if proposed else None
        ),
    )


# Three jobs that each ask for more workers. By hand (RE = gain / cost of the proposed plan,
# WG = 1 / (remaining / (samples/s + gain) + 1)):
#   j1: 2w+1ps -> 4w+1ps, 100 samples/s, 100k left: gain 100 * (4/2 - 1) = 100 (estimated),
#       cost 5 cores + 5 GB * 0.1 = 5.5, RE 18.18, WG 1/(100000/200 + 1) = 1/501, RE*WG 0.03629
#   j2: 1w+1ps -> 3w+1ps, 50 samples/s, 10k left: gain 50 * (3/1 - 1) = 100 (estimated),
#       cost 4.4, RE 22.73, WG 1/(10000/150 + 1) = 1/67.67, RE*WG 0.3359
#   j3: 2w+1ps -> 3w+1ps, 200 samples/s, 1M left, the master's expected gain 150:
#       cost 4.4, RE 34.09, WG 1/(1e6/350 + 1) = 1/2858.1, RE*WG 0.01193
# They hold 3 + 2 + 3 = 8 cores and ask for +2, +2, +1.
J1 = job("j1", plan(2), plan(4), sps=100, remaining=100_000)
J2 = job("j2", plan(1), plan(3), sps=50, remaining=10_000)
J3 = job("j3", plan(2), plan(3), sps=200, remaining=1_000_000, gain=150)
SCORES = {
    "j1": (100 / 5.5) / (100_000 / 200 + 1),
    "j2": (100 / 4.4) / (10_000 / 150 + 1),
    "j3": (150 / 4.4) / (1_000_000 / 350 + 1),
}


# -- the pure arbiter ------------------------------------------------------------------------
def test_contested_scale_ups_go_by_re_times_wg() -> None:
    """11 cores: 3 free. Greedy by RE*WG: j2 (+2, 1 left), j1 (+2: no), j3 (+1: yes)."""
    decision = allocate([J1, J2, J3], ClusterBudget(cpu=11), NOW)
    assert decision.selected == {"j2", "j3"}
    for job_id, score in SCORES.items():
        assert decision.verdicts[job_id].score == pytest.approx(score)
    assert decision.verdicts["j1"].gain == pytest.approx(100)  # estimated from the workers
    assert decision.verdicts["j3"].gain == 150  # the master's own figure wins
    assert decision.cpu_used == 11
    assert "needs +2 cores, 0 cores left" in decision.verdicts["j1"].reason
    assert "rank 2 of 3" in decision.verdicts["j1"].reason


def test_wg_outranks_re_when_only_one_fits() -> None:
    """10 cores: 2 free. RE alone would take j3 (34.1) first; RE*WG takes j2, which will
    finish soonest, and then nothing else fits."""
    decision = allocate([J1, J2, J3], ClusterBudget(cpu=10), NOW)
    assert decision.selected == {"j2"}
    assert decision.cpu_used == 10


def test_a_budget_that_fits_everything_allows_every_proposal() -> None:
    """Every scale-up fits together: all go, even one with no estimable gain (a bigger PS)."""
    bigger_ps = job("j4", plan(2), plan(2, ps_memory_mb=4096), sps=100, remaining=5_000)
    assert proposal_gain(bigger_ps) == 0.0
    decision = allocate([J1, J2, J3, bigger_ps], ClusterBudget(cpu=64, memory_mb=65536), NOW)
    assert decision.selected == {"j1", "j2", "j3", "j4"}
    assert all("fits budget 'default'" in v.reason for v in decision.verdicts.values())
    unlimited = allocate([J1, J2, J3], ClusterBudget(memory_mb=10**9), NOW)
    assert unlimited.selected == {"j1", "j2", "j3"}


def test_scale_downs_are_always_allowed_and_free_room_for_others() -> None:
    """j4 (5 cores) drops to 3: allowed although the budget is full; its 2 cores go to the best
    scale-up (j2), and nothing is left for j1 or j3."""
    shrink = job("j4", plan(4), plan(2), sps=10, remaining=10**9)
    decision = allocate([J1, J2, J3, shrink], ClusterBudget(cpu=13), NOW)
    assert decision.selected == {"j4", "j2"}
    assert "always allowed" in decision.verdicts["j4"].reason
    overcommitted = allocate([J1, shrink], ClusterBudget(cpu=2), NOW)
    assert overcommitted.selected == {"j4"}  # still over budget: no scale-up, the shrink goes


def test_a_stale_row_is_ignored() -> None:
    """A job whose trigger stopped refreshing (updated 61 s ago, TTL 60 s) holds nothing and
    asks for nothing: the 6 free cores are j1's."""
    dead = job("dead", plan(40), plan(48), sps=1000, remaining=10, updated_at=NOW - 61)
    decision = allocate([dead, J1], ClusterBudget(cpu=8), NOW)
    assert decision.selected == {"j1"}
    assert "dead" not in decision.verdicts
    assert decision.cpu_used == 5
    alive = allocate(
        [job("dead", plan(40), None, 1, 1, updated_at=NOW - 59), J1], ClusterBudget(cpu=8), NOW
    )
    assert alive.selected == set()


def test_the_memory_limit_is_contested_too() -> None:
    """Only memory limited: 8 GB held, 11 GB budget: j2 (+2 GB) then j3 (+1 GB); j1 waits."""
    decision = allocate([J1, J2, J3], ClusterBudget(memory_mb=11 * MB), NOW)
    assert decision.selected == {"j2", "j3"}
    assert "needs +2048 MB" in decision.verdicts["j1"].reason


def test_a_jobs_weight_multiplies_its_priority() -> None:
    """10 cores, 2 free (as in the test above): by RE*WG alone j2 grows. j1 with
    ``autoscale.weight`` 10 scores 10 x 0.03629 = 0.3629 > j2's 0.3359: j1 grows instead, and
    its verdict says its weight is in the score."""
    heavy = replace(J1, weight=10.0)
    decision = allocate([heavy, J2, J3], ClusterBudget(cpu=10), NOW)
    assert decision.selected == {"j1"}
    assert decision.verdicts["j1"].score == pytest.approx(10 * SCORES["j1"])
    assert decision.verdicts["j2"].score == pytest.approx(SCORES["j2"])
    assert "weight 10 included" in decision.verdicts["j1"].reason
    assert "rank 1 of 3" in decision.verdicts["j1"].reason


def status(
    job_id: str,
    workers: int,
    proposed_workers: int | None,
    state: str = "running",
    sps: float = 100.0,
    done: int = 0,
    total: int = 100_000,
) -> dict[str, Any]:
    """A master's status with (optionally) one pending proposal for more workers."""
    current = plan(workers).model_dump()
    plans = []
    if proposed_workers is not None:
        plans.append(
            {
                "id": 1,
                "at": NOW,
                "plan": plan(proposed_workers).model_dump(),
                "previous": current,
                "rule": "idle_ps",
                "reason": "the PS idle",
                "state": "proposed",
            }
        )
    return {
        "job_id": job_id,
        "state": state,
        "message": "",
        "progress": {"samples_done": done, "samples_total": total},
        "throughput": sps,
        "plan": current,
        "plans": plans,
        "profile": {"throughput": []},
    }


def test_a_registry_row_from_a_masters_status() -> None:
    """samples/s: the newest profile sample under today's plan, else the master's rate;
    remaining = total - done; a proposal only while the job runs."""
    st = status("a", 2, 4, sps=80, done=30_000)
    st["profile"]["throughput"] = [
        {"plan": st["plan"], "samples_per_second": 120.0},
        {"plan": plan(1).model_dump(), "samples_per_second": 60.0},
    ]
    row = running_job(st, plan_records(st["plans"]), "default", NOW, ttl_for(5.0))
    assert row is not None and row.proposal is not None
    assert (row.samples_per_second, row.remaining_samples, row.ttl_s) == (120.0, 70_000, 60.0)
    assert proposal_gain(row) == pytest.approx(120.0)
    st["plans"][0]["expected_gain"] = 42.0
    with_gain = running_job(st, plan_records(st["plans"]), "default", NOW)
    assert with_gain is not None and proposal_gain(with_gain) == 42.0
    recovering_status = status("a", 2, 4, state="recovering")
    recovering = running_job(
        recovering_status, plan_records(recovering_status["plans"]), "default", NOW
    )
    assert recovering is not None and recovering.proposal is None
    assert running_job({"state": "absent"}, [], "default", NOW) is None
    assert ttl_for(30.0) == 90.0
    assert row.weight == 1.0  # a status without autoscale settings
    weighted = {**st, "autoscale": {"weight": 2.5, "enabled": True}}
    assert running_job(weighted, [], "default", NOW).weight == 2.5  # type: ignore[union-attr]


def test_the_master_keeps_one_proposal_pending_and_proposes_nothing_else() -> None:
    """While a proposal waits for the budget the master does not re-propose (or add others)."""
    autoscaler = Autoscaler(
        AutoscaleConfig(sampling_s=0, min_plan_interval_s=0), JobShape(512, 10.0, 1000.0, 16)
    )
    autoscaler.plans.append(PlanRecord(id=1, plan=ResourcePlan(), previous=ResourcePlan()))
    assert autoscaler.propose(NOW, plan(2), {}, {}, 1000) is None
    assert len(autoscaler.plans) == 1


# -- the registry in the history database ----------------------------------------------------
@pytest.fixture
def registry(tmp_path: Path) -> Any:
    with RunningJobRegistry(HistoryStore(f"sqlite:///{tmp_path / 'db' / 'history.db'}")) as reg:
        yield reg


def test_register_upserts_and_remove_deletes(registry: RunningJobRegistry) -> None:
    registry.register(J1)
    registry.register(J2)
    moved = RunningJob(**{**J1.__dict__, "plan": plan(4), "proposal": None})
    registry.register(moved)  # the same job again: its row is replaced
    rows = registry.jobs("default", now=NOW)
    assert [r.job_id for r in rows] == ["j1", "j2"]
    assert rows[0] == moved
    assert rows[1] == J2  # the proposal round-trips (id, plan, gain)
    assert registry.jobs("other", now=NOW) == []
    assert registry.remove("j1") is True
    assert registry.remove("j1") is False
    assert [r.job_id for r in registry.jobs(now=NOW)] == ["j2"]


def test_the_weight_round_trips_and_an_older_table_gains_its_column(tmp_path: Path) -> None:
    """A row keeps the job's weight; a registry table made before the weight existed gets the
    column on first use, and its rows read as weight 1."""
    url = f"sqlite:///{tmp_path / 'history.db'}"
    store = HistoryStore(url)
    with store.engine.begin() as conn:  # the table as the previous version created it
        conn.exec_driver_sql(
            "CREATE TABLE rover_running_jobs (job_id VARCHAR(200) PRIMARY KEY, budget VARCHAR(100)"
            " NOT NULL, plan JSON NOT NULL, proposal_id INTEGER, proposal_plan JSON, "
            "proposal_gain FLOAT, proposal_rule VARCHAR(50), remaining_samples FLOAT NOT NULL, "
            "samples_per_second FLOAT NOT NULL, ttl_s FLOAT NOT NULL, updated_at FLOAT NOT NULL)"
        )
        conn.exec_driver_sql(
            "INSERT INTO rover_running_jobs VALUES ('old', 'default', '{}', NULL, NULL, NULL, "
            f"NULL, 10, 1, 60, {NOW})".replace("'{}'", f"'{json.dumps(plan(1).model_dump())}'")
        )
    with RunningJobRegistry(store) as registry:
        registry.register(replace(J1, weight=4.0))
        rows = {r.job_id: r for r in registry.jobs("default", now=NOW)}
    assert rows["j1"].weight == 4.0 and rows["old"].weight == 1.0


def test_rows_past_their_ttl_are_ignored_then_purged(registry: RunningJobRegistry) -> None:
    registry.register(job("old", plan(40), None, 1, 1, updated_at=NOW - 61))
    registry.register(job("slow", plan(2), None, 1, 1, updated_at=NOW - 100))
    registry.register(RunningJob(**{**job("slow", plan(2), None, 1, 1).__dict__, "ttl_s": 300}))
    registry.register(J1)
    assert [r.job_id for r in registry.jobs("default", now=NOW)] == ["j1", "slow"]
    assert len(registry.jobs("default", now=NOW, include_stale=True)) == 3
    assert registry.purge(now=NOW) == 1
    assert [r.job_id for r in registry.jobs(now=NOW, include_stale=True)] == ["j1", "slow"]


def test_a_decision_reserves_the_selected_plan(registry: RunningJobRegistry) -> None:
    """j2 is decided first and selected: its row holds 3 workers at once, so j1 (deciding
    next, 1 core free of 8) waits although j1 alone would have fit."""
    budget = ClusterBudget(cpu=8)
    registry.register(J1)
    registry.register(J2)
    first = registry.decide(J2, budget, now=NOW)
    assert first.selected == {"j2"}  # 5 held, +2 and +2 asked: j2 ranks first
    rows = {r.job_id: r for r in registry.jobs(now=NOW)}
    assert rows["j2"].plan == plan(3) and rows["j2"].proposal is None
    second = registry.decide(J1, budget, now=NOW)
    assert not second.allowed("j1")
    assert "1 cores left" in second.verdicts["j1"].reason
    assert registry.decide(J1, ClusterBudget(cpu=10), now=NOW).allowed("j1")


def test_concurrent_decisions_never_overcommit(tmp_path: Path) -> None:
    """Eight triggers, each with its own engine, register at once on a new database (schema
    created in the race), then decide at once: 8 cores free, +2 each: the four with the
    fewest samples left (highest WG) grow, whoever decides first."""
    url = f"sqlite:///{tmp_path / 'history.db'}"
    jobs = [job(f"j{i}", plan(2), plan(4), 100, 10_000 * (i + 1)) for i in range(8)]
    budget, chosen, errors = ClusterBudget(cpu=8 * 3 + 8), [], []
    registered = threading.Barrier(len(jobs))

    def decide(j: RunningJob) -> None:
        try:
            with RunningJobRegistry(HistoryStore(url)) as reg:
                reg.register(j)
                registered.wait(10)
                if reg.decide(j, budget, now=NOW).allowed(j.job_id):
                    chosen.append(j.job_id)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=decide, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(chosen) == ["j0", "j1", "j2", "j3"]
    with RunningJobRegistry(HistoryStore(url)) as reg:
        held = sum(r.plan.num_workers + r.plan.num_ps for r in reg.jobs(now=NOW))
    assert held == 32


# -- the trigger -----------------------------------------------------------------------------
class FakeMaster:
    """Just the two hook calls the trigger makes: the status (running with a pending proposal
    for more workers from the second poll, succeeded after ``polls``) and apply."""

    def __init__(self, job_id: str, workers: int, to: int, remaining: int, polls: int = 5):
        self.job_id, self.polls, self.seen = job_id, polls, 0
        self.status = status(job_id, workers, None, total=remaining)
        self.proposal = status(job_id, workers, to)["plans"][0]
        self.applied: list[int] = []
        self.barrier: asyncio.Barrier | None = None

    async def async_get_status(self) -> dict[str, Any]:
        self.seen += 1
        if self.seen in (2, 3) and self.barrier is not None:
            await self.barrier.wait()  # every trigger finished its previous poll
        if self.seen == 2:  # the proposal appears; the triggers register it, then decide
            self.status["plans"] = [self.proposal]
        if self.seen > self.polls:
            return {**self.status, "state": "succeeded"}
        return json.loads(json.dumps(self.status))

    async def async_apply_plan(self, plan_id: int) -> PlanRecord:
        assert plan_id == self.proposal["id"] and self.proposal["state"] == "proposed"
        self.applied.append(plan_id)
        self.proposal.update(state="applied")
        self.status["plan"] = self.proposal["plan"]
        return PlanRecord.model_validate(self.proposal)


class FakeTrigger(ElasticJobTrigger):
    masters: dict[str, FakeMaster] = {}

    def _hook(self) -> ElasticJobHook:
        return cast(ElasticJobHook, self.masters[self.job_dir])


def run_jobs(masters: list[FakeMaster], budget: dict[str, Any]) -> list[str]:
    """Run one trigger per fake job until every job ends; the event statuses."""
    FakeTrigger.masters = {m.job_id: m for m in masters}

    async def go() -> list[str]:
        barrier = asyncio.Barrier(len(masters))
        for m in masters:
            m.barrier = barrier

        async def one(m: FakeMaster) -> str:
            trigger = FakeTrigger(m.job_id, poll_interval=0.02, cluster_budget=budget)
            events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
            try:
                return str((await asyncio.wait_for(anext(events), 10)).payload["status"])
            finally:
                await events.aclose()

        return await asyncio.gather(*(one(m) for m in masters))

    return asyncio.run(go())


@pytest.mark.parametrize(("cpu", "applied"), [(8, {"soon"}), (16, {"soon", "late"})])
def test_the_trigger_applies_only_what_the_arbiter_selects(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    cpu: int,
    applied: set[str],
) -> None:
    """Two jobs of 3 cores each ask for +2. With 8 cores only the one that finishes sooner
    (higher WG, same RE) grows, and the other logs that it waits; with 16 both grow. The rows
    leave the registry when the jobs end."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    late = FakeMaster("late", workers=2, to=4, remaining=1_000_000)
    soon = FakeMaster("soon", workers=2, to=4, remaining=10_000)
    events = run_jobs([late, soon], {"name": "shared", "cpu": cpu})
    assert events == ["success", "success"]
    assert {m.job_id for m in (late, soon) if m.applied} == applied
    assert all(len(m.applied) <= 1 for m in (late, soon))
    logged = capsys.readouterr().out  # the triggers' log lines (structlog writes to stdout)
    waiting = [line for line in logged.splitlines() if "waiting for the cluster" in line]
    if "late" in applied:
        assert waiting == []
    else:
        assert len(waiting) == 1  # once per proposal, not on every poll
        assert (
            "Plan 1 (idle_ps: the PS idle): waiting for the cluster budget 'shared'" in (waiting[0])
        )
        assert late.proposal["state"] == "proposed"  # left to the master, still pending
    with RunningJobRegistry(HistoryStore(default_history_url())) as reg:
        assert reg.jobs(include_stale=True) == []


def test_without_a_budget_the_trigger_touches_no_registry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    trigger = ElasticJobTrigger("/jobs/a")
    assert "cluster_budget" not in trigger.serialize()[1]
    assert not (tmp_path / "rover").exists()


def test_the_budget_survives_serialization() -> None:
    trigger = ElasticJobTrigger(
        "/jobs/a", cluster_budget={"cpu": 64}, history_conn_id="rover_history"
    )
    classpath, kwargs = trigger.serialize()
    stored = json.loads(json.dumps(kwargs))
    assert stored["cluster_budget"] == {"name": "default", "cpu": 64.0, "memory_mb": None}
    assert stored["history_conn_id"] == "rover_history"
    assert ElasticJobTrigger(**stored).serialize() == (classpath, kwargs)


def test_an_unreachable_registry_applies_nothing_and_fails_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be")
    monkeypatch.setenv("AIRFLOW_CONN_BROKEN", f"sqlite:///{blocker}/sub/h.db")
    master = FakeMaster("only", workers=1, to=2, remaining=100, polls=3)
    FakeTrigger.masters = {"only": master}
    master.status["plans"] = [master.proposal]

    async def go() -> str:
        trigger = FakeTrigger(
            "only", poll_interval=0.01, cluster_budget={"cpu": 100}, history_conn_id="broken"
        )
        events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
        try:
            return str((await asyncio.wait_for(anext(events), 10)).payload["status"])
        finally:
            await events.aclose()

    assert asyncio.run(go()) == "success"
    assert master.applied == []


# -- the operator ----------------------------------------------------------------------------
def build(**kwargs: Any) -> ElasticTrainingOperator:
    with DAG(dag_id="budget_test", schedule=None, start_date=datetime(2026, 1, 1)):
        return ElasticTrainingOperator(task_id="train", train_data="/data/train", **kwargs)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"cpu": 0}, "greater than 0"),
        ({"cpu": 8, "gpus": 1}, "gpus"),
        ({"name": "a b", "cpu": 8}, "name"),
        ({"name": "shared"}, "needs a limit: cpu, memory_mb or both"),
        ("big", "dict or ClusterBudget"),
        ({"cpu": "{{ params.cpu }}", "memory_mb": -1}, "memory_mb"),
    ],
)
def test_a_bad_cluster_budget_fails_at_parse_time(value: Any, expected: str) -> None:
    with pytest.raises(ValueError, match="cluster_budget") as info:
        build(cluster_budget=value)
    assert expected in str(info.value)
    assert "ElasticTrainingOperator(task_id='train')" in str(info.value)


def test_the_cluster_budget_is_templated_and_reaches_the_trigger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert "cluster_budget" in ElasticTrainingOperator.template_fields
    assert build().cluster_budget == "auto"
    assert build(cluster_budget=None).cluster_budget is None
    assert build(cluster_budget=ClusterBudget(cpu=8)).cluster_budget == {
        "name": "default",
        "cpu": 8.0,
        "memory_mb": None,
    }
    operator = build(cluster_budget="{{ params.budget }}", history_conn_id="rover_history")
    operator.cluster_budget = '{"name": "shared", "cpu": 32, "memory_mb": 65536}'  # rendered
    monkeypatch.setattr(
        operator,
        "hook_for",
        lambda _: SimpleNamespace(
            get_status=lambda: {"state": "running", "job_id": "x"}, get_deadline=lambda: None
        ),
    )
    with pytest.raises(TaskDeferred) as info:
        operator.poll_until_complete("/jobs/x", {})  # type: ignore[arg-type]
    trigger = info.value.trigger
    assert isinstance(trigger, ElasticJobTrigger)
    assert trigger.cluster_budget == ClusterBudget(name="shared", cpu=32, memory_mb=65536)
    assert trigger.history_conn_id == "rover_history"
    operator.cluster_budget = "{}"
    with pytest.raises(AirflowFailException, match="needs a limit"):
        operator.rendered_cluster_budget()
