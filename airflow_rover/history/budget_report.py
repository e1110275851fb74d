"""A cluster budget in words: who holds what, who waits, and the arbiter's latest decisions
(``rover budget``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from airflow_rover.core.cluster_budget import RunningJob
from airflow_rover.core.spec import ResourcePlan
from airflow_rover.history.registry import RunningJobRegistry


def budget_report(registry: RunningJobRegistry, budget: str | None, last: int = 20) -> str:
    """The fresh rows of ``budget`` (every budget: None) and its ``last`` decisions."""
    now = time.time()
    lines = []
    for job in registry.jobs(budget, now=now):
        if job.waiting:
            since = now - (job.waiting_since or job.updated_at)
            lines.append(
                f"{job.budget}  {job.job_id}  waiting {since:.0f} s for "
                f"{_plan(job.plan)}{_data(job)} (weight {job.weight:g})"
            )
        else:
            cpu, memory_mb = job.needs(job.plan)
            lines.append(
                f"{job.budget}  {job.job_id}  holds {_plan(job.plan)}{_data(job)}: {cpu:g} cores, "
                f"{memory_mb:g} MB (weight {job.weight:g}, {job.samples_per_second:.0f} samples/s)"
            )
    if not lines:
        lines.append(
            "no job holds or waits for " + (f"budget {budget!r}" if budget else "a budget")
        )
    decisions = registry.decisions(budget)[-last:] if last > 0 else []
    if decisions:
        lines.append("")
        lines.append(f"last {len(decisions)} decisions:")
    for d in decisions:
        at = datetime.fromtimestamp(d["at"], UTC).strftime("%Y-%m-%d %H:%M:%S")
        lines.append(f"{at}  {d['job_id']}  {d['action']}: {d['reason']}")
    return "\n".join(lines)


def _plan(plan: ResourcePlan) -> str:
    return f"{plan.num_workers} workers + {plan.num_ps} PS"


def _data(job: RunningJob) -> str:
    """What the job's data workers hold (or need) beside its plan, if anything."""
    cpu, memory_mb = job.data_workers
    return f" + data workers ({cpu:g} cores, {memory_mb:g} MB)" if cpu or memory_mb else ""
