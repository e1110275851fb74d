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

    def __post_init__(self) -> None:
        for name in ("load_s", "reschedule_s", "ecrm_normal_overhead"):
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


# ----------------------------------------------------------------------------- history


@dataclass(frozen=True)
class FailureHistory:
    """One past run: how long it trained, with how many embedding PS, how many PS failed."""

    seconds: float
    num_ps: int
    ps_failures: int


def mtbf_from_history(runs: Iterable[FailureHistory], num_emb_ps: int) -> float | None:
    """Mean seconds between PS failures for a job with ``num_emb_ps`` PS, from past runs.

    Failures are counted per PS-second (CPR section 3.1: MTBF falls linearly with the node
    count), then scaled to this job. A history without any failure counts one, a conservative
    guess rather than an infinite MTBF. None without any history.
    """
    ps_seconds = 0.0
    failures = 0
    for run in runs:
        if run.seconds < 0 or run.num_ps < 1 or run.ps_failures < 0:
            raise ValueError(f"invalid history entry {run!r}")
        ps_seconds += run.seconds * run.num_ps
        failures += run.ps_failures
    if ps_seconds <= 0:
        return None
    return ps_seconds / max(failures, 1) / num_emb_ps


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
