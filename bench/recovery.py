"""Recovery from parameter-server failures under each checkpoint policy, CPR-style.

Emulates the methodology of CPR's section 5.1 (``papers/cpr-partial-recovery.txt``) on the
synthetic Criteo-shaped data: one epoch of a Wide&Deep model whose embedding rows live in
real ``airflow_rover.ps`` parameter servers (``bench/_recovery_cluster.py``), once without
failures and then with 2 injected PS failures at seeded uniform times, each losing one PS's
rows: 8 PS (a failure clears 12.5% of the rows), 4 PS (25%) and 2 PS (50%). Policies:

- full: every PS and the dense model roll back to the last full checkpoint
  (``T_save = sqrt(2*O_save*T_fail)``) and the samples since are trained again;
- partial (naive): only the failed PS reloads its last save, at full recovery's interval;
- cpr-vanilla: the same with the interval from the PLS target 0.1 (``T_save = 2*PLS*N*T_fail``),
  CPR's benefit check deciding (``core.policies.plan_checkpoints``);
- cpr-mfu / cpr-ssu: r = 0.125 of each PS's rows every ``r*T_save`` (most-used rows by the PS's
  access counters / drawn from them by ``SsuSampler``: ``ParameterServer.partial_save``),
  restored from the chain ``core.cpr_chain.PartialChain`` folds off the timed pauses;
- ecrm k=2 / k=4: parity of k rows on other PS, kept current by difference propagation; a
  lost PS is decoded chunk by chunk in a background thread while training goes on
  (``core.ecrm``, ``bench/_recovery_ecrm.py``); needs k+1 PS.

Per policy and failure size it prints the overhead against the failure-free run (from the
save, load and failure costs measured in this process, as ``bench/_recovery_runs.py``
explains), the formula's estimate at the same costs, the held-out AUC change and the PLS; for
ECRM also each rebuild against reloading that PS's checkpoint and against recovering from it
(the reload plus the samples trained again, as ECRM's paper compares), the training throughput
during the rebuild against normal steps of the same run, and whether every decoded row is the
lost one. Goals (issues 7 and 29) end the output as MET / NOT MET; the exit code is 0 when all
are met. Per failure size it also prints each CPR variant against CPR's model bound, and what
the MFU/SSU partial saves wrote and their restores read.

The job's length sets how save cost compares with the time between failures. CPR's emulation
scales its overheads down to keep the production ratio (O_save/T_fail about 0.0034); the
default 1.2M samples (about 20 s of training, T_fail = 10 s) brings the measured ratio to
0.0017-0.006 across the PS counts, where 300k samples gave 2-4.5 times production's.

    python bench/recovery.py              # 1.2M samples, about 10 minutes on 2 cores
    python bench/recovery.py --quick      # 20k samples, under a minute: a smoke run
    python bench/recovery.py --seed 3 --sizes 12.5,50
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_rover.core.policies import (
    cpr_interval,
    full_overhead,
    optimal_full_interval,
    partial_overhead,
)
from bench._recovery_cluster import BATCH_SIZE, DenseNet, load_workload
from bench._recovery_runs import (
    FAILURES,
    TARGET_PLS,
    Baseline,
    Failure,
    R,
    RunResult,
    failure_schedule,
    run_baseline,
    run_checkpointed,
    run_ecrm,
)

NUM_TRAIN, NUM_EVAL = 1_200_000, 50_000
QUICK_TRAIN, QUICK_EVAL = 20_000, 5_000
SIZES = {"12.5": 8, "25": 4, "50": 2}  # share of the rows a failure clears -> PS count
CPR_POLICIES = ("full", "partial", "cpr-vanilla", "cpr-mfu", "cpr-ssu")
ECRM_K = (2, 4)
ROWS_PER_LOCK = 4096
LABELS = {
    "full": "full",
    "partial": "partial (naive)",
    "cpr-vanilla": "cpr-vanilla",
    "cpr-mfu": "cpr-mfu",
    "cpr-ssu": "cpr-ssu",
    "ecrm-k2": "ecrm k=2",
    "ecrm-k4": "ecrm k=4",
}
CPR_VARIANTS = ("cpr-vanilla", "cpr-mfu", "cpr-ssu")
GOAL_CPR_BELOW_FULL = 0.90  # vanilla and MFU, at these sizes (at 50% the model allows less)
GOAL_BELOW_FULL_SIZES = ("12.5", "25")
GOAL_OF_BOUND = 0.95  # every variant's "below full" against CPR's model bound
GOAL_VS_VANILLA = 1.3  # MFU's and SSU's overhead against vanilla's
GOAL_AUC_LOSS = 0.0005
GOAL_ECRM_SPEEDUP = 5.0
GOAL_ECRM_THROUGHPUT = 0.85
# O_save/T_fail of CPR's production job, which its emulation keeps (section 5.1): back-solved
# from Figure 7 (full 8.5% -> partial 4.4% is the lost computation T_save/2 = sqrt(2*x)/2).
CPR_PRODUCTION_RATIO = 0.0034

Goal = tuple[str, bool, str]


def table(header: list[str], widths: list[int], lines: list[list[str]]) -> None:
    """The first column left-aligned, the others right-aligned (as ``bench/simulator.py``)."""

    def fmt(cells: list[str]) -> str:
        first = f"{cells[0]:<{widths[0]}}"
        rest = (f"{c:>{w}}" for c, w in zip(cells[1:-1], widths[1:-1], strict=True))
        return "  ".join([first, *rest, cells[-1]]).rstrip()

    head = fmt(header)
    print(head)
    print("-" * len(head))
    for cells in lines:
        print(fmt(cells))


def pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def breakdown(run: RunResult) -> str:
    """Where the overhead went, in ms: saves / loads / retrained samples / the rest."""
    parts = (run.save_s, run.load_s, run.lost_s, run.other_s)
    return "/".join(f"{1e3 * s:.0f}" for s in parts)


def policy_rows(size: str, base: Baseline, runs: dict[str, RunResult | str]) -> list[list[str]]:
    full = runs["full"]
    full_over = full.overhead if isinstance(full, RunResult) else None
    lines = []
    for key in (*CPR_POLICIES, *(f"ecrm-k{k}" for k in ECRM_K)):
        run = runs[key]
        if isinstance(run, str):
            lines.append([LABELS[key], f"{size}%", str(base.num_ps), *["-"] * 8, run])
            continue
        below = "-" if key == "full" or not full_over else pct(1 - run.overhead / full_over)
        t_save = "-" if run.interval_steps is None else f"{run.interval_steps:.1f}"
        lines.append(
            [
                LABELS[key],
                f"{size}%",
                str(base.num_ps),
                pct(run.overhead),
                pct(run.model_overhead),
                below,
                f"{run.auc - base.auc:+.5f}",
                f"{run.pls:.4f}",
                str(run.saves),
                t_save,
                breakdown(run),
                run.note,
            ]
        )
    return lines


def ecrm_rows(size: str, base: Baseline, run: RunResult, ckpt_s: float) -> list[list[str]]:
    lines = []
    for i, rec in enumerate(run.recoveries):
        v = rec.verdict
        lines.append(
            [
                LABELS[run.policy],
                f"{size}%",
                str(base.num_ps),
                str(i + 1),
                f"{v.rows}",
                f"{v.exact}/{v.values}",
                f"{v.max_err:.1e}",
                "yes" if v.ok else "NO",
                f"{rec.rebuild_s:.3f}",
                f"{rec.rows_s:.3f}",
                f"{rec.reload_s:.4f}",
                f"{rec.reload_s / rec.rebuild_s:.2f}x",
                f"{ckpt_s:.3f}",
                f"{ckpt_s / rec.rebuild_s:.2f}x",
                pct(rec.throughput_ratio),
                f"{rec.steps_during:.1f}",
                f"{rec.chunks}/{rec.held}",
            ]
        )
    return lines


def checkpoint_recovery_s(full: RunResult) -> float:
    """What recovering a lost PS from the checkpoint costs the job, as ECRM's paper counts
    it (section 5.2, "time to fully recover"): the reload plus training the samples since the
    checkpoint again; the full policy's own, per failure, from the same failures."""
    return (full.load_s + full.lost_s) / FAILURES


def below_full(run: RunResult, full: RunResult) -> float:
    return 1 - run.overhead / full.overhead if full.overhead > 0 else 0.0


def bound_rows(size: str, base: Baseline, runs: dict[str, RunResult | str]) -> list[list[str]]:
    """Per CPR variant: how far below full it got against how far its model lets it."""
    full = runs["full"]
    assert isinstance(full, RunResult)
    bound = cpr_model_bound(base)
    vanilla = runs["cpr-vanilla"]
    assert isinstance(vanilla, RunResult)
    lines = []
    for key in CPR_VARIANTS:
        run = runs[key]
        assert isinstance(run, RunResult)
        below = below_full(run, full)
        vs_vanilla = run.overhead / vanilla.overhead if vanilla.overhead > 0 else 0.0
        part = run.partial
        if part is None or not part.saves:
            save_share = restore = folds = "-"
        else:
            save_share = f"{part.bytes / part.saves / (base.save_bytes or 1):.3f}"
            worst = max(
                (b / t for b, t in zip(part.restore_bytes, part.table_bytes, strict=True) if t),
                default=0.0,
            )
            restore = f"{worst:.2f}"
            folds = f"{part.folds} ({part.fold_s:.2f} s)"
        lines.append(
            [
                LABELS[key],
                f"{size}%",
                pct(run.overhead),
                pct(below),
                pct(bound),
                f"{below / bound:.3f}" if bound > 0 else "-",
                f"{vs_vanilla:.2f}x",
                save_share,
                restore,
                folds,
            ]
        )
    return lines


def goals_for(size: str, base: Baseline, runs: dict[str, RunResult | str]) -> list[Goal]:
    goals: list[Goal] = []
    full = runs["full"]
    assert isinstance(full, RunResult)
    bound = cpr_model_bound(base)
    vanilla = runs["cpr-vanilla"]
    assert isinstance(vanilla, RunResult)
    for key in CPR_VARIANTS:
        run = runs[key]
        assert isinstance(run, RunResult)
        below = below_full(run, full)
        if size in GOAL_BELOW_FULL_SIZES and key in ("cpr-vanilla", "cpr-mfu"):
            goals.append(
                (
                    f"{size}%: {key} overhead >= {GOAL_CPR_BELOW_FULL:.0%} below full",
                    below >= GOAL_CPR_BELOW_FULL,
                    f"{pct(run.overhead)} vs {pct(full.overhead)}: {below:.1%} below",
                )
            )
        share = below / bound if bound > 0 else 0.0
        goals.append(
            (
                f"{size}%: {key} within {GOAL_OF_BOUND} of CPR's model bound",
                share >= GOAL_OF_BOUND,
                f"{below:.1%} below full of the bound's {bound:.1%}: {share:.3f}",
            )
        )
    for key in ("cpr-mfu", "cpr-ssu"):
        run = runs[key]
        assert isinstance(run, RunResult)
        ratio = run.overhead / vanilla.overhead if vanilla.overhead > 0 else math.inf
        goals.append(
            (
                f"{size}%: {key} overhead <= {GOAL_VS_VANILLA}x cpr-vanilla's",
                ratio <= GOAL_VS_VANILLA,
                f"{pct(run.overhead)} vs {pct(vanilla.overhead)}: {ratio:.2f}x",
            )
        )
        loss = base.auc - run.auc
        goals.append(
            (
                f"{size}%: {key} AUC loss <= {GOAL_AUC_LOSS}",
                loss <= GOAL_AUC_LOSS,
                f"{loss:+.5f}",
            )
        )
    for k in ECRM_K:
        run = runs[f"ecrm-k{k}"]
        if isinstance(run, str):
            continue
        rebuild = statistics.fmean(r.rebuild_s for r in run.recoveries)
        ckpt = checkpoint_recovery_s(full)
        speedup = ckpt / rebuild
        goals.append(
            (
                f"{size}%: ecrm k={k} recovery >= {GOAL_ECRM_SPEEDUP:g}x faster than from the "
                "checkpoint",
                speedup >= GOAL_ECRM_SPEEDUP,
                f"rebuild {rebuild:.3f} s vs reload + lost samples {ckpt:.3f} s: {speedup:.2f}x "
                f"(reload alone {statistics.fmean(r.reload_s for r in run.recoveries):.4f} s)",
            )
        )
        ratio = statistics.fmean(r.throughput_ratio for r in run.recoveries)
        exact = all(r.verdict.ok for r in run.recoveries)
        goals.append(
            (
                f"{size}%: ecrm k={k} throughput during recovery >= {GOAL_ECRM_THROUGHPUT:.0%}",
                ratio >= GOAL_ECRM_THROUGHPUT,
                f"{ratio:.1%} of normal" + ("" if exact else "; decoded rows WRONG"),
            )
        )
    return goals


def cpr_model_bound(base: Baseline, save_ratio: float | None = None) -> float:
    """How far below full recovery CPR can get at all by its own model: eq. 2 for CPR at
    the PLS target's interval, every save costing a vanilla save's share (the paper's linear
    scaling of MFU/SSU), against eq. 1 at full recovery's optimal interval; at this job's
    measured costs or, with ``save_ratio``, with O_save/T_fail set to it (O_load scaled
    alike). No variant's measured overhead can beat this but by noise."""
    costs = base.costs()
    mtbf = costs.mtbf_s
    save, load = costs.save_s, costs.load_s
    if save_ratio is not None:
        save, load = save_ratio * mtbf, load * save_ratio * mtbf / save
    full = full_overhead(save, load, mtbf, optimal_full_interval(save, mtbf)).total
    interval = cpr_interval(TARGET_PLS, base.num_ps, mtbf)
    return 1 - partial_overhead(save, load, mtbf, interval).total / full


def describe_failures(failures: list[Failure], steps: int) -> str:
    return ", ".join(f"step {f.step} ({f.step / steps:.0%}, PS {f.ps})" for f in failures)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_TRAIN} samples")
    parser.add_argument("--num-train", type=int, default=None)
    parser.add_argument("--num-eval", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0, help="failure times and failed PS")
    parser.add_argument(
        "--sizes", default=",".join(SIZES), help=f"comma-separated, from {list(SIZES)}"
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "airflow-rover-recovery",
        help="the dataset (kept) and the checkpoints of each run",
    )
    parser.add_argument(
        "--no-ecrm", action="store_true", help="CPR's policies only (ECRM's runs take half)"
    )
    args = parser.parse_args(argv)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    if unknown := [s for s in sizes if s not in SIZES]:
        parser.error(f"--sizes: unknown {unknown}; choose from {list(SIZES)}")
    num_train = args.num_train or (QUICK_TRAIN if args.quick else NUM_TRAIN)
    num_eval = args.num_eval or (QUICK_EVAL if args.quick else NUM_EVAL)
    started = time.perf_counter()

    import tensorflow as tf

    tf.config.experimental.enable_op_determinism()
    work_dir = args.work_dir.resolve()
    work = load_workload(work_dir, num_train, num_eval)
    net = DenseNet(work.features, work.layout)
    runs_dir = work_dir / "runs"
    print(
        f"{work.num_train:,} training samples ({work.steps} steps of {BATCH_SIZE}), "
        f"{len(work.held_out):,} held out (teacher AUC {work.teacher_auc:.4f}); "
        f"{FAILURES} failures per run; os.cpu_count() = {os.cpu_count()}, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )

    lines: list[list[str]] = []
    of_bound: list[list[str]] = []
    bounds: list[str] = []
    rec_lines: list[list[str]] = []
    cost_lines: list[list[str]] = []
    parity_notes: list[str] = []
    goals: list[Goal] = []
    for size in sizes:
        num_ps = SIZES[size]
        base = run_baseline(work, net, num_ps, runs_dir)
        failures = failure_schedule(work.steps, num_ps, args.seed)
        print(
            f"  {size}% ({num_ps} PS): failure-free AUC {base.auc:.5f}, "
            f"{base.step_s * 1e3:.2f} ms/step; failures at "
            f"{describe_failures(failures, work.steps)}",
            flush=True,
        )
        runs: dict[str, RunResult | str] = {}
        for policy in CPR_POLICIES:
            runs[policy] = run_checkpointed(work, net, base, policy, failures, runs_dir)
            print(f"    {policy}: {runs[policy].wall_s:.1f} s", flush=True)  # type: ignore[union-attr]
        for k in ECRM_K:
            key = f"ecrm-k{k}"
            if args.no_ecrm:
                runs[key] = "not run (--no-ecrm)"
                continue
            if num_ps < k + 1:
                runs[key] = f"n/a: needs k+1 = {k + 1} PS, a PS holding {size}% means {num_ps}"
                continue
            ecrm = run_ecrm(work, net, base, k, ROWS_PER_LOCK, failures, runs_dir)
            runs[key] = ecrm
            full = runs["full"]
            assert isinstance(full, RunResult)
            rec_lines += ecrm_rows(size, base, ecrm, checkpoint_recovery_s(full))
            parity_notes.append(
                f"{LABELS[key]} at {size}%: parity work per step {pct(ecrm.running)} of the "
                f"step for the busiest PS, {pct(ecrm.serial_running)} for all PS in this process"
            )
            print(f"    {key}: {ecrm.wall_s:.1f} s", flush=True)
        lines += policy_rows(size, base, runs)
        of_bound += bound_rows(size, base, runs)
        bounds.append(
            f"   {size}%: {cpr_model_bound(base):.1%} at this job's costs, "
            f"{cpr_model_bound(base, CPR_PRODUCTION_RATIO):.1%} at CPR's production "
            f"O_save/T_fail = {CPR_PRODUCTION_RATIO}"
        )
        goals += goals_for(size, base, runs)
        costs = base.costs()
        cost_lines.append(
            [
                f"{size}%",
                str(num_ps),
                f"{base.rows:,}",
                f"{base.step_s * 1e3:.2f}",
                f"{base.total_s:.2f}",
                f"{base.save_s * 1e3:.1f}",
                f"{base.load_s * 1e3:.1f}",
                f"{base.partial_save_s * 1e3:.1f}",
                f"{base.save_s / costs.mtbf_s:.4f}",
            ]
        )

    print("\n== Overhead, accuracy and PLS per policy and failure size")
    header = ["policy", "lost", "PS", "overhead", "model", "vs full", "AUC delta", "PLS"]
    table(
        [*header, "saves", "T_save steps", "ms s/l/r/o", "note"],
        [16, 5, 2, 8, 8, 8, 9, 6, 5, 12, 18, 0],
        lines,
    )
    print(
        "   overhead: measured save/load pauses + retrained samples (+ ECRM parity\n"
        "   and slower steps while rebuilding) over the failure-free training time; model: CPR\n"
        f"   eq. 1/2 (ECRM: ecrm_overhead) at the measured costs; PLS target {TARGET_PLS}, "
        f"r = {R}; AUC delta vs the failure-free run.\n"
        "   ms s/l/r/o: the overhead's parts in ms: saves / loads / retrained samples / other\n"
        "   (ECRM: slower steps while rebuilding; ECRM's parity work not included)."
    )
    if rec_lines:
        print("\n== ECRM: each failure's rebuild (training goes on) vs the checkpoint's recovery")
        header = ["policy", "lost", "PS", "#", "rows", "bit-exact values", "max|err|", "ok"]
        header += ["rebuild s", "rows s", "reload s", "reload/rebuild", "ckpt s", "ckpt/rebuild"]
        header += ["throughput"]
        table(
            [*header, "steps", "chunks/held"],
            [10, 5, 2, 1, 7, 17, 8, 3, 9, 7, 8, 14, 6, 12, 10, 5, 0],
            rec_lines,
        )
        print(
            "   rebuild s: failure to the last chunk written (rows decoded, then the parity the\n"
            "   lost PS held re-encoded), in a background thread while the trainer goes on; rows\n"
            "   s: to the last decoded row. reload s: checksum + np.load + restore of that PS's\n"
            "   checkpoint file (page cache, training paused). ckpt s: the full policy's\n"
            "   recovery per failure in this job (its reloads plus the samples it trained\n"
            "   again), as ECRM's paper compares. throughput: steps done during the rebuild\n"
            "   (pro rata) per second against normal steps just before the failure."
        )
        for note in parity_notes:
            print(f"   {note}")
    print("\n== Measured costs (failure-free run, fastest of 5; T_fail = T_total / 2)")
    head = ["lost", "PS", "rows", "ms/step", "T_total s", "O_save ms", "O_load ms"]
    table(
        [*head, "O_partial ms", "O_save/T_fail"],
        [5, 2, 9, 7, 9, 9, 9, 12, 0],
        cost_lines,
    )
    print(
        "   O_save: slowest PS's snapshot + write_npz (fsynced), PS 0 with the dense model;\n"
        "   O_load: slowest PS's checksum + np.load + restore; O_partial: slowest PS's MFU save\n"
        "   of ceil(r*N) rows. Rescheduling (O_res) is 0 here. CPR's production job: about 0.0034."
    )
    print(
        "\n== The most CPR can be below full recovery by its own model (eq. 2 at the PLS"
        "\n   target's interval over eq. 1 at the optimal one; every variant at vanilla's cost)"
    )
    print("\n".join(bounds))
    print("\n== CPR against its model bound (and what MFU/SSU partial saves wrote and read)")
    head = ["variant", "lost", "overhead", "vs full", "bound", "of bound", "vs vanilla"]
    table(
        [*head, "save/full", "restore/table", "folds (s)"],
        [12, 5, 8, 8, 8, 8, 10, 9, 13, 0],
        of_bound,
    )
    print(
        "   vs full: 1 - overhead / full's; bound: the most CPR's model allows (above); of\n"
        "   bound: their ratio. save/full: bytes per partial save (every PS) over a full save's;\n"
        "   restore/table: the most a restore read over the lost PS's full table; folds: the\n"
        "   chains folded (core.cpr_chain) off the timed pauses, and the time, not charged."
    )
    print("\n== Goals")
    for text, ok, detail in goals:
        print(f"{'MET    ' if ok else 'NOT MET'}  {text}: {detail}")
    run = "quick" if args.quick else "full"
    print(f"\n(seed {args.seed}, {run} run, {time.perf_counter() - started:.1f} s)")
    return 0 if all(ok for _, ok, _ in goals) else 1


if __name__ == "__main__":
    raise SystemExit(main())
