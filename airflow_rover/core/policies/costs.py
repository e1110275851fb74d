"""What checkpoints cost a job, and what every policy's plan says: the inputs and outputs of
each policy's cost model (``docs/checkpoint-policies.md``).

Pure logic: the master measures the costs once a save has been timed; the policies turn them
into a ``CheckpointPlan``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

PolicyName = str
CprVariant = Literal["vanilla", "mfu", "ssu"]

# ECRM paper section 4.3: 2.6% (k=4, Criteo-Original) to 4.2% (880 GB) training-time overhead in
# normal operation, whatever k; and a 6-12% throughput drop while a lost PS is rebuilt (4.2).
ECRM_NORMAL_OVERHEAD = 0.03
ECRM_RECOVERY_DROP = 0.10


@dataclass(frozen=True)
class CheckpointCosts:
    """What checkpoints cost this job (measured, or from its history); times in seconds.

    ``save_s`` is the training pause of one full checkpoint; ``load_s`` the pause while one PS
    restores its part (all PS restore in parallel under full recovery, so the pause is the
    same). ``mtbf_s`` is the mean time between embedding-PS failures of the whole job.
    """

    save_s: float
    load_s: float
    mtbf_s: float
    num_emb_ps: int
    reschedule_s: float = 0.0
    partial_save_s: float | None = None  # one MFU/SSU save of r*N rows; default r * save_s
    embedding_rows: int = 0
    embedding_bytes: int = 0  # rows + optimizer state on all PS (ECRM parity memory)
    memory_headroom_bytes: int | None = None  # free PS memory for parity; None: not checked
    ecrm_normal_overhead: float = ECRM_NORMAL_OVERHEAD
    ecrm_recovery_drop: float = ECRM_RECOVERY_DROP
    ecrm_rebuild_s: float | None = None  # time to rebuild one PS by decoding; default k*load_s
    min_interval_s: float = 0.0  # the shortest save interval a plan may choose (interval_floor)

    def __post_init__(self) -> None:
        for name in ("load_s", "reschedule_s", "ecrm_normal_overhead", "min_interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value!r}: must be a finite number >= 0")
        positive(save_s=self.save_s, mtbf_s=self.mtbf_s)
        if self.num_emb_ps < 1:
            raise ValueError(f"num_emb_ps={self.num_emb_ps!r}: must be >= 1")
        if not 0 <= self.ecrm_recovery_drop <= 1:
            raise ValueError(f"ecrm_recovery_drop={self.ecrm_recovery_drop!r}: in [0, 1]")
        for name in ("partial_save_s", "ecrm_rebuild_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value!r}: must be a finite number >= 0")


@dataclass(frozen=True)
class Overhead:
    """Expected overhead as a share of failure-free training time, by cause (CPR section 2.2)."""

    save: float = 0.0  # O_save / T_save (+ partial saves)
    load: float = 0.0  # O_load / T_fail
    lost: float = 0.0  # (T_save / 2) / T_fail: work redone after a rollback
    reschedule: float = 0.0  # O_res / T_fail
    running: float = 0.0  # ECRM: parity updates in normal operation
    recovery: float = 0.0  # ECRM: slower training while a lost PS is rebuilt

    @property
    def total(self) -> float:
        return self.save + self.load + self.lost + self.reschedule + self.running + self.recovery


def positive(**values: float) -> None:
    for name, value in values.items():
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name}={value!r}: must be a finite number > 0")


# ----------------------------------------------------------------------------- the floor

MIN_PLANNED_INTERVAL_S = 30.0
SAVES_PER_INTERVAL_FLOOR = 20.0


def interval_floor(save_s: float, configured_s: float | None = None) -> float:
    """The shortest interval a plan may choose from a failure rate: ``SAVES_PER_INTERVAL_FLOOR``
    save pauses (saving then costs at most 5% of training time) and ``MIN_PLANNED_INTERVAL_S``
    (a failure then loses at most half of it, 15 s, about what relaunching and restoring the
    PS costs anyway, so saving more often cannot make a failure noticeably cheaper); but never
    above the job's own ``recovery.checkpoint_interval_s`` (``configured_s``): a user who asks
    for frequent checkpoints keeps them."""
    floor = max(MIN_PLANNED_INTERVAL_S, SAVES_PER_INTERVAL_FLOOR * save_s)
    return floor if not configured_s else min(floor, configured_s)


def describe_floor(configured_s: float | None = None) -> str:
    """``interval_floor`` in words, for the log."""
    floor = f"max({MIN_PLANNED_INTERVAL_S:.0f} s, {SAVES_PER_INTERVAL_FLOOR:.0f} save pauses)"
    if not configured_s:
        return floor
    configured = f"recovery.checkpoint_interval_s={duration(configured_s)}"
    return (
        configured if configured_s < MIN_PLANNED_INTERVAL_S else f"{floor}, capped at {configured}"
    )


def floored(interval_s: float, costs: CheckpointCosts, how: str) -> tuple[float, str]:
    """A planned interval raised to ``costs.min_interval_s``, and how it was chosen."""
    if interval_s >= costs.min_interval_s:
        return interval_s, how
    return costs.min_interval_s, f"{how}={duration(interval_s)}, raised to the floor"


# ----------------------------------------------------------------------------- history


@dataclass(frozen=True)
class FailureHistory:
    """One past run: how long it trained, with how many embedding PS, how many PS failed."""

    seconds: float
    num_ps: int
    ps_failures: int


@dataclass(frozen=True)
class FailureEvidence:
    """What past runs say about PS failures: the failure rate per PS-second is estimated with
    Jeffreys' prior for a Poisson rate (Gamma(1/2, 0)), whose posterior mean is
    ``(failures + 1/2) / PS-seconds``: no failure in a history is half a failure's evidence,
    never none (an infinite MTBF) nor a whole one (which made one clean 10 s run plan
    checkpoints every 0.4 s)."""

    runs: int
    seconds: float  # training time of the runs, added up
    ps_seconds: float
    failures: int

    @classmethod
    def of(cls, runs: Iterable[FailureHistory]) -> FailureEvidence:
        count, seconds, ps_seconds, failures = 0, 0.0, 0.0, 0
        for run in runs:
            if run.seconds < 0 or run.num_ps < 1 or run.ps_failures < 0:
                raise ValueError(f"invalid history entry {run!r}")
            count += 1
            seconds += run.seconds
            ps_seconds += run.seconds * run.num_ps
            failures += run.ps_failures
        return cls(count, seconds, ps_seconds, failures)

    def mtbf_s(self, num_emb_ps: int) -> float | None:
        """Mean seconds between PS failures of a job on ``num_emb_ps`` PS; None without any
        training time on record."""
        if self.ps_seconds <= 0:
            return None
        return self.ps_seconds / (self.failures + 0.5) / num_emb_ps

    def describe(self, num_emb_ps: int) -> str:
        """One line for the log: the evidence, the estimate and the prior it rests on."""
        mtbf = self.mtbf_s(num_emb_ps)
        failed = f"{self.failures} PS failure(s)" if self.failures else "no PS failure"
        return (
            f"{self.runs} past run(s) trained {duration(self.seconds)} "
            f"({self.ps_seconds:.0f} PS-seconds) with {failed}: a job on {num_emb_ps} PS "
            f"expects a PS failure every {duration(mtbf) if mtbf else '(unknown)'} "
            f"(PS-seconds / (failures + 1/2) / PS: Jeffreys prior on the failure rate)"
        )


def mtbf_from_history(runs: Iterable[FailureHistory], num_emb_ps: int) -> float | None:
    """Mean seconds between PS failures for a job with ``num_emb_ps`` PS, from past runs:
    ``PS-seconds / (failures + 1/2) / num_emb_ps`` (``FailureEvidence``).

    Failures are counted per PS-second (CPR section 3.1: MTBF falls linearly with the node
    count), then scaled to this job. With no failure observed, a job on as many PS as the
    history's runs gets twice their training time. None without any history.
    """
    return FailureEvidence.of(runs).mtbf_s(num_emb_ps)


@dataclass(frozen=True)
class CheckpointPlan:
    """What the master runs: the policy in effect, its save intervals and why.

    ``policy`` may differ from ``requested`` (CPR fell back to full recovery). ``interval_s``
    is T_save (full saves; for ECRM the backup interval, None: none); ``partial_interval_s``
    is the MFU/SSU save interval ``r*T_save`` (None otherwise).
    """

    requested: PolicyName
    policy: PolicyName
    interval_s: float | None
    partial_interval_s: float | None
    overhead: Overhead
    expected_pls: float
    reason: str
    variant: CprVariant | None = None
    r: float | None = None
    k: int | None = None
    alternatives: dict[str, float] = field(default_factory=dict)  # overhead of the others


def pct(x: float) -> str:
    return f"{100.0 * x:.2f}%"


def duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"
