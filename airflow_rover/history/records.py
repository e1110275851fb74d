"""What the history store keeps of one job, built from the job's final status (no database here).

The master's status carries the job's state, result, nodes and, when the master records them,
``plans`` (every proposed or applied plan, as ``core.plans.PlanRecord``) and ``profile``
(throughput samples, peak memory per node, and what the autoscaler ``measured``: scaling costs
and hot share). Both are optional: a status without them gives
a record whose plan history is the initial plan alone. A job with data workers adds its
``data_workers`` section (the last figures and the scaling decisions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_rover.core.plans import PlanRecord, PlanState, plan_records
from airflow_rover.core.spec import FeatureConfig, JobSpec, ResourcePlan
from airflow_rover.core.warm_start import JobTraits

#: Keys never stored, at any depth of a stored JSON value (the job token above all).
SECRET_KEYS = ("token", "password", "secret", "authorization")
OUTCOMES = ("succeeded", "failed", "stopped")
#: What the autoscaler measured that a similar job's prior starts from (``measured_of``).
MEASURED = ("worker_start_s", "ps_start_s", "ps_reload_s", "hot_share")
MAX_COST_S = 86_400.0  # a scaling cost beyond a day is no measurement (AutoscalePrior's bound)


@dataclass(frozen=True)
class JobRecord:
    """One finished (or ended) job as the history store keeps it."""

    job_id: str
    model: str
    outcome: str
    initial_plan: dict[str, Any]
    final_plan: dict[str, Any]
    dag_id: str | None = None
    task_id: str | None = None
    run_id: str | None = None
    map_index: int = -1
    try_number: int | None = None
    features: FeatureConfig | None = None
    dataset_samples: int | None = None
    train_data: str | None = None
    training: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    started_at: float | None = None
    finished_at: float | None = None
    duration_s: float | None = None
    samples_trained: int | None = None
    samples_per_second: float | None = None
    train_seconds: float | None = None
    auc: float | None = None
    logloss: float | None = None
    result: dict[str, Any] = field(default_factory=dict)
    plans: list[dict[str, Any]] = field(default_factory=list)  # at, plan, rule, reason, ...
    throughput: list[dict[str, Any]] = field(default_factory=list)  # at, plan, sps, step ms
    nodes: list[dict[str, Any]] = field(default_factory=list)  # id, role, ..., peak memory
    # the status's data_workers section but its decisions (None: the job had none) ...
    data_workers: dict[str, Any] | None = None
    # ... and its decisions: at, previous, count, rule, reason
    data_worker_decisions: list[dict[str, Any]] = field(default_factory=list)
    # what its autoscaler measured itself (``MEASURED``; a key absent: not measured)
    measured: dict[str, float] = field(default_factory=dict)

    @property
    def traits(self) -> JobTraits:
        return JobTraits.of(
            self.model, self.features, self.dataset_samples, self.dag_id, self.task_id
        )


def scrub(value: Any) -> Any:
    """A copy of a JSON value without any key that names a secret (``SECRET_KEYS``)."""
    if isinstance(value, Mapping):
        return {
            str(k): scrub(v)
            for k, v in value.items()
            if not any(word in str(k).lower() for word in SECRET_KEYS)
        }
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    return value


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def number_or_none(value: Any) -> float | None:
    """A number a status or record holds (a bool or a string is none)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def int_or_none(value: Any) -> int | None:
    number = number_or_none(value)
    return None if number is None else int(number)


def plan_row(record: PlanRecord) -> dict[str, Any]:
    """A plan record as a row of the history's plan table."""
    return {
        "at": record.at,
        "plan": record.plan.model_dump(),
        "rule": record.rule,
        "reason": record.reason,
        "state": str(record.state),
        "applied": record.applied,
    }


def initial_plan(records: list[PlanRecord], spec: JobSpec) -> ResourcePlan:
    """The plan the job was launched with: the plan its first proposal started from, else the
    spec's (the master rewrites ``job.json`` when it applies a plan)."""
    if records and records[0].previous is not None:
        return records[0].previous
    return spec.plan


def _plan_history(
    job: Mapping[str, Any], records: list[PlanRecord], initial: ResourcePlan
) -> list[PlanRecord]:
    """The initial plan, then every plan the master proposed (applied or not)."""
    first = PlanRecord(
        at=number_or_none(job.get("started_at")),
        plan=initial,
        reason="initial plan",
        state=PlanState.INITIAL,
    )
    if records and records[0].plan == initial and records[0].applied:
        return records  # the status lists the initial plan itself
    return [first, *records]


def _throughput(profile: Mapping[str, Any]) -> list[dict[str, Any]]:
    samples = profile.get("throughput")
    if not isinstance(samples, list):
        return []
    return [
        {
            "at": number_or_none(s.get("at")),
            "plan": scrub(dict(s["plan"])) if isinstance(s.get("plan"), Mapping) else None,
            "samples_per_second": number_or_none(s.get("samples_per_second")),
            "step_time_ms": number_or_none(s.get("step_time_ms")),
            "worker_busy": number_or_none(s.get("worker_busy")),
            "ps_busy": number_or_none(s.get("ps_busy")),
        }
        for s in samples
        if isinstance(s, Mapping)
    ]


def _nodes(job: Mapping[str, Any], profile: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One entry per node seen in the status or the memory profile, with its peak memory."""
    peaks = _mapping(profile.get("peak_memory_mb"))
    cpu = _mapping(profile.get("cpu_used"))
    nodes: dict[str, dict[str, Any]] = {}
    for node in job.get("nodes") or []:
        if isinstance(node, Mapping) and node.get("id"):
            nodes[str(node["id"])] = {
                "node_id": str(node["id"]),
                "role": node.get("role"),
                "steps": int_or_none(node.get("steps")),
                "samples": int_or_none(node.get("samples")),
                "step_time_ms": number_or_none(node.get("step_time_ms")),
                "restarts": int_or_none(node.get("restarts")),
                "exit_code": int_or_none(node.get("exit_code")),
            }
    for node_id in sorted({*peaks, *cpu}, key=str):
        entry = nodes.setdefault(
            str(node_id), {"node_id": str(node_id), "role": str(node_id).split("-")[0]}
        )
        entry["peak_memory_mb"] = number_or_none(peaks.get(node_id))
        entry["cpu_used"] = number_or_none(cpu.get(node_id))
    return list(nodes.values())


#: What the record keeps of the ``data_workers`` section, besides its decisions.
DATA_WORKER_FIELDS = {
    "mode": str,
    "target": int,
    "running": int,
    "min": int,
    "max": int,
    "input_wait": float,
    "ready_fill": float,
    "samples_per_s": float,
}


def data_workers_of(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The status's ``data_workers`` section but its decisions, each value as its column
    holds it (None where missing or not a value of that kind); None without a section."""
    section = job.get("data_workers")
    if not isinstance(section, Mapping):
        return None
    out: dict[str, Any] = {}
    for name, kind in DATA_WORKER_FIELDS.items():
        value = section.get(name)
        if kind is str:
            out[name] = str(value)[:10] if value is not None else None
        else:
            number = number_or_none(value)
            out[name] = None if number is None else kind(number)
    return out


def data_worker_decisions(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The data workers' scaling decisions in the order the master made them."""
    decisions = _mapping(job.get("data_workers")).get("decisions")
    return [
        {
            "at": number_or_none(d.get("at")),
            "previous": int_or_none(d.get("previous")),
            "count": int_or_none(d.get("count")),
            "rule": str(d.get("rule") or "")[:50],
            "reason": str(d.get("reason") or ""),
        }
        for d in (decisions if isinstance(decisions, list) else ())
        if isinstance(d, Mapping)
    ]


def measured_of(profile: Mapping[str, Any]) -> dict[str, float]:
    """What the job's autoscaler measured itself (the profile's ``measured``: scaling costs
    in seconds, hot share in [0, 1]), not what it planned with: a cost it never timed was a
    default or a past job's, and recording it would pass that on as a measurement."""
    measured = _mapping(profile.get("measured"))
    found = {name: number_or_none(measured.get(name)) for name in MEASURED}
    return {
        name: value
        for name, value in found.items()
        if value is not None and 0 <= value <= (1.0 if name == "hot_share" else MAX_COST_S)
    }


def final_plan(job: Mapping[str, Any], spec: JobSpec, plans: list[PlanRecord]) -> dict[str, Any]:
    """The plan the job ended with: the last plan the master applied, else the result's
    plan, else the status's, else the spec's."""
    applied = [p.plan for p in plans if p.state == PlanState.APPLIED]
    if applied:
        return applied[-1].model_dump()
    result = _mapping(job.get("result"))
    for plan in (result.get("plan"), job.get("plan")):
        if isinstance(plan, Mapping):
            return dict(scrub(plan))
    return spec.plan.model_dump()


def outcome_of(state: Any) -> str:
    state = str(state or "").lower()
    return state if state in OUTCOMES else "failed"


def record_from_status(
    job: Mapping[str, Any],
    spec: JobSpec,
    *,
    features: FeatureConfig | None = None,
    dag_id: str | None = None,
    task_id: str | None = None,
    run_id: str | None = None,
    map_index: int = -1,
    try_number: int | None = None,
) -> JobRecord:
    """Build the record of a job from its final status and its spec (``features``: the
    resolved feature config; default the spec's)."""
    result, profile, progress = (_mapping(job.get(k)) for k in ("result", "profile", "progress"))
    records = plan_records(job.get("plans"))
    initial = initial_plan(records, spec)
    plans = _plan_history(job, records, initial)
    total = int_or_none(progress.get("samples_total"))
    epochs = spec.training.epochs
    dataset = total // epochs if total else None
    return JobRecord(
        job_id=str(job.get("job_id") or spec.job_id),
        model=spec.model,
        outcome=outcome_of(job.get("state")),
        initial_plan=initial.model_dump(),
        final_plan=final_plan(job, spec, plans),
        dag_id=dag_id,
        task_id=task_id,
        run_id=run_id,
        map_index=map_index,
        try_number=try_number,
        features=features or spec.features,
        dataset_samples=dataset,
        train_data=spec.train_data,
        training=spec.training.model_dump(),
        message=str(job.get("message") or "")[:4000],
        started_at=number_or_none(job.get("started_at")),
        finished_at=number_or_none(job.get("finished_at")),
        duration_s=number_or_none(job.get("duration_s")),
        samples_trained=int_or_none(result.get("samples_trained")),
        samples_per_second=number_or_none(result.get("samples_per_second")),
        train_seconds=number_or_none(result.get("train_seconds")),
        auc=number_or_none(result.get("auc")),
        logloss=number_or_none(result.get("logloss")),
        result=scrub(dict(result)),
        plans=[plan_row(p) for p in plans],
        throughput=_throughput(profile),
        nodes=_nodes(job, profile),
        data_workers=data_workers_of(job),
        data_worker_decisions=data_worker_decisions(job),
        measured=measured_of(profile),
    )
