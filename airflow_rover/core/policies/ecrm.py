"""Erasure coding, ECRM (ECRM paper sections 3, 4.3): each PS holds the parity of ``k`` rows
of ``k`` other PS; a lost PS is rebuilt from it while training goes on, with no rollback and no
pause. The workers train through the loss itself, decoding the lost rows
(``core.ecrm.degraded``); the replacement starts empty and the PS rebuild it (``ps.ecrm``).

Cost: a near-constant throughput cost in normal operation plus a slower phase while a lost PS
is rebuilt, and ``1/k`` (``xor``) or ``2/k`` (``sum``, float64 parity) extra memory; a rare
backup checkpoint guards against two PS lost at once (section 4.4).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Literal

from pydantic import Field, field_validator

from airflow_rover.core.ecrm.degraded import EcrmReads
from airflow_rover.core.ecrm.placement import ParityPlacement
from airflow_rover.core.policies.base import (
    CheckpointPolicy,
    MasterPort,
    NodeJob,
    PsLoss,
    PsUnreachable,
    in_background,
)
from airflow_rover.core.policies.costs import (
    CheckpointCosts,
    CheckpointPlan,
    Overhead,
    duration,
    pct,
)
from airflow_rover.core.policies.full import optimal_full_interval
from airflow_rover.core.policies.options import (
    CheckpointPolicyError,
    PolicyOptions,
    check_choice,
    check_range,
    invalid,
)
from airflow_rover.core.states import TERMINAL_STATES, JobState

log = logging.getLogger(__name__)

EcrmCodec = Literal["sum", "xor"]
ECRM_CODECS: tuple[str, ...] = ("sum", "xor")
# ECRM section 4.4: a much rarer checkpoint stays as a second line of defence against two
# PS lost at once; by default 10x the optimal full-recovery interval.
ECRM_BACKUP_FACTOR = 10.0


class EcrmOptions(PolicyOptions):
    """Erasure coding (ECRM): parity of k rows on another PS, rebuilt without a rollback."""

    section = "ecrm"
    k: int = Field(default=4, description="rows (from k different PS) per parity row; needs k+1 PS")
    rows_per_lock: int = Field(
        default=65_536,
        description="rows a rebuild decodes per lock: smaller buffers less, switches more",
    )
    codec: EcrmCodec = Field(
        default="sum",
        description="sum: float64 parity (the paper's, 2/k extra memory, a degraded read during "
        "an update is off by that update at most); xor: bit-exact, 1/k extra memory",
    )
    backup_interval_s: float | None = Field(
        default=None,
        description="a rare full checkpoint against two PS lost at once (ECRM section 4.4); "
        "default 10x the optimal full-recovery interval, 0: none",
    )

    @field_validator("k")
    @classmethod
    def _k(cls, v: int, info: Any) -> int:
        if not 2 <= v <= 64:
            raise invalid(
                f"{cls.option(info.field_name)}={v!r}: must be in [2, 64] "
                "(k=1 would be plain replication)"
            )
        return v

    @field_validator("rows_per_lock")
    @classmethod
    def _rows(cls, v: int, info: Any) -> int:
        if v < 1:
            raise invalid(f"{cls.option(info.field_name)}={v!r}: must be >= 1")
        return v

    @field_validator("codec", mode="before")
    @classmethod
    def _codec(cls, v: Any, info: Any) -> Any:
        return check_choice(cls.option(info.field_name), v, ECRM_CODECS)

    @field_validator("backup_interval_s")
    @classmethod
    def _backup(cls, v: float | None, info: Any) -> float | None:
        if v is None:
            return None
        return check_range(cls.option(info.field_name), v, 0.0, None, low_open=False)


def ecrm_parity_fraction(k: int, codec: str = "sum") -> float:
    """Parity memory as a share of the encoded rows and optimizer state: one parity row per k
    rows, float64 for ``sum`` (twice a float32 row), the rows' own width for ``xor``."""
    return (2.0 if codec == "sum" else 1.0) / k


def ecrm_overhead(
    costs: CheckpointCosts, k: int, backup_interval_s: float | None = None
) -> Overhead:
    """ECRM's expected overhead: parity updates all the time, a slower phase per failure.

    Per failure: rescheduling plus ``drop * T_rebuild`` (training goes on at ``1 - drop`` of
    its throughput while the replacement decodes, ECRM section 3.4), ``T_rebuild`` default
    ``k * load_s`` (decoding reads k rows per lost row, section 3.6). Plus the rare backup
    checkpoint, if any.
    """
    rebuild = costs.ecrm_rebuild_s if costs.ecrm_rebuild_s is not None else k * costs.load_s
    backup = 0.0
    if backup_interval_s:
        backup = costs.save_s / backup_interval_s
    return Overhead(
        save=backup,
        reschedule=costs.reschedule_s / costs.mtbf_s,
        running=costs.ecrm_normal_overhead,
        recovery=costs.ecrm_recovery_drop * rebuild / costs.mtbf_s,
    )


class ErasureCoding(CheckpointPolicy):
    name = "ecrm"
    Options = EcrmOptions
    options: EcrmOptions

    def __init__(self, options: PolicyOptions, mtbf_s: float | None = None) -> None:
        super().__init__(options, mtbf_s)
        self._live = False  # parity is kept once every PS was set up
        self._encode = False  # the PS restored rows: their parity is encoded again at set-up
        self._pending: set[int] = set()  # replacements to rebuild once they are up
        self.rebuilds: dict[int, dict[str, Any]] = {}  # PS index -> its last rebuild

    # -- planning ------------------------------------------------------------------------------
    def plan(self, costs: CheckpointCosts) -> CheckpointPlan:
        self.check_cluster(costs.num_emb_ps)
        k, codec = self.options.k, self.options.codec
        backup = self._backup_interval(costs)
        over = ecrm_overhead(costs, k, backup)
        memory = ecrm_parity_fraction(k, codec)
        backup_text = (
            f"backup checkpoint every {duration(backup)}" if backup else "no backup checkpoint"
        )
        return CheckpointPlan(
            requested="ecrm",
            policy="ecrm",
            interval_s=backup,
            partial_interval_s=None,
            overhead=over,
            expected_pls=0.0,
            reason=f"ecrm (k={k}, {codec} parity, +{memory:.0%} memory, {backup_text}), "
            f"expected overhead {pct(over.total)}",
            k=k,
        )

    def _backup_interval(self, costs: CheckpointCosts) -> float | None:
        if self.options.backup_interval_s is not None:
            return self.options.backup_interval_s or None
        backup = ECRM_BACKUP_FACTOR * optimal_full_interval(costs.save_s, costs.mtbf_s)
        return max(backup, costs.min_interval_s)

    @property
    def min_ps(self) -> int:
        return self.options.k + 1

    def check_cluster(self, num_ps: int) -> None:
        k = self.options.k
        if num_ps < k + 1:
            raise CheckpointPolicyError(
                f"ecrm.k={k}: needs at least k+1={k + 1} parameter servers, the job has "
                f"{num_ps}; lower ecrm.k or add PS"
            )

    def check_runtime(self) -> None:
        if self.options.codec != "sum":
            raise CheckpointPolicyError(
                f"ecrm.codec={self.options.codec!r}: the runtime serves a lost PS's rows by "
                "decoding them while it is rebuilt, which only the summation code tolerates "
                "while updates are in flight; accepted: sum"
            )

    # -- the master ------------------------------------------------------------------------------
    def on_master_start(self, master: MasterPort, resumed: bool) -> None:
        """A rebuild a former master left unfinished is dropped: those PS restore from the
        checkpoint now, and the parity is encoded again from the rows they restore."""
        markers = master.job_dir.ecrm_rebuild_marker(0).parent
        master.job_dir.discard([markers] if markers.exists() else [], "(ECRM rebuild markers)")
        self._encode = resumed

    def prepare_ps(self, master: MasterPort) -> bool:
        """Set ECRM up on every PS, or start the rebuild of each replacement PS."""
        opts = self.options
        addresses, epochs = master.ps_addresses(), master.ps_incarnations()
        try:
            with master.ps_calls() as ps:
                if not self._live:
                    ps.ecrm_setup(opts.k, opts.rows_per_lock, addresses, epochs, self._encode)
                    self._live = True
                    log.info(
                        "ECRM: parity of k=%d rows on the next PS, %d PS", opts.k, len(addresses)
                    )
                for index in sorted(self._pending):
                    with master.unlocked():  # the set-up (~0.1 s): the workers train on
                        reply = ps.ecrm_rebuild(
                            index, opts.k, opts.rows_per_lock, addresses, epochs
                        )
                    if master.state in TERMINAL_STATES:
                        return False
                    self._pending.discard(index)
                    self.rebuilds[index] = {
                        "node": f"ps-{index}",
                        "incarnation": epochs[index],
                        "started_at": time.time(),
                        "done": False,
                        "rows": int(reply.get("rows_total", [0])[0]),
                    }
        except PsUnreachable as exc:
            log.warning("ECRM setup or rebuild could not reach a PS (%s); next tick", exc)
            return False
        return True

    def on_ps_lost(self, master: MasterPort, index: int, cause: str) -> PsLoss | None:
        """Once parity is kept, the replacement starts empty and is rebuilt from it while the
        workers train on; one lost PS at a time."""
        if not self._live:
            return super().on_ps_lost(master, index, cause)
        others = sorted(i for i in (*self._pending, *self._active()) if i != index)
        if others:
            master.fail(
                f"{cause} while ps-{others[0]} is being rebuilt from parity: ECRM recovers "
                "one lost PS at a time; a retry resumes from the last checkpoint"
            )
            return None
        marker = master.job_dir.ecrm_rebuild_marker(index)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        self._pending.add(index)
        return PsLoss(workers_train_on=True, how="to rebuild it from parity (ECRM)")

    def on_recovered(self, master: MasterPort) -> None:
        """The workers trained on through the loss and keep their shards; one may hold a batch
        the lost PS applied but never passed on to its holders, which the replacement lacks:
        checked when the shard is reported done."""
        master.recheck_when_done(set(master.queue.leased()))

    def trains_through_loss(self, state: JobState) -> bool:
        return state == JobState.RECOVERING and self._live and bool(self._pending or self._active())

    @property
    def busy(self) -> bool:
        return bool(self._active())

    def _active(self) -> list[int]:
        return [i for i, r in self.rebuilds.items() if not r["done"]]

    def poll(self, master: MasterPort) -> None:
        """Follow each replacement's rebuild; once done, its checkpoints and plans resume."""
        for index in self._active():
            try:
                with master.ps_calls() as ps:
                    status = ps.ecrm_status(index)
            except PsUnreachable:
                continue  # the replacement died: the exit is handled as a PS loss
            if int(status["rebuilding"][0]):
                continue
            record = self.rebuilds[index]
            record.update(rebuild_record(status))
            master.job_dir.ecrm_rebuild_marker(index).unlink(missing_ok=True)
            if "error" in status:
                record["error"] = error = status["error"].tobytes().decode()
                master.fail(f"ps-{index}: ECRM rebuild failed: {error}")
                return
            log.info(
                "ps-%d rebuilt from parity: %d rows and parity slots in %.2f s while training "
                "went on (%d updates held, %d rows served by decoding)",
                index,
                record["rows"],
                record["seconds"],
                record["held_rows"],
                record["degraded_rows"],
            )

    def declines_ps_resize(self) -> str | None:
        return (
            "checkpoint_policy='ecrm': a PS resize would need the parity encoded again for "
            "the new PS count"
        )

    def report(self) -> dict[str, Any]:
        return {"ecrm_rebuilds": [self.rebuilds[i] for i in sorted(self.rebuilds)]}

    @classmethod
    def empty_report(cls) -> dict[str, Any]:
        return {"ecrm_rebuilds": []}

    # -- the nodes -------------------------------------------------------------------------------
    def _placement(self, job: NodeJob) -> ParityPlacement:
        return ParityPlacement(
            job.num_ps, self.options.k, job.vocab_sizes, positional=job.raw_groups
        )

    def on_standby_ps(self, job: NodeJob) -> None:
        """The parity placement is worked out while the spare waits, so a rebuild starts
        without it."""
        self._placement(job).warm()

    def ps_starts_empty(self, job: NodeJob, index: int) -> bool:
        """A replacement of a lost PS starts empty (rebuilt from parity, not restored); the
        rebuild needs where every row's parity is, worked out while it starts."""
        if not job.job_dir.ecrm_rebuild_marker(index).exists():
            return False
        in_background(self._placement(job).warm, "ecrm-placement")
        return True

    def degraded_reads(self, job: NodeJob, optimizer: Any) -> EcrmReads:
        """A lost PS's rows are decoded by the worker until its replacement is up (but for
        groups of raw ids: the worker waits for those)."""
        return EcrmReads(self.options.k, dict(job.vocab_sizes), optimizer, job.raw_groups)


def rebuild_record(status: Any) -> dict[str, Any]:
    """A finished rebuild as the job's recovery summary keeps it (from the PS's status)."""
    return {
        "done": True,
        "rows": int(status["rows_total"][0]),
        "chunks": int(status["chunks"][0]),
        "seconds": round(float(status["seconds"][0]), 3),
        "rows_seconds": round(float(status["rows_seconds"][0]), 3),
        "held_rows": int(status["held_rows"][0]),
        "degraded_rows": int(status["degraded_rows"][0]),
        # when the PS finished, not when this (ticking) master asked
        "finished_at": float(status["done_unix"][0]) if "done_unix" in status else time.time(),
    }
