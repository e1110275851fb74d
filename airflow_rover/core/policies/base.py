"""The interface every checkpoint policy implements, and what it may use of the processes.

A policy is one module (``full``, ``cpr``, ``ecrm``): its options, its cost model and plan,
and the behaviour each process of the job needs under it. The master holds one policy object
and calls its hooks at fixed points of its tick (``MasterPolicy``); a PS and a worker call
theirs when they start (``NodePolicy``). A hook does nothing unless the policy overrides it, so
a policy says only what it does differently. Policies reach the master through ``MasterPort``
and the parameter servers through ``PsCalls``: no policy imports the processes, and no process
compares policy names.
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from airflow_rover.core.policies.costs import CheckpointCosts, CheckpointPlan
from airflow_rover.core.policies.options import PolicyOptions
from airflow_rover.core.shards import ShardQueue
from airflow_rover.core.states import JobState


class PsUnreachable(Exception):
    """A parameter server could not be reached (or is not up): try again at a later tick."""


class PsCalls(Protocol):
    """The calls on every PS of the job a policy makes (the master's PS client)."""

    def ledgers(self) -> list[tuple[set[int], int]]: ...

    def forgive(self, keys_by_ps: list[set[int]]) -> None: ...

    def partial_save(self, directory: Path, variant: str, r: float) -> int: ...

    def ecrm_setup(
        self, k: int, rows_per_lock: int, addresses: list[str], epochs: list[int], encode: bool
    ) -> None: ...

    def ecrm_rebuild(
        self, index: int, k: int, rows_per_lock: int, addresses: list[str], epochs: list[int]
    ) -> Mapping[str, np.ndarray]: ...

    def ecrm_status(self, index: int) -> Mapping[str, np.ndarray]: ...


@dataclass
class LostUpdates:
    """Updates the job lost for good (partial recovery forgave them): its PLS, the portion of
    lost samples over all samples times the embedding PS (CPR section 4.1). Kept in every
    checkpoint's ``queue.json``, so a resumed job still counts them."""

    batches: int = 0
    samples: int = 0

    def pls(self, total_samples: int, num_emb_ps: int) -> float:
        total = total_samples * num_emb_ps
        return self.samples / total if total else 0.0

    def to_dict(self) -> dict[str, int]:
        return {"batches": self.batches, "samples": self.samples}

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any] | None) -> LostUpdates:
        saved = saved or {}
        return cls(int(saved.get("batches", 0)), int(saved.get("samples", 0)))


class JobFiles(Protocol):
    """What a policy reads and writes in the job directory (``core.job_dir.JobDir``)."""

    def checkpoint_dirs(self) -> list[Path]: ...

    def partial_dir(self, base: int, seq: int) -> Path: ...

    def partial_dirs(self, base: int | None = None) -> list[Path]: ...

    def ecrm_rebuild_marker(self, ps_index: int) -> Path: ...

    def discard(self, directories: list[Path], why: str) -> None:
        """Take ``directories`` out of the job's sight (raises if one cannot be), then delete
        them (``core.job_dir.discard_dirs``)."""


class MasterPort(Protocol):
    """What a policy may read and do in the job's master. Hooks run under the master's lock."""

    @property
    def state(self) -> JobState: ...

    @property
    def job_dir(self) -> JobFiles: ...

    @property
    def queue(self) -> ShardQueue: ...

    @property
    def lost(self) -> LostUpdates: ...

    @property
    def num_ps(self) -> int: ...

    @property
    def checkpoint_number(self) -> int:
        """The last committed checkpoint (0: none)."""

    @property
    def checkpoint_interval_s(self) -> float: ...

    def ps_calls(self) -> contextlib.AbstractContextManager[PsCalls]:
        """A client of every PS of the job; raises ``PsUnreachable``."""

    def ps_addresses(self) -> list[str]: ...

    def ps_incarnations(self) -> list[int]:
        """How often each PS was relaunched (its incarnation)."""

    def unlocked(self) -> contextlib.AbstractContextManager[None]:
        """Let the API in while the block waits on the PS (the workers train meanwhile)."""

    def recheck_when_done(self, shard_ids: set[int]) -> None:
        """Check these leased shards against the PS ledgers once they are done."""

    def fail(self, message: str) -> None: ...


@dataclass(frozen=True)
class PsLoss:
    """How a policy recovers a lost PS: whether the workers train on through the loss (else
    they give their shards back and wait for the PS), and how it comes back (for the log)."""

    workers_train_on: bool
    how: str


@dataclass(frozen=True)
class NodeJob:
    """What a policy knows of its job in a PS or worker process."""

    job_dir: JobFiles
    num_ps: int
    seed: int
    vocab_sizes: Mapping[str, int]  # embedding group -> rows it can hold
    raw_groups: frozenset[str] = frozenset()  # groups of raw 64-bit ids (an "ids" index)


class NodeTables(Protocol):
    """A parameter server's partition, as a policy sets it up or adds to a restore."""

    @property
    def index(self) -> int: ...

    @property
    def num_ps(self) -> int: ...

    @property
    def tables(self) -> Mapping[str, Any]:
        """name -> its ``ps.tables.EmbeddingTable`` (``enable_ssu``, ``absorb``)."""


class CheckpointPolicy(ABC):
    """A checkpoint policy: options, cost model and plan, and the processes' behaviour.

    Subclasses set ``name`` and ``Options`` and implement ``plan``; every hook has a default
    that does what full recovery does.
    """

    name: ClassVar[str]
    Options: ClassVar[type[PolicyOptions]]

    def __init__(self, options: PolicyOptions, mtbf_s: float | None = None) -> None:
        self.options = options
        self.mtbf_s = mtbf_s

    # -- planning ------------------------------------------------------------------------------
    @abstractmethod
    def plan(self, costs: CheckpointCosts) -> CheckpointPlan:
        """The save schedule at ``costs`` (a policy may plan to run as another: CPR falls back
        to full recovery when it would cost more)."""

    def check_cluster(self, num_ps: int) -> None:
        """Reject a PS count this policy cannot run on (``CheckpointPolicyError``)."""

    @property
    def min_ps(self) -> int:
        """The fewest PS this policy runs on: the autoscaler proposes no fewer."""
        return 1

    def check_runtime(self) -> None:
        """Reject options the runtime does not run (``CheckpointPolicyError``)."""

    # -- the master ------------------------------------------------------------------------------
    def on_master_start(self, master: MasterPort, resumed: bool) -> None:
        """A new master (a first start, a retry, a relaunch; ``resumed`` from a checkpoint),
        before any PS starts."""

    def prepare_ps(self, master: MasterPort) -> bool:
        """Every PS is up, before any worker trains; False: not yet (a PS could not be
        reached): asked again next tick."""
        return True

    def on_ps_lost(self, master: MasterPort, index: int, cause: str) -> PsLoss | None:
        """PS ``index`` is lost; None when the job cannot recover it (the hook failed it)."""
        return PsLoss(workers_train_on=False, how="from the last checkpoint")

    def on_ps_restored(self, master: MasterPort) -> bool:
        """Lost PS are back (restored), before the shards resume from the PS ledgers; False:
        not yet."""
        return True

    def on_recovered(self, master: MasterPort) -> None:
        """The workers train again after a lost PS came back."""

    def trains_through_loss(self, state: JobState) -> bool:
        """Whether workers get shards while the job recovers a lost PS."""
        return False

    @property
    def busy(self) -> bool:
        """Recovering in the background (ECRM's rebuild): no checkpoint, plan or wrap-up."""
        return False

    def poll(self, master: MasterPort) -> None:
        """Every tick while the job trains, first."""

    def save(self, master: MasterPort) -> None:
        """Every tick on which the master may checkpoint, after its checkpointer's tick."""

    def on_commit(self, master: MasterPort, directory: Path) -> None:
        """Checkpoint ``directory`` is committed."""

    def on_replaced(self, master: MasterPort, by: str) -> None:
        """The job runs as policy ``by`` from now on (this one's plan fell back to it)."""

    def declines_ps_resize(self) -> str | None:
        """Why this policy cannot change the PS count of a running job; None: it can."""
        return None

    def report(self) -> dict[str, Any]:
        """What the policy adds to the job's recovery summary."""
        return {}

    @classmethod
    def empty_report(cls) -> dict[str, Any]:
        """``report``'s keys with nothing in them (a job that never ran this policy)."""
        return {}

    # -- the nodes -------------------------------------------------------------------------------
    def on_standby_ps(self, job: NodeJob) -> None:
        """A spare PS process waits to replace a lost PS: work out what it will need."""

    def ps_starts_empty(self, job: NodeJob, index: int) -> bool:
        """Whether PS ``index`` starts empty instead of restoring its checkpoint."""
        return False

    def setup_ps(self, ps: NodeTables, job: NodeJob) -> None:
        """A PS has its partition (restored, or empty), before it serves."""

    def after_restore(self, ps: NodeTables, job: NodeJob, checkpoint: Path) -> None:
        """A PS restored its partition from ``checkpoint`` (not from a newer memory copy)."""

    def degraded_reads(self, job: NodeJob, optimizer: Any) -> Any:
        """What a worker needs to read a lost PS's rows itself (None: it waits for the PS)."""
        return None


def in_background(target: Any, name: str) -> None:
    """Run ``target()`` in a daemon thread (work a process may do while it starts)."""
    threading.Thread(target=target, name=name, daemon=True).start()
