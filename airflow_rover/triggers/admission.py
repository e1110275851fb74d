"""``BudgetAdmissionTrigger``: a job waits here, before anything launches, until its cluster
budget admits it.

The task is deferred meanwhile, so a waiting job holds no worker slot and no cluster
resources: only a row in the registry (``history.registry``) that asks for its plan. On each
poll the trigger asks the arbiter (``core.budget_arbiter``, through ``registry.admit``); once
admitted the row holds the admitted plan and the event ``{"status": "admitted", "plan": ...,
"reason": ..., "waited_s": ..., "waited_for": ...}`` resumes the task in ``execute_admitted``,
which logs them (this trigger's own log file is replaced by the job trigger's, on the same
triggerer) and launches the job with that plan. An unreachable registry only delays the
admission; the row of a trigger that is gone lapses after its TTL. Safe to re-create:
everything it needs is in its arguments.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_rover.core.cluster_budget import RunningJob, ttl_for, waiting_row
from airflow_rover.core.spec import ClusterBudget, ResourcePlan
from airflow_rover.history.registry import RunningJobRegistry
from airflow_rover.history.store import HistoryStore
from airflow_rover.hooks.history_store import HistoryStoreHook


class BudgetAdmissionTrigger(BaseTrigger):
    """Wait until ``cluster_budget`` admits job ``job_id`` with ``plan`` (or ``min_plan``,
    when given: the job may start at it)."""

    def __init__(
        self,
        job_id: str,
        cluster_budget: dict[str, Any],
        plan: dict[str, Any],
        waiting_since: float,
        history_conn_id: str | None = None,
        min_plan: dict[str, Any] | None = None,
        weight: float = 1.0,
        remaining_samples: float = 0.0,
        poll_interval: float = 5.0,
        data_workers: list[float] | tuple[float, float] = (0.0, 0.0),
    ) -> None:
        super().__init__()
        self.job_id = job_id
        self.cluster_budget = ClusterBudget.model_validate(cluster_budget)
        self.plan = ResourcePlan.model_validate(plan)
        self.min_plan = ResourcePlan.model_validate(min_plan) if min_plan else None
        self.waiting_since = waiting_since
        self.history_conn_id = history_conn_id
        self.weight = weight
        self.remaining_samples = remaining_samples
        self.poll_interval = poll_interval
        cpu, memory_mb = data_workers  # what the data workers it starts with need
        self.data_workers = (float(cpu), float(memory_mb))
        self._said: str | None = None  # the gist of the last reason logged
        self._reason: str | None = None  # why the job waited, on the last poll

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_id": self.job_id,
                "cluster_budget": self.cluster_budget.model_dump(mode="json"),
                "plan": self.plan.model_dump(),
                "waiting_since": self.waiting_since,
                "history_conn_id": self.history_conn_id,
                "min_plan": self.min_plan.model_dump() if self.min_plan else None,
                "weight": self.weight,
                "remaining_samples": self.remaining_samples,
                "poll_interval": self.poll_interval,
                "data_workers": list(self.data_workers),
            },
        )

    def row(self, now: float) -> RunningJob:
        """The job's registry row: waiting, holding nothing, asking for its plan."""
        return waiting_row(
            self.job_id,
            self.cluster_budget,
            self.plan,
            now,
            waiting_since=self.waiting_since,
            min_plan=self.min_plan,
            weight=self.weight,
            remaining_samples=self.remaining_samples,
            ttl_s=ttl_for(self.poll_interval),
            data_workers=self.data_workers,
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        registry: RunningJobRegistry | None = None
        try:
            url = await HistoryStoreHook(self.history_conn_id or None).async_get_url()
            registry = RunningJobRegistry(HistoryStore(url))
            while True:
                now = time.time()
                try:
                    decision = await asyncio.to_thread(
                        registry.admit, self.row(now), self.cluster_budget, now
                    )
                except Exception as exc:  # the registry is down: keep waiting
                    self._say(f"the job registry is unavailable ({type(exc).__name__}: {exc})")
                else:
                    admission = decision.admissions.get(self.job_id)
                    if admission is not None and admission.plan is not None:
                        self.log.info(
                            "Admitted to cluster budget %r after %.0f s: %s",
                            self.cluster_budget.name,
                            now - self.waiting_since,
                            admission.reason,
                        )
                        yield TriggerEvent(
                            {
                                "status": "admitted",
                                "job_id": self.job_id,
                                "plan": admission.plan.model_dump(),
                                "reason": admission.reason,
                                "waited_s": round(now - self.waiting_since, 1),
                                "waited_for": self._reason,
                            }
                        )
                        return
                    self._say(admission.reason if admission is not None else "not decided")
                await asyncio.sleep(self.poll_interval)
        except Exception as exc:  # report, never crash the triggerer
            self.log.exception("Waiting for cluster budget %r failed", self.cluster_budget.name)
            yield TriggerEvent(
                {
                    "status": "error",
                    "job_id": self.job_id,
                    "message": f"{type(exc).__name__}: {exc}",
                }
            )
        finally:
            if registry is not None:
                registry.close()

    def _say(self, reason: str) -> None:
        """Log why the job waits, when that changes (not on every poll)."""
        self._reason = reason
        gist = reason.split(";")[0]
        if gist != self._said:
            self.log.info(
                "Job %s waits for cluster budget %r, holding nothing: %s",
                self.job_id,
                self.cluster_budget.name,
                reason,
            )
        self._said = gist

    async def on_kill(self) -> None:
        """The user killed the waiting task: its row leaves the registry at once."""
        url = await HistoryStoreHook(self.history_conn_id or None).async_get_url()
        with RunningJobRegistry(HistoryStore(url)) as registry:
            await asyncio.to_thread(registry.remove_waiting, self.job_id)
