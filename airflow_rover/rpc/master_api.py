"""Request and reply bodies of the master's HTTP API, shared by the server and its clients.

Validated with pydantic on arrival: a malformed report is rejected (HTTP 422), never applied.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from airflow_rover.core.spec import PsCount, WorkerCount

API_PREFIX = "/api/v1"
EXIT_PS_LOST = 75
"""A worker's exit code when a parameter server went away under it: not the worker's fault
(nor its shard's); the master restarts it once the PS is back."""


class _Body(BaseModel):
    # A number must be finite: NaN and Infinity (JSON has neither; 1e400 reads as inf) are
    # refused like any other bad value.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class InitialRows(_Body):
    """What a PS took of the model its job continues (``init_from``): rows kept, rows left
    out as not seen within ``evict_after_days``."""

    loaded: int = Field(ge=0)
    evicted: int = Field(ge=0)


class NodeReady(_Body):
    # host:port where a PS serves (an IP, a DNS name, or a bracketed IPv6 address)
    address: str | None = Field(
        default=None, max_length=200, pattern=r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):[0-9]{1,5}$"
    )
    initial_rows: InitialRows | None = None  # a PS that started from ``init_from``


class Heartbeat(_Body):
    steps: int = Field(ge=0)
    samples: int = Field(ge=0)
    step_time_ms: float = Field(ge=0)
    # a trainer's input: seconds it waited for its next batch in all, and how full its queue
    # of ready batches was lately (0..1); what the data workers' autoscaler reads
    input_wait_s: float = Field(default=0.0, ge=0)
    ready_fill: float = Field(default=0.0, ge=0, le=1)


class NodeCrash(_Body):
    """A node's uncaught exception, reported just before it exits (``core.crashes.Crash``)."""

    exc_type: str = Field(min_length=1, max_length=300)
    message: str = Field(max_length=2000)
    where: str = Field(max_length=500)
    transient: bool = False
    tail: str = Field(default="", max_length=8000)


class LeaseRequest(_Body):
    node_id: str = Field(min_length=1, max_length=100)
    # The PS set the trainer uses: no shard for a trainer of an older one (it has not yet
    # noticed a PS relaunch or resize; what it would train could not land).
    ps_set_version: int | None = None


class ShardOut(_Body):
    """Samples ``[start, end)`` of shard ``shard_id``; the batch at ``start`` has key
    ``first_key``, the next ``first_key + 1``, and so on (every push carries its batch's key)."""

    shard_id: int
    epoch: int
    start: int
    end: int
    first_key: int = Field(ge=0)


class LeaseReply(_Body):
    status: Literal["ok", "wait", "done"]
    shard: ShardOut | None = None
    ps_set_version: int = Field(default=0, ge=0)
    """The PS set to train against: a worker that holds an older one (the PS were resized)
    reads the new PS list from ``/cluster`` before its next step."""
    data_workers: list[str] = Field(default_factory=list, max_length=1000)
    """Where the job's data workers serve ready batches now (none: prepare them yourself)."""


class ShardDone(_Body):
    node_id: str = Field(min_length=1, max_length=100)


class ShardDoneReply(_Body):
    accepted: bool


class EvalReport(_Body):
    node_id: str = Field(min_length=1, max_length=100)
    auc: float = Field(ge=0.0, le=1.0)
    logloss: float = Field(ge=0.0)
    samples: int = Field(gt=0)


class PlanRequest(_Body):
    """A resize asked for by a person or a task (``rover plan``, ``ElasticJobHook.request_plan``):
    the counts to change; the rest of the plan stays as it is."""

    num_workers: WorkerCount | None = None
    num_ps: PsCount | None = None
    reason: str = Field(default="requested", max_length=500)


class DeclineRequest(_Body):
    """Why a person declined a proposed plan (kept in the plan's note)."""

    reason: str = Field(min_length=1, max_length=500)


class DataWorkerCap(_Body):
    """The most data workers a job's cluster budget leaves room for (None: no limit)."""

    cap: int | None = Field(default=None, ge=0, le=64)


class StopRequest(_Body):
    reason: str = Field(default="stop requested", max_length=500)
    # a person's decision: the job's failure says no retry should resume it
    final: bool = False


class ClusterInfo(_Body):
    job_id: str
    ps: list[str]
    ps_set_version: int = Field(default=0, ge=0)
