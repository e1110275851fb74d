"""A job's data workers count in its cluster budget beside its plan: a running job holds the
data workers its master reports running, a waiting job asks for those it starts with, the
arbiter, the registry, the operator's up-front check and the trigger all count them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

import pytest

from airflow_rover.core.budget_arbiter import allocate
from airflow_rover.core.cluster_budget import (
    RunningJob,
    data_worker_cap,
    data_workers_held,
    data_workers_request,
    running_job,
    waiting_row,
)
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.plans import PlanRecord
from airflow_rover.core.spec import ClusterBudget, DataWorkersConfig, JobSpec, ResourcePlan
from airflow_rover.history.budget_report import budget_report
from airflow_rover.history.registry import RunningJobRegistry
from airflow_rover.history.store import HistoryStore
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.hooks.history_store import default_history_url
from airflow_rover.operators.budget_admission import admission_request, check_fits_budget
from airflow_rover.triggers.admission import BudgetAdmissionTrigger
from airflow_rover.triggers.elastic_job import ElasticJobTrigger

NOW = 1_000_000.0
MB = 1024
DATA = DataWorkersConfig(mode="auto", count=2, min=0, max=4, cpu=1.0, memory_mb=2048)


def plan(workers: int) -> ResourcePlan:
    """``workers`` workers and one PS, 1 core and 1024 MB each."""
    return ResourcePlan(
        num_workers=workers,
        num_ps=1,
        worker_cpu=1.0,
        ps_cpu=1.0,
        worker_memory_mb=MB,
        ps_memory_mb=MB,
    )


def status(job_id: str, workers: int, data: dict[str, Any] | None) -> dict[str, Any]:
    st: dict[str, Any] = {
        "job_id": job_id,
        "state": "running",
        "plan": plan(workers).model_dump(),
        "progress": {"samples_done": 0, "samples_total": 10_000},
        "throughput": 100.0,
    }
    if data is not None:
        st["data_workers"] = data
    return st


def running(job_id: str, workers: int, data: tuple[float, float]) -> RunningJob:
    row = running_job(status(job_id, workers, None), [], "default", NOW)
    assert row is not None
    return RunningJob(**{**row.__dict__, "data_workers": data})


def test_a_running_job_holds_the_data_workers_its_master_reports() -> None:
    """``data_workers.running`` times the spec's size; a status without the section counts
    those the job starts with; a job without data workers (or whose spec is unknown) none."""
    reported = status("a", 2, {"mode": "auto", "target": 4, "running": 3})
    row = running_job(reported, [], "default", NOW, data_workers=DATA)
    assert row is not None and row.data_workers == (3.0, 6144.0)
    assert row.needs(row.plan) == (3.0 + 3.0, 3 * MB + 6144.0)
    assert data_workers_held(status("a", 2, None), DATA) == (2.0, 4096.0)  # DATA.start
    assert data_workers_held(status("a", 2, {"running": 0}), DATA) == (0.0, 0.0)
    assert data_workers_request(DataWorkersConfig()) == (0.0, 0.0)  # mode off
    no_spec = running_job(reported, [], "default", NOW)
    assert no_spec is not None and no_spec.data_workers == (0.0, 0.0)


def test_a_running_job_s_data_workers_leave_less_room_for_a_waiting_job() -> None:
    """10 cores: a running job holds 3 (its plan) + 5 (data workers); a waiting job's 3-core
    plan would fit beside the plan alone, not beside both."""
    waiting = waiting_row("b", ClusterBudget(cpu=10), plan(2), NOW, waiting_since=NOW)
    without = allocate([running("a", 2, (0.0, 0.0)), waiting], ClusterBudget(cpu=10), NOW)
    assert without.admitted_plan("b") == plan(2)
    decision = allocate([running("a", 2, (5.0, 0.0)), waiting], ClusterBudget(cpu=10), NOW)
    assert decision.admitted_plan("b") is None
    assert "has 2 cores left of 10 cores" in decision.admissions["b"].reason


def test_a_waiting_job_asks_for_the_data_workers_it_starts_with() -> None:
    """10 cores, 5 held: the waiting job's plan (3) fits, with 2 data workers (5) too, with
    3 (6) not; an admitted row holds them from then on."""
    held = running("a", 4, (0.0, 0.0))
    budget = ClusterBudget(cpu=10)
    for data, admitted in [((2.0, 0.0), True), ((3.0, 0.0), False)]:
        waiting = waiting_row("b", budget, plan(2), NOW, waiting_since=NOW, data_workers=data)
        decision = allocate([held, waiting], budget, NOW)
        assert decision.admissions["b"].admitted is admitted, data
    assert waiting.admitted(plan(2)).needs(plan(2)) == (6.0, 3 * MB)


def test_the_contested_greedy_counts_a_waiting_job_s_data_workers() -> None:
    """10 cores: a running job holds 3 and asks for +2; a waiting job needs 3 + 3 (data
    workers). Both would fit if the data workers were forgotten (3 + 2 + 3 = 8): only one may
    be chosen, and the budget is never overcommitted."""
    grower = running("a", 2, (0.0, 0.0))
    grower = RunningJob(**{**grower.__dict__, "proposal": PlanRecord(id=1, plan=plan(4))})
    waiting = waiting_row(
        "b", ClusterBudget(cpu=10), plan(2), NOW, waiting_since=NOW, data_workers=(3.0, 0.0)
    )
    decision = allocate([grower, waiting], ClusterBudget(cpu=10), NOW)
    chosen = decision.selected | {j for j, a in decision.admissions.items() if a.admitted}
    assert len(chosen) == 1, chosen
    assert decision.cpu_used <= 10


def test_the_registry_keeps_a_row_s_data_workers(tmp_path: Path) -> None:
    """Stored and read back (a row without them reads as none), and shown by ``rover budget``."""
    url = f"sqlite:///{tmp_path / 'history.db'}"
    now = time.time()
    starting = data_workers_request(DATA)
    row = waiting_row("b", ClusterBudget(), plan(2), now, waiting_since=now, data_workers=starting)
    holding = running("a", 2, (3.0, 6144.0))
    with RunningJobRegistry(HistoryStore(url)) as registry:
        registry.register(row)
        registry.register(RunningJob(**{**holding.__dict__, "updated_at": now}))
        registry.register(
            RunningJob(
                **{**holding.__dict__, "job_id": "c", "updated_at": now, "data_workers": (0.0, 0.0)}
            )
        )
        stored = {r.job_id: r for r in registry.jobs(now=now)}
        report = budget_report(registry, None)
    assert stored["b"].data_workers == starting == (2.0, 4096.0)
    assert stored["a"].data_workers == (3.0, 6144.0) and stored["c"].data_workers == (0.0, 0.0)
    print(report)
    assert "1 PS + data workers (3 cores, 6144 MB): 6 cores, 9216 MB" in report
    assert "1 PS: 3 cores, 3072 MB" in report  # job c


def test_the_operator_asks_for_the_data_workers_and_checks_they_can_fit() -> None:
    spec = JobSpec(
        job_id="j",
        train_data="/data/train",
        plan=plan(2),
        data_workers=DATA,
    )
    request = admission_request(spec, ClusterBudget(cpu=10), NOW, 1000.0, 60.0)
    assert request.data_workers == (2.0, 4096.0)
    check_fits_budget("task", spec, ClusterBudget(cpu=5))  # 3 + 2
    with pytest.raises(ValueError, match="the plan with its data workers needs 5 cores"):
        check_fits_budget("task", spec, ClusterBudget(cpu=4))
    trigger = BudgetAdmissionTrigger(
        "j", {"name": "default", "cpu": 10}, plan(2).model_dump(), NOW, data_workers=[2.0, 4096.0]
    )
    _, kwargs = trigger.serialize()
    assert kwargs["data_workers"] == [2.0, 4096.0]
    assert BudgetAdmissionTrigger(**kwargs).row(NOW).data_workers == (2.0, 4096.0)


def test_the_job_trigger_registers_the_data_workers_its_job_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The running job's row: the spec's size (read once from the job directory) times the
    status's running count; a directory without a spec counts none."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    job_dir = JobDir(tmp_path / "job")
    job_dir.root.mkdir()
    job_dir.write_spec(
        JobSpec(job_id="j", train_data="/data/train", plan=plan(2), data_workers=DATA)
    )
    budget = ClusterBudget(name="shared", cpu=10)
    trigger = ElasticJobTrigger(str(job_dir.root), cluster_budget=budget.model_dump())
    reported = status("j", 2, {"mode": "auto", "running": 3})
    caps = CapsTold()  # no proposal, no shrink: the job is only told its room
    asyncio.run(trigger._apply_within_budget(cast(ElasticJobHook, caps), reported, [], budget))
    assert caps.told == [4]  # 10 cores - 3 (plan) - 3 (data workers) = 4 more: max 4
    with RunningJobRegistry(HistoryStore(default_history_url())) as registry:
        row = {r.job_id: r for r in registry.jobs("shared", include_stale=True)}["j"]
    assert row.data_workers == (3.0, 6144.0) and row.plan == plan(2)
    missing = ElasticJobTrigger(str(tmp_path / "none"), cluster_budget=budget.model_dump())
    assert asyncio.run(missing._data_workers_of()) is None


class CapsTold:
    """Where the trigger tells the job its room for data workers (the master's API stands
    behind it in ``test_data_worker_room.py``)."""

    def __init__(self) -> None:
        self.told: list[int | None] = []

    async def async_cap_data_workers(self, cap: int | None) -> None:
        self.told.append(cap)


def test_auto_data_workers_grow_only_into_what_the_budget_has_left() -> None:
    """The job runs 3 data workers (1 core, 2048 MB each) beside a 3-core plan; the others'
    holdings and a waiting job's ask come first; never below ``min`` nor above ``max``."""
    budget = ClusterBudget(name="default", cpu=10)
    me = running("me", 2, (3.0, 6144.0))
    assert data_worker_cap([me], budget, me, DATA, NOW) == 4  # 4 cores left, max 4
    other = running("other", 1, (0.0, 0.0))  # 2 cores
    assert data_worker_cap([me, other], budget, me, DATA, NOW) == 4  # 3 + 2, max 4
    big = running("big", 3, (0.0, 0.0))  # 4 cores: nothing left
    assert data_worker_cap([me, big], budget, me, DATA, NOW) == 3  # only those it runs
    waits = waiting_row("next", budget, plan(1), NOW, NOW)  # asks for 2 cores
    assert data_worker_cap([me, other, waits], budget, me, DATA, NOW) == 3
    stale = RunningJob(**{**big.__dict__, "updated_at": NOW - 3600})
    assert data_worker_cap([me, stale], budget, me, DATA, NOW) == 4  # gone: not counted
    by_memory = ClusterBudget(name="default", memory_mb=3 * MB + 6144 + 2048)
    assert data_worker_cap([me], by_memory, me, DATA, NOW) == 4  # 2048 MB left: one more
    unlimited = ClusterBudget(name="default", cpu=None, memory_mb=None)
    assert data_worker_cap([me], unlimited, me, DATA, NOW) == DATA.max
    floor = DataWorkersConfig(mode="auto", min=2, max=4)
    crowded = running("me", 2, (0.0, 0.0))
    assert data_worker_cap([crowded, big, other], budget, crowded, floor, NOW) == 2
