"""Which cluster budget a training task shares, and what it asks of it before it launches.

``cluster_budget="auto"`` (the operator's default) resolves here:

1. ``[rover] cluster_budget`` in the Airflow configuration (JSON, e.g.
   ``{"name": "prod", "cpu": 512, "memory_mb": 2097152}``), a deployment's shared budget;
2. else, with the local launcher, this host: a budget named ``host-<hostname>`` limited to
   the host's memory. Every job of every DAG on the host then starts only when its plan's
   memory fits beside the running ones (cores are time-shared by the processes; memory is
   not);
3. else (Kubernetes without a configured budget) none: the cluster's size is not known here.

A job whose plans wait for a person's approval (``autoscale.plan_approval``) takes no default
budget: the arbiter would not apply its plans.
"""

from __future__ import annotations

import json
import os
import re
import socket
from typing import Any

from airflow_rover.core.cluster_budget import (
    RunningJob,
    data_workers_request,
    waiting_row,
    with_fewest_workers,
)
from airflow_rover.core.optimizer import Budget
from airflow_rover.core.spec import AutoscaleConfig, ClusterBudget, JobSpec, ResourcePlan

AUTO_BUDGET = "auto"


def default_cluster_budget(launcher: str, autoscale: AutoscaleConfig) -> dict[str, Any] | None:
    """The budget ``cluster_budget="auto"`` stands for (see the module docstring)."""
    if autoscale.plan_approval:
        return None
    configured = _configured()
    if configured is not None:
        return configured
    if launcher == "local":
        return host_budget().model_dump(mode="json", exclude_none=True)
    return None


def _configured() -> dict[str, Any] | None:
    from airflow.configuration import conf

    raw = conf.get("rover", "cluster_budget", fallback=None)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"[rover] cluster_budget is not JSON: {exc}") from None
    return ClusterBudget.model_validate(value).model_dump(mode="json", exclude_none=True)


def host_budget() -> ClusterBudget:
    """This host's memory, as a budget named after the host."""
    name = re.sub(r"[^\w.:-]", "-", socket.gethostname())[:90] or "localhost"
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    return ClusterBudget(name=f"host-{name}", memory_mb=int(memory_mb))


def minimum_plan(spec: JobSpec) -> ResourcePlan | None:
    """The plan the job may start at when its own does not fit (``autoscale.
    admit_at_minimum``): its plan with ``autoscale.min_workers`` workers; None otherwise."""
    if not spec.autoscale.admit_at_minimum:
        return None
    return with_fewest_workers(spec.plan, spec.autoscale.min_workers)


def admission_request(
    spec: JobSpec, budget: ClusterBudget, now: float, remaining_samples: float, ttl_s: float
) -> RunningJob:
    """The waiting row the job registers before it launches."""
    return waiting_row(
        spec.job_id,
        budget,
        spec.plan,
        now,
        waiting_since=now,
        min_plan=minimum_plan(spec),
        weight=spec.autoscale.weight,
        remaining_samples=remaining_samples,
        ttl_s=ttl_s,
        data_workers=data_workers_request(spec.data_workers),
    )


def check_fits_budget(owner: str, spec: JobSpec, budget: ClusterBudget) -> None:
    """ValueError when even the job's smallest starting plan, with the data workers it starts
    with, exceeds the whole budget: it would wait forever."""
    plan = minimum_plan(spec) or spec.plan
    cpu, memory_mb = Budget.used(plan)
    data_cpu, data_memory_mb = data_workers_request(spec.data_workers)
    cpu, memory_mb = cpu + data_cpu, memory_mb + data_memory_mb
    over = []
    if budget.cpu is not None and cpu > budget.cpu:
        over.append(f"{cpu:g} cores (the budget has {budget.cpu:g})")
    if budget.memory_mb is not None and memory_mb > budget.memory_mb:
        over.append(f"{memory_mb:g} MB (the budget has {budget.memory_mb})")
    if over:
        raise ValueError(
            f"{owner}: the plan{' with its data workers' if data_cpu else ''} needs "
            f"{' and '.join(over)}: more than cluster_budget "
            f"{budget.name!r} holds, so it could never start; lower plan (or allow starting "
            "smaller with autoscale.admit_at_minimum and min_workers), or raise the budget"
        )
