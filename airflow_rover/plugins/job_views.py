"""What the UI shows of a job, built from what is known of it: its launch (the index), its
status (the master's answer or its ``state.json``) and its history record once it ended.

Plain functions of plain data: no Airflow, no HTTP, no files; ``job_source`` reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_rover.core.optimizer import Budget
from airflow_rover.core.plans import PlanRecord, PlanState, plan_records
from airflow_rover.core.spec import ResourcePlan
from airflow_rover.history.launches import Launch
from airflow_rover.plugins.data_worker_views import DataWorkersPanel, data_workers_panel

RUNNING_STATES = frozenset(
    {"pending", "starting", "running", "recovering", "stopping", "unreachable"}
)
SHARD_STATES = ("todo", "doing", "done", "quarantined")
WAITING_FOR_BUDGET = "waiting for budget"  # deferred before launch: holds nothing yet
#: How a plan's state reads on the page (a proposal may wait on the budget or a person).
WAITING_FOR_BUDGET = "waiting for budget"
WAITING_FOR_APPROVAL = "waiting for approval"


@dataclass(frozen=True)
class JobRow:
    """One line of the jobs page."""

    job_id: str
    dag_id: str | None
    task_id: str | None
    run_id: str | None
    state: str
    policy: str | None
    plan: str
    samples_per_second: float | None
    auc: float | None
    duration_s: float | None
    started_at: float | None

    @property
    def running(self) -> bool:
        return self.state in RUNNING_STATES


@dataclass(frozen=True)
class PlanLine:
    """One entry of the plan timeline."""

    id: int
    at: float | None
    plan: str
    rule: str
    reason: str
    state: str
    note: str
    actionable: bool  # a person may approve or decline it here


@dataclass(frozen=True)
class BudgetShare:
    """The job's part of the cluster budget it shares, and what all its jobs hold."""

    name: str
    cpu: float | None
    memory_mb: float | None
    job_cpu: float
    job_memory_mb: float
    all_cpu: float
    all_memory_mb: float
    jobs: int


@dataclass(frozen=True)
class JobPage:
    """Everything the job page shows."""

    row: JobRow
    launch: Launch | None
    message: str
    samples_done: int
    samples_total: int
    shards: dict[str, int]
    throughput: list[tuple[float, float]]
    plans: list[PlanLine]
    nodes: list[dict[str, Any]]
    checkpoints: list[dict[str, Any]]
    recovery: dict[str, Any]
    budget: BudgetShare | None
    plan_approval: bool
    logs: dict[str, str] = field(default_factory=dict)
    data_workers: dict[str, Any] | None = None  # the status's section as is (the JSON API's)

    @property
    def data_workers_panel(self) -> DataWorkersPanel | None:
        return data_workers_panel(self.data_workers)


def plan_text(plan: Mapping[str, Any] | ResourcePlan | None) -> str:
    """``2 PS x 1 CPU, 2048 MB; 4 workers x 1 CPU, 2048 MB (ps-1 4 CPU, 2048 MB)``: a plan in
    a table cell, nodes sized apart in brackets."""
    if plan is None:
        return ""
    try:
        p = plan if isinstance(plan, ResourcePlan) else ResourcePlan.model_validate(plan)
    except ValueError:
        return ""
    return p.describe()


def job_row(
    launch: Launch | None, ended: Mapping[str, Any] | None, status: Mapping[str, Any] | None
) -> JobRow:
    """The jobs page's line of a job: the ended record wins over a status, a status over the
    launch alone (a job whose master has not written its state yet is ``pending``)."""
    status = status or {}
    ended = ended or {}
    result = status.get("result") or {}
    evaluation = status.get("evaluation") or {}
    job_id = (launch.job_id if launch else None) or str(ended.get("job_id") or "")
    return JobRow(
        job_id=job_id,
        dag_id=launch.dag_id if launch else ended.get("dag_id"),
        task_id=launch.task_id if launch else ended.get("task_id"),
        run_id=launch.run_id if launch else ended.get("run_id"),
        state=str(ended.get("outcome") or status.get("state") or "pending"),
        policy=(launch.checkpoint_policy if launch else None)
        or (status.get("recovery") or {}).get("checkpoint_policy"),
        plan=plan_text(ended.get("final_plan") or status.get("plan")),
        samples_per_second=_first(
            ended.get("samples_per_second"),
            result.get("samples_per_second"),
            status.get("throughput"),
        ),
        auc=_first(ended.get("auc"), result.get("auc"), evaluation.get("auc")),
        duration_s=_first(ended.get("duration_s"), status.get("duration_s")),
        started_at=_first(ended.get("started_at"), status.get("started_at"))
        or (launch.launched_at if launch else None),
    )


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def plan_lines(
    entries: Iterable[Any], budget_named: bool, approval: bool, running: bool
) -> list[PlanLine]:
    """The plan timeline, newest first; a pending proposal says what it waits for."""
    lines = []
    for record in plan_records(entries):
        state = str(record.state)
        pending = record.state is PlanState.PROPOSED and running
        if pending and approval:
            state = WAITING_FOR_APPROVAL
        elif pending and budget_named:
            state = WAITING_FOR_BUDGET
        lines.append(_line(record, state, actionable=pending and approval))
    return sorted(lines, key=lambda line: (line.at or 0.0, line.id), reverse=True)


def _line(record: PlanRecord, state: str, actionable: bool) -> PlanLine:
    return PlanLine(
        id=record.id,
        at=record.at,
        plan=plan_text(record.plan),
        rule=record.rule or "",
        reason=record.reason,
        state=state,
        note=record.note or "",
        actionable=actionable,
    )


def throughput_points(
    status: Mapping[str, Any], ended: Mapping[str, Any] | None
) -> list[tuple[float, float]]:
    """(time, samples/s) to draw: the master's history, else its profile's samples, else the
    samples the history store kept."""
    for points in (
        status.get("throughput_history"),
        (status.get("profile") or {}).get("throughput"),
        (ended or {}).get("throughput"),
    ):
        found = [
            (float(p["at"]), float(p["samples_per_second"]))
            for p in points or ()
            if isinstance(p, Mapping)
            and p.get("at") is not None
            and p.get("samples_per_second") is not None
        ]
        if found:
            return sorted(found)
    return []


def budget_share(
    budget: Mapping[str, Any] | None,
    job_id: str | None,
    job_plan: Mapping[str, Any] | None,
    held: Mapping[str, tuple[float, float]],
) -> BudgetShare | None:
    """The job's share of its cluster budget; ``held``: the (cores, MB) every registered job
    of the budget holds, its data workers included (this job's when it is registered; else
    its plan's)."""
    if not budget or not job_plan:
        return None
    own = held.get(job_id) if job_id else None
    cpu, memory = own or Budget.used(ResourcePlan.model_validate(job_plan))
    used = list(held.values())
    return BudgetShare(
        name=str(budget.get("name") or "default"),
        cpu=budget.get("cpu"),
        memory_mb=budget.get("memory_mb"),
        job_cpu=cpu,
        job_memory_mb=memory,
        all_cpu=sum(c for c, _ in used),
        all_memory_mb=sum(m for _, m in used),
        jobs=len(used),
    )


def job_page(
    launch: Launch | None,
    ended: Mapping[str, Any] | None,
    status: Mapping[str, Any] | None,
    held: Mapping[str, tuple[float, float]] | None = None,
    logs: Mapping[str, str] | None = None,
) -> JobPage:
    """The job page of a job, from what is known of it."""
    status = status or {}
    row = job_row(launch, ended, status)
    progress = status.get("progress") or {}
    recovery = dict(status.get("recovery") or (status.get("result") or {}).get("recovery") or {})
    shards = progress.get("shards") or {}
    approval = bool(status.get("plan_approval", launch.plan_approval if launch else False))
    budget = launch.cluster_budget if launch else None
    plans = status.get("plans") or (ended or {}).get("plans") or ()
    return JobPage(
        row=row,
        launch=launch,
        message=str(status.get("message") or (ended or {}).get("message") or ""),
        samples_done=int(progress.get("samples_done") or (ended or {}).get("samples_trained") or 0),
        samples_total=int(progress.get("samples_total") or 0),
        shards={state: int(shards.get(state) or 0) for state in SHARD_STATES},
        throughput=throughput_points(status, ended),
        plans=plan_lines(plans, budget is not None, approval, row.running),
        nodes=list(status.get("nodes") or (ended or {}).get("nodes") or ()),
        checkpoints=list(recovery.pop("checkpoint_history", None) or ()),
        recovery=recovery,
        budget=(
            budget_share(budget, row.job_id, status.get("plan"), held or {})
            if row.running
            else None
        ),
        plan_approval=approval,
        logs=dict(logs or {}),
        data_workers=_section(status.get("data_workers") or (ended or {}).get("data_workers")),
    )


def _section(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None
