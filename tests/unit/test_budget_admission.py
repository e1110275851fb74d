"""Admission to a shared cluster budget: waiting jobs and running jobs' scale-ups contested by
one weighted greedy, starting at the minimum plan, shrinking jobs of lower weight, and the
registry's ``admit`` (the reservation, the decisions it records)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from airflow.triggers.base import TriggerEvent

from airflow_rover.cli import main
from airflow_rover.core.budget_arbiter import allocate
from airflow_rover.core.cluster_budget import ADMITTED_TTL_S, RunningJob
from airflow_rover.core.plans import PlanRecord, PlanState
from airflow_rover.core.spec import AutoscaleConfig, ClusterBudget, JobSpec, ResourcePlan
from airflow_rover.history.registry import RunningJobRegistry
from airflow_rover.history.store import HistoryStore
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.hooks.history_store import default_history_url
from airflow_rover.operators.budget_admission import host_budget
from airflow_rover.operators.training import ElasticTrainingOperator
from airflow_rover.plugins.job_source import _rows, _waiting_reason
from airflow_rover.plugins.job_views import WAITING_FOR_BUDGET
from airflow_rover.triggers.admission import BudgetAdmissionTrigger
from airflow_rover.triggers.elastic_job import ElasticJobTrigger

NOW = 2_000_000.0
MB = 1024


def plan(workers: int, ps: int = 1) -> ResourcePlan:
    return ResourcePlan(
        num_workers=workers,
        num_ps=ps,
        worker_cpu=1.0,
        ps_cpu=1.0,
        worker_memory_mb=MB,
        ps_memory_mb=MB,
    )


def waiting(
    job_id: str,
    start: ResourcePlan,
    since: float = NOW,
    minimum: ResourcePlan | None = None,
    weight: float = 1.0,
    sps: float = 0.0,
    remaining: float = 100_000,
) -> RunningJob:
    return RunningJob(
        job_id=job_id,
        budget="default",
        plan=start,
        remaining_samples=remaining,
        samples_per_second=sps,
        updated_at=NOW,
        waiting=True,
        waiting_since=since,
        min_plan=minimum,
        weight=weight,
    )


def running(
    job_id: str,
    current: ResourcePlan,
    sps: float = 100.0,
    remaining: float = 100_000,
    proposed: ResourcePlan | None = None,
    minimum: ResourcePlan | None = None,
    weight: float = 1.0,
) -> RunningJob:
    return RunningJob(
        job_id=job_id,
        budget="default",
        plan=current,
        remaining_samples=remaining,
        samples_per_second=sps,
        updated_at=NOW,
        proposal=PlanRecord(id=1, plan=proposed) if proposed is not None else None,
        min_plan=minimum,
        weight=weight,
    )


def test_a_waiting_job_that_fits_is_admitted_with_its_plan() -> None:
    decision = allocate([running("r", plan(2)), waiting("w", plan(2))], ClusterBudget(cpu=6), NOW)
    assert decision.admitted_plan("w") == plan(2)
    assert decision.cpu_used == 6


def test_of_two_waiting_jobs_that_fit_one_the_first_in_line_starts() -> None:
    """Equal scores: the job that began to wait first is admitted, the other waits and is
    told what is left and what it needs."""
    late, early = waiting("a-late", plan(2), since=NOW - 5), waiting("z-early", plan(2), NOW - 9)
    decision = allocate([late, early, running("r", plan(1))], ClusterBudget(cpu=5), NOW)
    assert decision.admitted_plan("z-early") == plan(2)
    assert decision.admitted_plan("a-late") is None
    reason = decision.admissions["a-late"].reason
    assert "0 cores left of 5 cores" in reason and "its plan needs 3 cores" in reason
    assert decision.cpu_used == 5  # never more than the budget


def test_waiting_starts_and_scale_ups_are_ranked_together_by_re_times_wg() -> None:
    """With room for one: r's scale-up (+100 samples/s, 5.5 cost, 100k left at 200/s: RE*WG
    18.18 / 501 = 0.0363) against w's start (its peers' 50 samples/s per worker, 2.2 cost):
    a short w (5k left: 22.7 / 101 = 0.225) starts first, a long one (100k: 22.7 / 2001 =
    0.0114) waits behind the scale-up, as the job that ends sooner goes first."""
    grower = running("r", plan(2), sps=100, proposed=plan(4))  # +2 cores
    short = allocate([grower, waiting("w", plan(1), remaining=5_000)], ClusterBudget(cpu=5), NOW)
    assert short.admitted_plan("w") == plan(1)
    assert not short.allowed("r")
    assert "contested" in short.verdicts["r"].reason
    long = allocate([grower, waiting("w", plan(1))], ClusterBudget(cpu=5), NOW)
    assert long.allowed("r") and long.admitted_plan("w") is None
    assert long.admissions["w"].score == pytest.approx((50 / 2.2) / 2001)


def test_a_waiting_job_without_an_estimate_gets_its_peers_rate_per_worker() -> None:
    """Its gain is its workers at the running jobs' mean samples/s per worker: here 50."""
    decision = allocate(
        [running("r", plan(2), sps=100), waiting("w", plan(3))], ClusterBudget(cpu=4), NOW
    )
    score = decision.admissions["w"].score
    cost = 4 * 1.0 + 4 * 0.1  # 4 cores, 4 GB
    assert score == pytest.approx((150 / cost) / (100_000 / 150 + 1))


def test_a_job_that_may_start_smaller_starts_at_its_minimum_plan() -> None:
    budget = ClusterBudget(cpu=6)
    decision = allocate(
        [running("r", plan(3)), waiting("w", plan(3), minimum=plan(1))], budget, NOW
    )
    assert decision.admitted_plan("w") == plan(1)
    assert "starts at its minimum plan" in decision.admissions["w"].reason
    strict = allocate([running("r", plan(3)), waiting("w", plan(3))], budget, NOW)
    assert strict.admitted_plan("w") is None


def test_jobs_of_lower_weight_are_shrunk_for_a_heavier_waiting_job() -> None:
    """The heavy job needs 4 cores, 1 is left: the lighter jobs shrink to their minimum,
    lowest weight first, as far as needed; the job of equal weight is not touched."""
    light = running("light", plan(4), minimum=plan(1), weight=0.5)  # frees 3
    lighter = running("lighter", plan(3), minimum=plan(2), weight=0.2)  # frees 1
    equal = running("equal", plan(1), minimum=plan(1), weight=2.0)
    heavy = waiting("heavy", plan(3), weight=2.0)
    decision = allocate([light, lighter, equal, heavy], ClusterBudget(cpu=13), NOW)
    assert decision.admitted_plan("heavy") is None
    assert set(decision.shrinks) == {"lighter", "light"}
    assert decision.shrinks["light"].plan == plan(1)
    assert decision.shrinks["light"].for_job == "heavy"
    assert "shrinking light, lighter to make room" in decision.admissions["heavy"].reason
    # The shrunk jobs registered their smaller plans: now the heavy job starts.
    after = [replace(light, plan=plan(1)), replace(lighter, plan=plan(2)), equal, heavy]
    assert allocate(after, ClusterBudget(cpu=13), NOW).admitted_plan("heavy") == plan(3)


def test_no_job_is_shrunk_when_that_would_not_make_room() -> None:
    light = running("light", plan(2), minimum=plan(1), weight=0.5)  # frees 1, 4 are missing
    decision = allocate([light, waiting("heavy", plan(4), weight=2.0)], ClusterBudget(cpu=4), NOW)
    assert decision.shrinks == {}
    same = allocate([light, waiting("peer", plan(2))], ClusterBudget(cpu=4), NOW)
    assert same.shrinks == {}  # equal weight: nobody is shrunk


def test_a_plan_larger_than_the_whole_budget_says_so() -> None:
    decision = allocate([waiting("w", plan(8))], ClusterBudget(cpu=4, memory_mb=64 * MB), NOW)
    assert decision.admitted_plan("w") is None
    assert "needs 9 cores and 9216 MB, more than budget 'default' has" in (
        decision.admissions["w"].reason
    )


# -- the registry ----------------------------------------------------------------------------
@pytest.fixture
def registry(tmp_path: Path) -> Any:
    with RunningJobRegistry(HistoryStore(f"sqlite:///{tmp_path / 'history.db'}")) as reg:
        yield reg


def test_admit_reserves_the_plan_and_records_each_change_once(
    registry: RunningJobRegistry,
) -> None:
    budget = ClusterBudget(cpu=5)
    first = registry.admit(waiting("a", plan(2)), budget, now=NOW)
    assert first.admitted_plan("a") == plan(2)
    held = {r.job_id: r for r in registry.jobs(now=NOW)}["a"]
    assert not held.waiting and held.plan == plan(2) and held.ttl_s >= ADMITTED_TTL_S
    for t in (NOW, NOW + 1, NOW + 2):  # b waits on every poll; one decision row says so
        assert registry.admit(waiting("b", plan(2)), budget, now=t).admitted_plan("b") is None
    rows = {r.job_id: r for r in registry.jobs(now=NOW + 2)}
    assert rows["b"].waiting and rows["b"].holds is None
    registry.remove("a")  # a's job ended
    assert registry.admit(waiting("b", plan(2)), budget, now=NOW + 3).admitted_plan("b")
    log = [(d["job_id"], d["action"]) for d in registry.decisions("default")]
    assert log == [("a", "admit"), ("b", "wait"), ("b", "admit")]
    assert "left of 5 cores" in registry.decisions(job_id="b")[0]["reason"]


# -- the default budget ----------------------------------------------------------------------
def build(**kwargs: Any) -> ElasticTrainingOperator:
    with DAG(dag_id="admission_test", schedule=None, start_date=datetime(2026, 1, 1)):
        return ElasticTrainingOperator(task_id="train", train_data="/data/train", **kwargs)


def test_the_budget_is_on_by_default_and_says_which(monkeypatch: pytest.MonkeyPatch) -> None:
    """Local jobs share this host's memory; a configured ``[rover] cluster_budget`` wins;
    Kubernetes without one, approval mode and ``None`` have no budget."""
    monkeypatch.delenv("AIRFLOW__ROVER__CLUSTER_BUDGET", raising=False)
    local = build().rendered_cluster_budget()
    assert local == host_budget().model_dump(mode="json", exclude_none=True)
    assert local is not None and local["name"].startswith("host-") and local["memory_mb"] > 0
    assert build(cluster_budget=None).rendered_cluster_budget() is None
    approval = build(autoscale={"plan_approval": True})
    assert approval.rendered_cluster_budget() is None
    k8s = build(launcher="kubernetes", kubernetes={"image": "x", "job_volume_claim": "jobs"})
    assert k8s.rendered_cluster_budget() is None
    monkeypatch.setenv("AIRFLOW__ROVER__CLUSTER_BUDGET", '{"name": "prod", "cpu": 512}')
    assert k8s.rendered_cluster_budget() == {"name": "prod", "cpu": 512.0}
    monkeypatch.setenv("AIRFLOW__ROVER__CLUSTER_BUDGET", "{cpu: 1")
    with pytest.raises(AirflowFailException, match=r"\[rover\] cluster_budget is not JSON"):
        k8s.rendered_cluster_budget()


def test_admit_at_minimum_is_validated_with_the_other_autoscale_fields() -> None:
    with pytest.raises(ValueError, match="invalid autoscale: admit_at_minimum"):
        build(autoscale={"admit_at_minimum": "sometimes"})


# -- the operator's admission ----------------------------------------------------------------
JOB_DIR = Path("/jobs/x")
CONTEXT: Any = {
    "ti": SimpleNamespace(
        dag_id="admission_test",
        task_id="train",
        run_id="backfill__2026-01-01",
        map_index=-1,
        try_number=1,
    )
}


def spec_for(job_id: str, workers: int, **autoscale: Any) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        train_data="/data/train",
        plan=plan(workers),
        autoscale=AutoscaleConfig(**autoscale),
    )


def test_a_job_that_does_not_fit_defers_holding_nothing_until_admitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator asks the registry before launching: with room it goes on with the
    admitted plan; without it defers to ``BudgetAdmissionTrigger`` (its row holds nothing),
    which admits the job once the running one ends; ``execute_admitted`` takes that plan."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    budget = {"name": "shared", "cpu": 5}
    operator = build(cluster_budget=budget, poll_interval=0.05)
    first = operator._admitted(CONTEXT, JOB_DIR, spec_for("first", 2))
    assert first.plan == plan(2)
    with pytest.raises(TaskDeferred) as info:
        operator._admitted(CONTEXT, JOB_DIR, spec_for("second", 2))
    trigger = info.value.trigger
    assert isinstance(trigger, BudgetAdmissionTrigger)
    assert info.value.method_name == "execute_admitted"
    classpath, kwargs = trigger.serialize()
    assert BudgetAdmissionTrigger(**json.loads(json.dumps(kwargs))).serialize() == (
        classpath,
        kwargs,
    )
    with RunningJobRegistry(HistoryStore(default_history_url())) as reg:
        rows = {r.job_id: r for r in reg.jobs("shared")}
    assert rows["second"].waiting and rows["second"].holds is None
    assert rows["first"].holds == plan(2)
    # The waiting job is in the UI's list already, saying so and why.
    with HistoryStore(default_history_url()) as store:
        listed = {row.job_id: row for row in _rows(store, None, None)}
        reason = _waiting_reason(store, "second")
    assert listed["second"].state == WAITING_FOR_BUDGET and listed["second"].run_id == (
        "backfill__2026-01-01"
    )
    assert reason is not None and "left of 5 cores" in reason

    async def wait_for_admission() -> dict[str, Any]:
        events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
        try:
            pending = asyncio.ensure_future(anext(events))
            await asyncio.sleep(0.3)
            assert not pending.done()  # the budget is full: it waits
            with RunningJobRegistry(HistoryStore(default_history_url())) as reg:
                reg.remove("first")  # the first job ended
            return dict((await asyncio.wait_for(pending, 10)).payload)
        finally:
            await events.aclose()

    event = asyncio.run(wait_for_admission())
    assert event["status"] == "admitted" and event["plan"] == plan(2).model_dump()
    assert event["waited_s"] >= 0.3 and "left of 5 cores" in event["waited_for"]
    with pytest.raises(AirflowException, match="waiting for the cluster budget failed: boom"):
        operator.execute_admitted({}, {"status": "error", "message": "boom"})  # type: ignore[arg-type]
    resumed = build(cluster_budget=budget)
    resumed._admitted_plan = ResourcePlan.model_validate(event["plan"])
    assert resumed._admitted(CONTEXT, JOB_DIR, spec_for("second", 3)).plan == plan(
        2
    )  # the admitted plan


def test_a_plan_larger_than_the_budget_fails_the_task_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    operator = build(cluster_budget={"name": "small", "cpu": 4})
    with pytest.raises(AirflowFailException, match="more than cluster_budget 'small'"):
        operator._admitted(CONTEXT, JOB_DIR, spec_for("big", 6))
    smaller = operator._admitted(
        CONTEXT, JOB_DIR, spec_for("big", 6, admit_at_minimum=True, min_workers=2)
    )
    assert smaller.plan == plan(2)  # it may start with min_workers, and that fits


# -- shrinking a running job -----------------------------------------------------------------
class ShrinkableMaster:
    """The hook calls the running job's trigger makes: its status (running, light weight,
    4 workers, min_workers 1), request_plan and apply."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {
            "job_id": "light",
            "state": "running",
            "progress": {"samples_done": 0, "samples_total": 100_000},
            "throughput": 100.0,
            "plan": plan(4).model_dump(),
            "plans": [],
            "autoscale": {"weight": 0.5, "min_workers": 1},
        }
        self.requested: list[tuple[int | None, str]] = []

    async def async_get_status(self) -> dict[str, Any]:
        return json.loads(json.dumps(self.status))

    def request_plan(self, num_workers: int | None, num_ps: int | None, reason: str) -> PlanRecord:
        self.requested.append((num_workers, reason))
        return PlanRecord(id=7, plan=plan(num_workers or 4))

    async def async_apply_plan(self, plan_id: int) -> PlanRecord:
        self.status["plan"] = plan(self.requested[-1][0] or 4).model_dump()
        record = PlanRecord(id=plan_id, plan=plan(self.requested[-1][0] or 4))
        record.state = PlanState.APPLIED
        return record


class ShrinkTrigger(ElasticJobTrigger):
    master = ShrinkableMaster()

    def _hook(self) -> ElasticJobHook:
        return cast(ElasticJobHook, self.master)


def test_a_running_job_is_shrunk_for_a_heavier_waiting_job_which_then_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    budget = ClusterBudget(name="shared", cpu=6)
    master = ShrinkTrigger.master = ShrinkableMaster()
    heavy = replace(waiting("heavy", plan(2), weight=2.0), budget="shared", ttl_s=600)

    async def run_until_shrunk() -> None:
        trigger = ShrinkTrigger(
            "light", poll_interval=0.02, cluster_budget={"name": "shared", "cpu": 6}
        )
        events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
        with RunningJobRegistry(HistoryStore(default_history_url())) as reg:
            reg.register(replace(heavy, updated_at=time.time()))
        pending = asyncio.ensure_future(anext(events))
        try:
            for _ in range(200):
                if master.requested:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)  # a few more polls: the order is applied once
        finally:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending
            await events.aclose()

    asyncio.run(run_until_shrunk())
    assert [workers for workers, _ in master.requested] == [1]
    assert "for waiting job 'heavy' of weight 2" in master.requested[0][1]
    with RunningJobRegistry(HistoryStore(default_history_url())) as reg:
        held = {r.job_id: r for r in reg.jobs("shared")}
        assert held["light"].plan == plan(1)
        decision = reg.admit(replace(heavy, updated_at=time.time()), budget)
        assert decision.admitted_plan("heavy") == plan(2)
        actions = [(d["job_id"], d["action"]) for d in reg.decisions("shared")]
    assert ("light", "shrink") in actions and actions[-1] == ("heavy", "admit")


def test_rover_budget_shows_holders_waiters_and_decisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'history.db'}"
    with RunningJobRegistry(HistoryStore(url)) as reg:
        now = time.time()
        reg.admit(replace(waiting("a", plan(2)), updated_at=now), ClusterBudget(cpu=4), now)
        reg.admit(replace(waiting("b", plan(2)), updated_at=now), ClusterBudget(cpu=4), now)
    assert main(["budget", "--history-url", url, "--name", "default"]) == 0
    out = capsys.readouterr().out
    assert "default  a  holds 2 workers + 1 PS: 3 cores, 3072 MB" in out
    assert "default  b  waiting" in out and "for 2 workers + 1 PS (weight 1)" in out
    assert "last 2 decisions:" in out and "  b  wait: budget 'default' has 1 cores left" in out
