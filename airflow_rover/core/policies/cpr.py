"""Partial recovery, CPR (CPR paper sections 2.3, 4.1, 4.2): only the lost PS reloads its
part of the last checkpoint; the others keep their progress, and the updates the lost PS had
applied since are lost for good (forgiven: recorded as applied, so nothing trains twice).

No work is redone: the overhead is ``O_save/T_save + (O_load + O_res)/T_fail``, but updates are
lost, ``E[PLS] = 0.5*T_save/(T_fail*N_emb)``, so a target PLS gives ``T_save =
2*PLS*N_emb*T_fail``. When that interval costs no less than full recovery at its optimum, CPR
falls back to full recovery and says why (section 4.2). Variants MFU and SSU save the ``r*N``
most-used (or sampled) rows every ``r*T_save`` (``partial_saves``), which a restored PS takes
over its checkpoint's.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from airflow_rover.core.checkpoint_files import checkpoint_number, read_npz_parts
from airflow_rover.core.hashing import partition_of
from airflow_rover.core.policies.base import (
    CheckpointPolicy,
    JobFiles,
    MasterPort,
    NodeJob,
    NodeTables,
    PsUnreachable,
)
from airflow_rover.core.policies.costs import (
    CheckpointCosts,
    CheckpointPlan,
    CprVariant,
    Overhead,
    duration,
    floored,
    pct,
    positive,
)
from airflow_rover.core.policies.full import FullOptions, FullRecovery
from airflow_rover.core.policies.options import PolicyOptions, check_choice, check_range, invalid

log = logging.getLogger(__name__)
CPR_VARIANTS: tuple[str, ...] = ("vanilla", "mfu", "ssu")


class CprOptions(PolicyOptions):
    """Partial recovery (CPR): only the failed PS reloads its part; PLS bounds what is lost."""

    section = "cpr"
    target_pls: float = Field(
        default=0.1, description="portion of lost samples the job may lose (CPR section 4.1)"
    )
    variant: CprVariant = Field(
        default="mfu",
        description="vanilla: save every row every T_save; mfu: the r*N most-accessed rows "
        "every r*T_save (the PS already counts accesses per row); ssu: a sub-sampled list of "
        "r*N rows every r*T_save (less memory than mfu)",
    )
    r: float = Field(default=0.125, description="share of rows one MFU/SSU save writes")
    interval_s: float | None = Field(
        default=None, description="T_save override; default 2*target_pls*N_emb*T_fail"
    )
    ssu_sample_period: int = Field(
        default=2, description="SSU keeps one access in this many (CPR section 5.1 uses 2)"
    )
    min_benefit: float = Field(
        default=0.0,
        description="fall back to full recovery unless partial recovery saves at least this "
        "share of full recovery's estimated overhead (0: it must merely be lower)",
    )
    fallback: bool = Field(
        default=True, description="False: keep partial recovery even when it costs more"
    )

    @field_validator("target_pls", "r")
    @classmethod
    def _unit(cls, v: float, info: Any) -> float:
        return check_range(cls.option(info.field_name), v, 0.0, 1.0)

    @field_validator("variant", mode="before")
    @classmethod
    def _variant(cls, v: Any, info: Any) -> Any:
        return check_choice(cls.option(info.field_name), v, CPR_VARIANTS)

    @field_validator("interval_s")
    @classmethod
    def _interval(cls, v: float | None, info: Any) -> float | None:
        return None if v is None else check_range(cls.option(info.field_name), v, 0.0, None)

    @field_validator("ssu_sample_period")
    @classmethod
    def _period(cls, v: int, info: Any) -> int:
        return int(check_range(cls.option(info.field_name), v, 1, None, low_open=False))

    @field_validator("min_benefit")
    @classmethod
    def _benefit(cls, v: float, info: Any) -> float:
        if not 0.0 <= v < 1.0:
            raise invalid(f"{cls.option(info.field_name)}={v!r}: must be in [0, 1)")
        return v


def partial_overhead(
    save_s: float,
    load_s: float,
    mtbf_s: float,
    interval_s: float,
    reschedule_s: float = 0.0,
    *,
    r: float = 1.0,
    partial_save_s: float | None = None,
) -> Overhead:
    """Eq. 2 divided by T_total: ``O_save/T_save + (O_load + O_res)/T_fail``.

    With MFU/SSU (``r < 1``) a save of ``r*N`` rows (``partial_save_s``, default ``r*save_s``)
    happens every ``r*T_save`` instead of a full save every ``T_save`` (CPR section 4.2).
    """
    positive(interval=interval_s, mtbf=mtbf_s)
    per_save = save_s if r >= 1.0 else (r * save_s if partial_save_s is None else partial_save_s)
    return Overhead(
        save=per_save / (r * interval_s) if r < 1.0 else save_s / interval_s,
        load=load_s / mtbf_s,
        reschedule=reschedule_s / mtbf_s,
    )


def cpr_interval(target_pls: float, num_emb_ps: int, mtbf_s: float) -> float:
    """``T_save = 2*PLS*N_emb*T_fail``: the interval whose expected PLS is the target (eq. 4)."""
    positive(target_pls=target_pls, num_emb_ps=num_emb_ps, mtbf=mtbf_s)
    return 2.0 * target_pls * num_emb_ps * mtbf_s


def expected_pls(interval_s: float, mtbf_s: float, num_emb_ps: int) -> float:
    """``E[PLS] = 0.5*T_save/(T_fail*N_emb)`` (CPR eq. 4): failures uniform in time, each
    losing the updates of one of N_emb PS since its last save."""
    positive(interval=interval_s, mtbf=mtbf_s, num_emb_ps=num_emb_ps)
    return 0.5 * interval_s / (mtbf_s * num_emb_ps)


class PartialRecovery(CheckpointPolicy):
    name = "cpr"
    Options = CprOptions
    options: CprOptions

    def __init__(self, options: PolicyOptions, mtbf_s: float | None = None) -> None:
        super().__init__(options, mtbf_s)
        self.partial_saves = 0
        self._last_partial = time.time()

    def plan(self, costs: CheckpointCosts) -> CheckpointPlan:
        opts = self.options
        interval, raised = opts.interval_s, ""
        if not interval:
            target = cpr_interval(opts.target_pls, costs.num_emb_ps, costs.mtbf_s)
            interval, how = floored(target, costs, "2*target_pls*N_emb*T_fail")
            raised = f" ({how})" if interval > target else ""
        r = 1.0 if opts.variant == "vanilla" else opts.r
        part = partial_overhead(
            costs.save_s,
            costs.load_s,
            costs.mtbf_s,
            interval,
            costs.reschedule_s,
            r=r,
            partial_save_s=costs.partial_save_s,
        )
        full = FullRecovery(FullOptions()).plan(costs)
        pls = expected_pls(interval, costs.mtbf_s, costs.num_emb_ps)
        label = f"cpr ({opts.variant}, T_save={duration(interval)}{raised}, expected PLS {pls:.3g})"
        problem = self._problem(raised, pls, part.total, full.overhead.total, full.interval_s)
        kept = ""
        if problem and not opts.fallback:
            kept = f"; {problem}, kept (cpr.fallback=False)"
        elif problem:
            return CheckpointPlan(
                requested="cpr",
                policy="full",
                interval_s=full.interval_s,
                partial_interval_s=None,
                overhead=full.overhead,
                expected_pls=0.0,
                reason=f"{label}{problem}, falling back to full recovery",
                alternatives={"cpr": part.total},
            )
        return CheckpointPlan(
            requested="cpr",
            policy="cpr",
            interval_s=interval,
            partial_interval_s=None if opts.variant == "vanilla" else opts.r * interval,
            overhead=part,
            expected_pls=pls,
            reason=f"{label}: {pct(part.total)} vs full recovery {pct(full.overhead.total)}{kept}",
            variant=opts.variant,
            r=None if opts.variant == "vanilla" else opts.r,
            alternatives={"full": full.overhead.total},
        )

    def _problem(
        self, raised: str, pls: float, cost: float, full_cost: float, full_interval: float | None
    ) -> str:
        """Why CPR should not run as planned ("" when it should): the interval floor puts its
        expected PLS above the target, or it costs no less than full recovery."""
        opts = self.options
        if raised and pls > opts.target_pls:
            return f": the interval floor puts it above cpr.target_pls={opts.target_pls:g}"
        if full_cost - cost > opts.min_benefit * full_cost:
            return ""
        return (
            f" would cost {pct(cost)} vs full recovery {pct(full_cost)} "
            f"(T_save={duration(full_interval or 0.0)}): no benefit"
            + (f" of at least {pct(opts.min_benefit)} of it" if opts.min_benefit else "")
        )

    # -- the master ------------------------------------------------------------------------------
    def on_master_start(self, master: MasterPort, resumed: bool) -> None:
        """A new master resumes every PS and the queue from the checkpoint and trains the
        batches after it again: the partial saves after it (newer than the queue) must not be
        restored by any PS."""
        drop_partial_saves(master.job_dir, "of the previous attempt")

    def on_ps_restored(self, master: MasterPort) -> bool:
        """The batches the restored PS lack are not trained again: each PS records the batches
        it lacks as applied, and the lost samples count towards the job's PLS."""
        try:
            with master.ps_calls() as ps:
                ledgers = [applied for applied, _ in ps.ledgers()]
                anywhere = set.union(*ledgers)
                missing = [anywhere - applied for applied in ledgers]
                ps.forgive(missing)
        except PsUnreachable as exc:
            log.warning("PS ledgers unreadable (%s); partial recovery waits", exc)
            return False
        lost = set().union(*missing)
        samples = master.queue.samples_in(lost)
        master.lost.batches += len(lost)
        master.lost.samples += samples
        log.warning(
            "partial recovery: %d batches (%d samples) lost on the restored PS, not retrained; "
            "PLS now %.5f",
            len(lost),
            samples,
            master.lost.pls(master.queue.total_samples, master.num_ps),
        )
        return True

    def save(self, master: MasterPort) -> None:
        """MFU/SSU: every ``r * T_save`` each PS saves its ``r`` most-used (or sampled) rows
        next to the last checkpoint."""
        opts, base = self.options, master.checkpoint_number
        if opts.variant == "vanilla" or base == 0:
            return
        now = time.time()
        if now - self._last_partial < opts.r * master.checkpoint_interval_s:
            return
        self._last_partial = now
        directory = master.job_dir.partial_dir(base, len(master.job_dir.partial_dirs(base)) + 1)
        try:
            with master.ps_calls() as ps:
                rows = ps.partial_save(directory, opts.variant, opts.r)
        except PsUnreachable as exc:
            log.warning("partial save %s failed (%s); the next one is due", directory.name, exc)
            return
        self.partial_saves += 1
        log.info("partial save %s (%s): %d rows", directory.name, opts.variant, rows)

    def on_commit(self, master: MasterPort, directory: Path) -> None:
        """The partial saves of checkpoints removed with this commit go with them."""
        kept = {checkpoint_number(d.name) for d in master.job_dir.checkpoint_dirs()}
        stale = [p for p in master.job_dir.partial_dirs() if int(p.name.split("-")[1]) not in kept]
        master.job_dir.discard(stale, "(CPR partial saves of removed checkpoints)")

    def on_replaced(self, master: MasterPort, by: str) -> None:
        """Under full recovery a restored PS's missing batches are trained again: the partial
        saves (made while the job ran as CPR) must not be restored."""
        drop_partial_saves(master.job_dir, f"(the job runs as {by} now)")

    def report(self) -> dict[str, Any]:
        return {"partial_saves": self.partial_saves}

    @classmethod
    def empty_report(cls) -> dict[str, Any]:
        return {"partial_saves": 0}

    # -- the parameter servers -------------------------------------------------------------------
    def setup_ps(self, ps: NodeTables, job: NodeJob) -> None:
        """SSU samples the rows each push touches into a bounded list per table."""
        if self.options.variant == "ssu":
            period, seed = self.options.ssu_sample_period, job.seed + ps.index
            for table in ps.tables.values():
                table.enable_ssu(self.options.r, period, seed)

    def after_restore(self, ps: NodeTables, job: NodeJob, checkpoint: Path) -> None:
        """The rows saved after ``checkpoint`` (most-used or sampled ones, fresher than the
        checkpoint) replace theirs, oldest save first; a damaged one is skipped."""
        apply_partial_saves(ps, job.job_dir, checkpoint, f"ps-{ps.index}")


def drop_partial_saves(job_dir: JobFiles, which: str) -> None:
    """Take every partial save of the job out of a restore's sight (``which``: why, for the
    log); raises if one cannot be (its rows would be restored twice)."""
    job_dir.discard(job_dir.partial_dirs(), f"(CPR partial saves {which})")


def apply_partial_saves(ps: NodeTables, job_dir: JobFiles, checkpoint: Path, node_id: str) -> None:
    """CPR-MFU/SSU: the rows saved after ``checkpoint`` (most-used or sampled ones, fresher
    than the checkpoint) replace theirs, oldest save first; a damaged one is skipped."""
    number = checkpoint_number(checkpoint.name)
    if number is None:
        return
    parts = [d / f"ps-{ps.index}.npz" for d in job_dir.partial_dirs(number)]
    applied = 0
    for part, arrays in read_npz_parts([p for p in parts if p.exists()]):
        if isinstance(arrays, Exception):
            log.warning("%s: partial save %s skipped: %s", node_id, part.parent.name, arrays)
            continue
        for name, table in ps.tables.items():
            prefix = f"table/{name}/"
            rows = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
            if rows and rows["ids"].size:
                mine = partition_of(name, rows["ids"].astype(np.int64), ps.num_ps) == ps.index
                table.absorb({k: v[mine] for k, v in rows.items()})
                applied += int(mine.sum())
    if applied:
        log.info("%s: %d rows from partial saves after %s", node_id, applied, checkpoint.name)
