"""``ElasticJobTrigger``: poll a job's master until the job ends or reaches a milestone.

It carries only a pointer to the job (its directory) and polling settings; everything else lives
with the master. Re-created after a triggerer restart, it simply polls the same job again.
Every ending is an event with the keys ``status`` (success / failed / stopped / error),
``job_id``, ``message`` and ``job`` (the last status); unexpected errors become ``error`` events.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_rover.core.milestones import Milestone
from airflow_rover.core.states import JobState
from airflow_rover.hooks.elastic_job import ElasticJobHook

_EVENT_STATUS = {JobState.FAILED: "failed", JobState.STOPPED: "stopped"}


def job_event(status: str, job: dict[str, Any], message: str | None = None) -> dict[str, Any]:
    """The fixed event shape shared by the trigger and the operators' check-before-defer."""
    return {
        "status": status,
        "job_id": job.get("job_id"),
        "message": message if message is not None else job.get("message", ""),
        "job": job,
    }


class ElasticJobTrigger(BaseTrigger):
    """Wait until the job in ``job_dir`` reaches ``milestone`` (default: it succeeded), applying
    the resource plans the job's optimizer proposes on the way (``apply_plans``)."""

    def __init__(
        self,
        job_dir: str,
        poll_interval: float = 5.0,
        milestone: dict[str, Any] | None = None,
        stop_on_kill: bool = False,
        apply_plans: bool = True,
    ) -> None:
        super().__init__()
        self.job_dir = job_dir
        self.poll_interval = poll_interval
        self.milestone = Milestone.model_validate(milestone or {})
        self.stop_on_kill = stop_on_kill
        self.apply_plans = apply_plans

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_dir": self.job_dir,
                "poll_interval": self.poll_interval,
                "milestone": self.milestone.model_dump(mode="json"),
                "stop_on_kill": self.stop_on_kill,
                "apply_plans": self.apply_plans,
            },
        )

    def _hook(self) -> ElasticJobHook:
        return ElasticJobHook(self.job_dir)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self._hook()
        try:
            while True:
                job = await hook.async_get_status()
                if self.milestone.reached(job):
                    yield TriggerEvent(job_event("success", job))
                    return
                missed = self.milestone.missed(job)
                if missed is not None:
                    status = _EVENT_STATUS.get(JobState(job["state"]), "failed")
                    yield TriggerEvent(job_event(status, job, f"{missed}: {job.get('message')}"))
                    return
                if self.apply_plans:
                    await self._apply_proposed(hook, job)
                self.log.info(
                    "Job %s: %s, %s samples, %s samples/s",
                    job.get("job_id", self.job_dir),
                    job.get("state"),
                    (job.get("progress") or {}).get("samples_done", 0),
                    job.get("throughput", 0),
                )
                await asyncio.sleep(self.poll_interval)
        except Exception as exc:  # report, never crash the triggerer
            self.log.exception("Polling job %s failed", self.job_dir)
            yield TriggerEvent(job_event("error", {"job_id": None}, f"{type(exc).__name__}: {exc}"))

    async def _apply_proposed(self, hook: ElasticJobHook, job: dict[str, Any]) -> None:
        """Apply the plan the job's optimizer proposed (applying twice is a no-op there)."""
        for plan in job.get("plans") or []:
            if plan.get("state") == "proposed":
                record = await hook.async_apply_plan(int(plan["id"]))
                self.log.info(
                    "Plan %s (%s: %s): %s%s",
                    plan["id"],
                    plan.get("rule"),
                    plan.get("reason"),
                    record.get("state"),
                    f" ({record['note']})" if record.get("note") else "",
                )

    async def on_kill(self) -> None:
        """The user marked the task failed/success or cleared it: stop the job, orphan nothing."""
        if self.stop_on_kill:
            await self._hook().async_stop("the Airflow task was killed by a user")
