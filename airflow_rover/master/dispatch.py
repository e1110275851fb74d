"""Shard dispatch: the workers lease shards from the queue, report them done or give them back,
and every shard that comes back resumes at its first batch some PS has not applied (the PS
ledgers say which), so nothing is lost or trained twice."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Literal, Protocol

from airflow_rover.core.policies import CheckpointPolicy
from airflow_rover.core.shards import Shard
from airflow_rover.core.states import TERMINAL_STATES, JobState
from airflow_rover.master.job_core import JobCore
from airflow_rover.master.ps_set import PsSet
from airflow_rover.rpc import master_api

log = logging.getLogger(__name__)

STRAGGLER_RATIO = 0.5


class DispatchingJob(JobCore, Protocol):
    """What dispatch uses of the job beyond its core."""

    policy: CheckpointPolicy
    ps_set: PsSet

    @property
    def holding_leases(self) -> bool:
        """No shard is handed out (a PS resize drains the leased ones)."""

    def unlocked(self) -> contextlib.AbstractContextManager[None]: ...

    def applied_everywhere(self, purpose: str) -> set[int] | None:
        """The batch keys every PS has applied, or None (logged) if a PS cannot say."""


class ShardDispatch:
    """Leases, completions and give-backs of shards (called with the job's lock held)."""

    def __init__(self, job: DispatchingJob) -> None:
        self.job = job
        self.reconcile_pending = False  # resume every shard from the PS ledgers before training
        self.unreconciled: list[Shard] = []  # to resume from the PS ledgers at the next tick
        self.recheck: set[int] = set()  # shards leased through an ECRM loss (``done``)

    # -- the workers' calls --------------------------------------------------------------------
    def lease(self, node_id: str, ps_set_version: int | None) -> master_api.LeaseReply:
        """The next shard for ``node_id``. A worker the master stopped (a smaller plan) or saw
        exit gets none: its shards went back to the queue, and a lease it asked for just
        before it died may be served only now (it waited for the job's lock while the plan
        was applied); nobody would train that shard, and the dead worker's report of a slice,
        served after it, would complete the rest of the shard untrained."""
        job = self.job
        node = job.nodes.known(node_id)
        node.last_seen = time.time()
        version = job.ps_set.version
        if not node.running:
            log.info("no lease for %s: it was stopped or has exited", node_id)
            return master_api.LeaseReply(status="done", ps_set_version=version)
        if job.state != JobState.RUNNING and not job.policy.trains_through_loss(job.state):
            done = job.state in TERMINAL_STATES or job.state == JobState.EVALUATING
            return master_api.LeaseReply(status="done" if done else "wait", ps_set_version=version)
        if (ps_set_version is not None and ps_set_version != version) or job.holding_leases:
            return master_api.LeaseReply(status="wait", ps_set_version=version)
        lease_s = job.spec.training.shard_lease_s
        shard = job.queue.lease(node_id, time.time(), lease_s, self._slice_for(node_id))
        if shard is None:  # others still hold shards that may come back if they die
            # Done training, a worker waits for the evaluation to begin: it may score it.
            done = job.queue.finished and not job.spec.eval_data
            status: Literal["done", "wait"] = "done" if done else "wait"
            return master_api.LeaseReply(status=status, ps_set_version=version)
        out = master_api.ShardOut(
            shard_id=shard.shard_id,
            epoch=shard.epoch,
            start=shard.start,
            end=shard.end,
            first_key=job.queue.first_key(shard),
        )
        return master_api.LeaseReply(status="ok", shard=out, ps_set_version=version)

    def _slice_for(self, node_id: str) -> int | None:
        """Batches a straggler may lease at once: a worker slower than ``STRAGGLER_RATIO`` of
        the fastest gets a slice of a shard in proportion to its speed, so it never holds a
        whole shard back at the end of an epoch; others get whole shards (None)."""
        times = self.job.nodes.step_times()
        if node_id not in times or len(times) < 2:
            return None
        relative = min(times.values()) / times[node_id]  # 1.0 for the fastest worker
        if relative >= STRAGGLER_RATIO:
            return None
        return max(1, int(self.job.queue.batch_keys.per_shard * relative))

    def done(self, shard_id: int, node_id: str) -> bool:
        queue = self.job.queue
        accepted = queue.complete(shard_id, node_id)
        if not accepted:
            log.warning("rejected completion of shard %d by %s", shard_id, node_id)
        elif shard_id in self.recheck:  # reopened at the first batch some PS lacks
            self.recheck.discard(shard_id)  # (next tick: the ledgers are not read here)
            self.unreconciled.append(queue.static(shard_id))
        return accepted

    def give_back(self, node_id: str) -> int:
        """A worker that lost a PS and gave up on what it was training gives its shards back,
        once it is connected to the replacement: each resumes at its first batch some PS
        lacks. (Under ECRM a lost PS does not release the workers' shards: they train on
        through it, ``core.ecrm.degraded``.)"""
        self.job.nodes.known(node_id)
        released = self.job.queue.release_worker(node_id)
        if released and not self.reconcile(released):
            self.unreconciled.extend(released)  # ledgers unreadable: again next tick
        return len(released)

    # -- the supervisor's tick -----------------------------------------------------------------
    def tick(self) -> None:
        """Expired leases go back to the queue; shards waiting for the ledgers resume."""
        expired = self.job.queue.expire(time.time())
        for shard in expired:
            log.warning("lease of shard %d expired; back to TODO", shard.shard_id)
        self.reconcile(expired)
        if self.unreconciled and self.reconcile(self.unreconciled):
            self.unreconciled = []

    @property
    def training_done(self) -> bool:
        """Every shard is done and none waits to resume."""
        return self.job.queue.finished and not self.unreconciled

    # -- the PS ledgers ------------------------------------------------------------------------
    def reconcile(self, shards: list[Shard]) -> bool:
        """Resume the given shards from the PS ledgers (``ShardQueue.reconcile``); False if
        the ledgers could not be read (the PS turn retried batches away anyway)."""
        if not shards:
            return True
        applied = self.job.applied_everywhere("shards resume where they were")
        if applied is None:
            return False
        self.job.queue.reconcile(shards, applied)
        return True

    def reconcile_all(self) -> bool:
        """``reconcile`` of every shard. Through an ECRM loss the ledgers are read with the
        API let in (``unlocked``); a shard leased meanwhile is left out of that read, which
        may predate its batches: it is checked against ledgers read later, at the next tick
        (done or given back by then) or once done (still leased: ``recheck``)."""
        job = self.job
        shards = job.queue.shards()
        if not job.policy.trains_through_loss(job.state):
            return self.reconcile(shards)
        leases = job.queue.leases.copy()
        with job.unlocked():
            applied = job.applied_everywhere("shards resume where they were")
        if applied is None or job.state in TERMINAL_STATES:
            return False
        moved = {s.shard_id for s in shards if job.queue.leases[s.shard_id] != leases[s.shard_id]}
        held = set(job.queue.leased())  # checked once done (``recheck``)
        self.unreconciled.extend(job.queue.static(i) for i in sorted(moved - held))
        job.queue.reconcile([s for s in shards if s.shard_id not in moved], applied)
        return True

    def applied_samples(self) -> int:
        """Samples whose batches every PS has applied (0 if a PS cannot say)."""
        applied = self.job.applied_everywhere("resumed samples not counted")
        return 0 if applied is None else self.job.queue.samples_in(applied)
