"""The job's checkpoints as a whole: the checkpointer that takes them, their copies in
``checkpoint_uri``, and, once a save has been timed, the plan its policy makes of the measured
costs: a new interval (never below ``interval_floor``), and the policy the job runs as (CPR may
fall back to full recovery)."""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any, Protocol

from airflow_rover.core.policies import (
    POLICIES,
    CheckpointCosts,
    CheckpointPolicy,
    LostUpdates,
    MasterPort,
    interval_floor,
    judge_choice,
)
from airflow_rover.core.spec import JobSpec
from airflow_rover.master.checkpoint_history import CheckpointHistory, checkpoint_entry
from airflow_rover.master.checkpointer import Checkpointer, CheckpointTimes
from airflow_rover.master.job_core import JobCore
from airflow_rover.master.resume import LOST_UPDATES_KEY
from airflow_rover.rpc.ps_client import PSClient
from airflow_rover.storage import CheckpointMirror, open_store

log = logging.getLogger(__name__)

MIRROR_FLUSH_TIMEOUT_S = 600.0


class CheckpointingJob(JobCore, Protocol):
    """What the checkpoints use of the job beyond its core."""

    policy: CheckpointPolicy
    lost: LostUpdates
    port: MasterPort

    def ps_client(self) -> PSClient: ...

    def ps_recovery_seconds(self) -> list[float]:
        """How long each lost PS took to be back (restores, measured)."""


def checkpoint_mirror(spec: JobSpec) -> CheckpointMirror | None:
    """The copier of committed checkpoints to ``checkpoint_uri`` (None without one)."""
    uri = spec.checkpoint_uri
    return None if uri is None else CheckpointMirror(open_store(uri))


class Checkpoints:
    """Takes the job's checkpoints and plans them with its policy."""

    def __init__(self, job: CheckpointingJob, mirror: CheckpointMirror | None, number: int) -> None:
        """``number``: the last committed checkpoint (0: none)."""
        self.job = job
        self.mirror = mirror
        self.checkpointer = Checkpointer(
            job.job_dir,
            job.spec.recovery.checkpoint_interval_s,
            job.ps_client,
            self._queue_state,
            number,
            on_commit=self.committed,
        )
        self.requested = job.spec.checkpoint.build()
        self._others: dict[str, CheckpointPolicy] = {}  # the policies a plan fell back to
        self.reason = "as requested"
        self.advice: str | None = None  # a cheaper policy, from the measured costs
        self._durable_wait_since: float | None = None
        self.history = CheckpointHistory.on_disk(job.job_dir.checkpoint_dirs(), number, mirror)

    def _queue_state(self) -> dict[str, Any]:
        job = self.job
        return {
            **job.queue.to_dict(),
            "job_id": job.spec.job_id,  # whose it is
            "fingerprint": job.spec.fingerprint,  # and of what
            LOST_UPDATES_KEY: job.lost.to_dict(),
        }

    def committed(self, directory: Path, times: CheckpointTimes) -> None:
        """Copy it to durable storage (``checkpoint_uri``, in the background); with a known
        failure rate, re-plan the checkpoint interval (and the policy) from what this
        checkpoint cost."""
        job = self.job
        self.history.add(checkpoint_entry(directory, self.mirror))
        if self.mirror is not None:
            self.mirror.submit(directory)
        job.policy.on_commit(job.port, directory)
        cfg = job.spec.checkpoint
        if cfg.mtbf_s is None:
            return
        restores = job.ps_recovery_seconds()
        save_s = max(times.pause_s, 1e-3)
        costs = CheckpointCosts(
            save_s=save_s,
            load_s=statistics.median(restores) if restores else times.durable_s,
            mtbf_s=cfg.mtbf_s,
            num_emb_ps=job.spec.plan.num_ps,
            min_interval_s=interval_floor(save_s, job.spec.recovery.checkpoint_interval_s),
        )
        plan = self.requested.plan(costs)
        if plan.interval_s is not None:
            self.checkpointer.interval_s = plan.interval_s
        if (plan.policy, plan.reason) != (job.policy.name, self.reason):
            log.info("checkpoint policy %s: %s", plan.policy, plan.reason)
        self.reason = plan.reason
        self._run_as(plan.policy)
        advice = judge_choice(cfg, costs)
        if advice is not None and advice != self.advice:
            log.warning("%s", advice)  # once per change: the costs are measured each time
        self.advice = advice

    def _run_as(self, name: str) -> None:
        """Swap the job's policy object for the one its plan runs as."""
        job = self.job
        if name == job.policy.name:
            return
        if name == self.requested.name:
            new = self.requested
        else:
            new = self._others.setdefault(name, job.spec.checkpoint.build(name))
        job.policy.on_replaced(job.port, name)
        job.policy = new

    def report(self) -> dict[str, Any]:
        """The checkpoint part of the job's recovery summary: every registered policy's
        report keys (empty unless it ran), filled by the policies this job ran."""
        job = self.job
        report: dict[str, Any] = {}
        for policy in POLICIES.values():
            report.update(policy.empty_report())
        for used in (self.requested, *self._others.values()):
            report.update(used.report())
        return {
            "checkpoints": self.checkpointer.number,
            "checkpoint_policy": job.policy.name,
            "checkpoint_policy_reason": self.reason,
            "checkpoint_policy_advice": self.advice,
            "checkpoint_interval_s": self.checkpointer.interval_s,
            "checkpoint_history": self.history.to_json(),
            **report,
        }

    def durable(self) -> bool:
        """Whether the last checkpoint is copied to ``checkpoint_uri`` (or there is none to
        copy), asked on each tick: the job reports success once it is, or once
        ``MIRROR_FLUSH_TIMEOUT_S`` has passed, saying so. Never waited for under the lock: the
        API (status, the trigger) keeps answering meanwhile."""
        if self.mirror is None or self.mirror.flush(timeout=0):
            return True
        now = time.time()
        if self._durable_wait_since is None:
            self._durable_wait_since = now
            self.job.message = f"copying the last checkpoint to {self.job.spec.checkpoint_uri}"
            self.job.mirror_state(force=True)
        return now - self._durable_wait_since > MIRROR_FLUSH_TIMEOUT_S
