"""The master as its checkpoint policy sees it (``core.policies.MasterPort``): the job's files,
queue, state and lost updates, and the calls the policy makes on the PS and the job."""

from __future__ import annotations

import contextlib
from typing import Protocol

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.policies import LostUpdates, PsCalls
from airflow_rover.core.shards import ShardQueue
from airflow_rover.core.states import JobState
from airflow_rover.master.checkpointer import Checkpointer
from airflow_rover.master.dispatch import ShardDispatch
from airflow_rover.master.job_core import JobCore
from airflow_rover.master.ps_access import PsAccess


class PortedJob(JobCore, Protocol):
    """What the port reads of the job beyond its core."""

    lost: LostUpdates
    dispatch: ShardDispatch
    ps: PsAccess

    @property
    def checkpointer(self) -> Checkpointer: ...

    def unlocked(self) -> contextlib.AbstractContextManager[None]: ...

    def fail(self, message: str) -> None: ...


class PolicyPort:
    """Delegates each ``MasterPort`` member to the job, read when asked."""

    def __init__(self, job: PortedJob) -> None:
        self._job = job

    @property
    def job_dir(self) -> JobDir:
        return self._job.job_dir

    @property
    def queue(self) -> ShardQueue:
        return self._job.queue

    @property
    def state(self) -> JobState:
        return self._job.state

    @property
    def lost(self) -> LostUpdates:
        return self._job.lost

    @property
    def num_ps(self) -> int:
        return self._job.spec.plan.num_ps

    @property
    def checkpoint_number(self) -> int:
        return self._job.checkpointer.number

    @property
    def checkpoint_interval_s(self) -> float:
        return self._job.checkpointer.interval_s

    def ps_calls(self) -> contextlib.AbstractContextManager[PsCalls]:
        return self._job.ps.calls()

    def ps_addresses(self) -> list[str]:
        return self._job.ps.addresses()

    def ps_incarnations(self) -> list[int]:
        return self._job.nodes.ps_incarnations(self.num_ps)

    def unlocked(self) -> contextlib.AbstractContextManager[None]:
        return self._job.unlocked()

    def recheck_when_done(self, shard_ids: set[int]) -> None:
        self._job.dispatch.recheck.update(shard_ids)

    def fail(self, message: str) -> None:
        self._job.fail(message)
