"""``ElasticJobTrigger``: poll a job's master until the job ends or reaches a milestone.

It carries only a pointer to the job (its directory) and polling settings; everything else lives
with the master. Re-created after a triggerer restart, it simply polls the same job again.
Every ending is an event with the keys ``status`` (success / failed / stopped / error),
``job_id``, ``message``, ``job`` (the last status) and ``failure`` (set when no retry can fix
the job); unexpected errors become ``error`` events.

The training task's trigger (``stop_on_kill``: it owns the job) also keeps a Kubernetes job's
objects: it recreates a missing Service or Secret when it starts and deletes the master pod (and
so everything the pod owns) once the job has ended (``docs/kubernetes.md``).

With a ``cluster_budget`` the trigger shares that budget with the jobs of other tasks and DAGs:
on each poll it registers its job in the registry (``history.registry``, in the history store's
database) and applies its master's proposal only when the cluster arbiter
(``core.budget_arbiter``) selects it; otherwise the proposal stays proposed, waiting. When the
arbiter shrinks the job for a waiting job of higher weight, the trigger asks the master for
the smaller plan and applies it.

With ``stream_logs`` it passes the new lines of the master's and the nodes' logs into the task's
log on each poll, prefixed by node and bounded (``hooks.node_logs``), and once more after the
job ended (so its last words are there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_rover.core.cluster_budget import (
    RunningJob,
    Shrink,
    Verdict,
    data_worker_cap,
    running_job,
    ttl_for,
)
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.job_status import progress_line, without_history
from airflow_rover.core.milestones import Milestone
from airflow_rover.core.plans import PlanRecord, PlanState, plan_records
from airflow_rover.core.spec import ClusterBudget, DataWorkersConfig
from airflow_rover.core.states import TERMINAL_STATES, JobState
from airflow_rover.history.registry import RunningJobRegistry
from airflow_rover.history.store import HistoryStore
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.hooks.history_store import HistoryStoreHook
from airflow_rover.hooks.node_logs import NodeLogStream

_EVENT_STATUS = {JobState.FAILED: "failed", JobState.STOPPED: "stopped"}


def job_event(status: str, job: dict[str, Any], message: str | None = None) -> dict[str, Any]:
    """The fixed event shape shared by the trigger and the operators' check-before-defer;
    ``failure``: the job's failure when no retry can fix it (``retryable`` false), else None.
    ``job`` is the status without its lists over time (``core.job_status.without_history``:
    tens of KB in a long job, which the event would carry into Airflow's database for
    nothing: the task's result and record read neither, and both stay in ``state.json``)."""
    return {
        "status": status,
        "job_id": job.get("job_id"),
        "message": message if message is not None else job.get("message", ""),
        "job": without_history(job),
        "failure": job.get("failure"),
    }


class ElasticJobTrigger(BaseTrigger):
    """Wait until the job in ``job_dir`` reaches ``milestone`` (default: it succeeded), applying
    the resource plans the job's optimizer proposes on the way (``apply_plans``), within
    ``cluster_budget`` when one is given (shared through the history store of
    ``history_conn_id``), passing the job's new log lines into this log with
    ``stream_logs``."""

    def __init__(
        self,
        job_dir: str,
        poll_interval: float = 5.0,
        milestone: dict[str, Any] | None = None,
        stop_on_kill: bool = False,
        apply_plans: bool = True,
        cluster_budget: dict[str, Any] | None = None,
        history_conn_id: str | None = None,
        stream_logs: bool = False,
    ) -> None:
        super().__init__()
        self.job_dir = job_dir
        self.poll_interval = poll_interval
        self.milestone = Milestone.model_validate(milestone or {})
        self.stop_on_kill = stop_on_kill
        self.apply_plans = apply_plans
        self.cluster_budget = (
            ClusterBudget.model_validate(cluster_budget) if cluster_budget is not None else None
        )
        self.history_conn_id = history_conn_id
        self.stream_logs = stream_logs
        self._logs: NodeLogStream | None = None  # while the job's logs are streamed
        self._registry: RunningJobRegistry | None = None
        self._registered: str | None = None  # the job id this trigger registered
        self._announced: int | None = None  # the proposal registered on an earlier poll
        self._waiting: int | None = None  # the proposal last reported as waiting
        self._shrunk_to: int | None = None  # the worker count a shrink order was applied for
        self._data_workers: DataWorkersConfig | None = None  # the spec's, read once
        self._spec_read = False
        self._data_worker_cap: int | None = None  # the last cap the master was told

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "job_dir": self.job_dir,
            "poll_interval": self.poll_interval,
            "milestone": self.milestone.model_dump(mode="json"),
            "stop_on_kill": self.stop_on_kill,
            "apply_plans": self.apply_plans,
        }
        if self.cluster_budget is not None:  # only then: older triggers re-create unchanged
            kwargs["cluster_budget"] = self.cluster_budget.model_dump(mode="json")
            kwargs["history_conn_id"] = self.history_conn_id
        if self.stream_logs:  # likewise
            kwargs["stream_logs"] = True
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    def _hook(self) -> ElasticJobHook:
        return ElasticJobHook(self.job_dir)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self._hook()
        self._start_streaming(hook)
        try:
            if self.stop_on_kill:  # the job's owner: its Kubernetes objects are all there
                await self._ensure(hook)
            while True:
                job = await hook.async_get_status()
                if self.milestone.reached(job):
                    await self._unregister(job.get("job_id"))
                    await self._clean_up(hook, job)
                    await self._pass_on_logs()
                    yield TriggerEvent(job_event("success", job))
                    return
                missed = self.milestone.missed(job)
                if missed is not None:
                    await self._unregister(job.get("job_id"))
                    await self._clean_up(hook, job)
                    await self._pass_on_logs()
                    status = _EVENT_STATUS.get(JobState(job["state"]), "failed")
                    yield TriggerEvent(job_event(status, job, f"{missed}: {job.get('message')}"))
                    return
                plans = plan_records(job.get("plans"))
                if self.apply_plans and self.cluster_budget is not None:
                    await self._apply_within_budget(hook, job, plans, self.cluster_budget)
                elif self.apply_plans:
                    await self._apply_proposed(hook, plans)
                await self._pass_on_logs()
                self.log.info("Job %s: %s", job.get("job_id", self.job_dir), progress_line(job))
                await asyncio.sleep(self.poll_interval)
        except Exception as exc:  # report, never crash the triggerer
            self.log.exception("Polling job %s failed", self.job_dir)
            yield TriggerEvent(job_event("error", {"job_id": None}, f"{type(exc).__name__}: {exc}"))
        finally:  # a registered job that did not end stays until its row's TTL runs out
            if self._registry is not None:
                self._registry.close()
                self._registry = None

    # -- the job's logs ----------------------------------------------------------------------
    def _start_streaming(self, hook: ElasticJobHook) -> None:
        if not self.stream_logs:
            return
        self._logs = NodeLogStream(hook.job_dir)
        limits = self._logs.limits
        self.log.info(
            "Passing the new lines of the job's logs into this log, prefixed by node (at most "
            "%d lines per node and %d in all per poll); the whole logs are in %s",
            limits.lines_per_node,
            limits.lines_per_poll,
            hook.job_dir.logs,
        )

    async def _pass_on_logs(self) -> None:
        """Log the new lines of the job's logs; a failure ends the streaming, never the wait."""
        if self._logs is None:
            return
        try:
            lines = await asyncio.to_thread(self._logs.poll)
        except Exception as exc:
            self.log.warning(
                "Could not read the job's logs (%s: %s); they are no longer passed on here",
                type(exc).__name__,
                exc,
            )
            self._logs = None
            return
        for line in lines:
            self.log.info("%s", line)

    async def _ensure(self, hook: ElasticJobHook) -> None:
        """Recreate what the running job misses; an unanswered check only delays that (the
        status says whether the job lives)."""
        try:
            await hook.async_ensure()
        except Exception as exc:
            self.log.warning("Could not check the objects of job %s: %s", self.job_dir, exc)

    async def _clean_up(self, hook: ElasticJobHook, job: dict[str, Any]) -> None:
        """The owner's trigger removes an ended job's Kubernetes objects (a no-op locally); a
        failed cleanup is logged, never turned into the job's outcome."""
        if not self.stop_on_kill or job.get("state") not in TERMINAL_STATES:
            return
        try:
            await hook.async_cleanup()
        except Exception as exc:  # the objects are the master pod's: deleting it later suffices
            self.log.warning("Could not clean up job %s: %s", job.get("job_id"), exc)

    async def _apply_proposed(self, hook: ElasticJobHook, plans: list[PlanRecord]) -> None:
        """Apply the plan the job's optimizer proposed (applying twice is a no-op there)."""
        for plan in plans:
            if plan.pending:
                record = await hook.async_apply_plan(plan.id)
                self.log.info(
                    "Plan %s (%s: %s): %s%s",
                    plan.id,
                    plan.rule,
                    plan.reason,
                    record.state,
                    f" ({record.note})" if record.note else "",
                )

    # -- the cluster budget ------------------------------------------------------------------
    async def _registry_for(self) -> RunningJobRegistry:
        if self._registry is None:
            url = await HistoryStoreHook(self.history_conn_id or None).async_get_url()
            self._registry = RunningJobRegistry(HistoryStore(url))
        return self._registry

    async def _apply_within_budget(
        self,
        hook: ElasticJobHook,
        job: dict[str, Any],
        plans: list[PlanRecord],
        budget: ClusterBudget,
    ) -> None:
        """Register the job; apply its proposal only if the cluster arbiter selects it. A
        registry that cannot be reached applies nothing (the proposal waits), it never fails
        the task."""
        now = time.time()
        data_workers = await self._data_workers_of()
        row = running_job(job, plans, budget.name, now, ttl_for(self.poll_interval), data_workers)
        if row is None:
            return
        proposal = row.proposal
        try:
            registry = await self._registry_for()
            if proposal is not None and proposal.id != self._announced:
                # A new proposal is registered first and decided from the next poll on: the
                # other jobs' triggers see it before anyone decides (whoever polls first
                # does not win the budget by that alone).
                await asyncio.to_thread(registry.register, row)
                self._registered = row.job_id
                self._announced = proposal.id
                return
            self._announced = proposal.id if proposal is not None else None
            decision = await asyncio.to_thread(registry.decide, row, budget, now)
            self._registered = row.job_id
        except Exception as exc:
            self.log.warning(
                "Cluster budget %r: the job registry is unavailable (%s: %s); proposals wait",
                budget.name,
                type(exc).__name__,
                exc,
            )
            return
        await self._cap_data_workers(hook, registry, row, budget, data_workers, now)
        shrink = decision.shrinks.get(row.job_id)
        if shrink is not None:
            try:
                await self._shrink(hook, registry, row, shrink)
            except Exception as exc:  # the next decision orders it again
                self.log.warning("Could not shrink job %s: %s", row.job_id, exc)
                self._shrunk_to = None
            return
        self._shrunk_to = None
        if proposal is None:
            return
        verdict = decision.verdicts.get(row.job_id)
        if verdict is None or not verdict.allowed:
            self._report_waiting(proposal, budget, verdict)
            return
        await self._apply_selected(hook, registry, row, budget, verdict)

    async def _cap_data_workers(
        self,
        hook: ElasticJobHook,
        registry: RunningJobRegistry,
        row: RunningJob,
        budget: ClusterBudget,
        config: DataWorkersConfig | None,
        now: float,
    ) -> None:
        """Auto-scaled data workers grow only into what the budget has left (the master scales
        them itself, between polls)."""
        if config is None or config.mode != "auto":
            return
        try:
            rows = await asyncio.to_thread(registry.jobs, budget.name, now)
            cap = data_worker_cap(rows, budget, row, config, now)
            if cap != self._data_worker_cap:
                await hook.async_cap_data_workers(cap)
                self._data_worker_cap = cap
        except Exception as exc:  # the next poll tries again
            self.log.warning("Could not tell job %s its room for data workers: %s", row.job_id, exc)

    async def _data_workers_of(self) -> DataWorkersConfig | None:
        """The spec's data workers, which size those the job holds (read once: no plan
        changes them); None when the job directory has no readable spec (said once)."""
        if not self._spec_read:
            self._spec_read = True
            try:
                spec = await asyncio.to_thread(JobDir(Path(self.job_dir)).read_spec)
                self._data_workers = spec.data_workers
            except (OSError, ValueError) as exc:
                self.log.warning("Job spec unreadable (%s): its data workers are not counted", exc)
        return self._data_workers

    async def _shrink(
        self, hook: ElasticJobHook, registry: RunningJobRegistry, row: RunningJob, shrink: Shrink
    ) -> None:
        """Apply the arbiter's order to go down to ``shrink.plan``'s workers (once per order;
        a scale-down needs no arbitration), and hold the smaller plan in the registry."""
        workers = shrink.plan.num_workers
        if row.plan.num_workers <= workers or self._shrunk_to == workers:
            return
        self._shrunk_to = workers
        requested = await asyncio.to_thread(hook.request_plan, workers, None, shrink.reason)
        record = await hook.async_apply_plan(requested.id)
        self.log.info(
            "Plan %s (%d workers): %s%s [%s]",
            record.id,
            workers,
            record.state,
            f" ({record.note})" if record.note else "",
            shrink.reason,
        )
        if record.state == PlanState.APPLIED:
            smaller = row.plan.with_counts(num_workers=workers)
            await asyncio.to_thread(registry.register, replace(row, plan=smaller, proposal=None))

    def _report_waiting(
        self, proposal: PlanRecord, budget: ClusterBudget, verdict: Verdict | None
    ) -> None:
        """Log a proposal the arbiter did not select, once per proposal (not on every poll)."""
        if self._waiting != proposal.id:
            self.log.info(
                "Plan %s (%s: %s): waiting for the cluster budget %r: %s",
                proposal.id,
                proposal.rule,
                proposal.reason,
                budget.name,
                verdict.reason if verdict else "not decided",
            )
        self._waiting = proposal.id

    async def _apply_selected(
        self,
        hook: ElasticJobHook,
        registry: RunningJobRegistry,
        row: RunningJob,
        budget: ClusterBudget,
        verdict: Verdict,
    ) -> None:
        """Apply the proposal the arbiter selected; one the master did not apply gives its
        reservation back at once."""
        assert row.proposal is not None  # a verdict is only given on a pending proposal
        proposal = row.proposal
        record = await hook.async_apply_plan(proposal.id)
        self.log.info(
            "Plan %s (%s: %s): %s%s [cluster budget %r: %s]",
            proposal.id,
            proposal.rule,
            proposal.reason,
            record.state,
            f" ({record.note})" if record.note else "",
            budget.name,
            verdict.reason,
        )
        if record.state != PlanState.APPLIED:
            try:
                await asyncio.to_thread(registry.register, replace(row, proposal=None))
            except Exception as exc:
                self.log.warning("Cluster budget %r: %s", budget.name, exc)

    async def _unregister(self, job_id: str | None) -> None:
        """The job ended (or reached its milestone): its row leaves the registry."""
        self._registered = None
        if self.cluster_budget is None or not job_id:
            return
        try:
            registry = await self._registry_for()
            await asyncio.to_thread(registry.remove, job_id)
        except Exception as exc:  # its TTL removes it anyway
            self.log.warning("Could not remove job %s from the cluster registry: %s", job_id, exc)

    async def on_kill(self) -> None:
        """The user marked the task failed/success or cleared it: stop the job, orphan nothing."""
        if self.stop_on_kill:
            await self._hook().async_stop("the Airflow task was killed by a user")
            await self._unregister(self._registered)
            if self._registry is not None:
                self._registry.close()
                self._registry = None
