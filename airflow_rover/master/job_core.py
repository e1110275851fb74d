"""What every room of the master uses of the job (``master.job.JobMaster`` is it): the spec,
the job directory, the shard queue, the nodes, the job's state and message, and how it ends."""

from __future__ import annotations

from typing import Protocol

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.shards import ShardQueue
from airflow_rover.core.spec import JobSpec
from airflow_rover.core.states import JobState
from airflow_rover.master.nodes import NodeSet


class JobCore(Protocol):
    spec: JobSpec
    job_dir: JobDir
    queue: ShardQueue
    nodes: NodeSet
    state: JobState
    message: str

    def finish(self, state: JobState, message: str) -> None: ...

    def mirror_state(self, force: bool = False) -> None: ...
