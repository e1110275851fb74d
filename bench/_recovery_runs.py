"""The runs of ``bench/recovery.py``: the failure-free job, and the job under each policy.

Time is kept two ways. The save schedule and the failures are placed in training steps (a
save interval in seconds becomes ``interval / step_s`` steps, with ``step_s`` the failure-free
run's time per step), so every policy sees the same failures at the same samples and a
rollback replays exactly the samples it lost. The overhead is charged like CPR's emulation
(section 5.1) charges it, from costs measured in this process:

* each save: the slowest PS's measured save time (in a cluster the PS save in parallel);
* each failure: the measured load (the failed PS's, or the slowest PS's for full recovery);
* full recovery: the retrained samples at the run's own median time per step (lost
  computation), and the failure-free time is that same time per step times the steps;
* CPR-SSU: nothing per step (its rows are drawn at save time from the access counters,
  inside the save);
* ECRM: the measured difference-propagation time of normal steps, plus the time the steps
  during a rebuild took beyond normal steps, plus its backup saves;
* rescheduling a replacement (O_res) is 0: nothing is rescheduled here.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from airflow_rover.core.checkpoint_files import read_npz, write_npz
from airflow_rover.core.cpr import CprSaveSchedule, PlsTracker
from airflow_rover.core.policies import (
    CheckpointCosts,
    CheckpointPlan,
    CheckpointPolicyConfig,
    plan_checkpoints,
)
from bench._recovery_ckpt import CheckpointStore
from bench._recovery_cluster import BATCH_SIZE, Cluster, DenseNet, Workload
from bench._recovery_ecrm import EcrmHooks, Verdict

WARMUP_STEPS = 5  # excluded from the failure-free time per step (first-touch pages)
CALIBRATION_REPEATS = 5
FAILURES = 2  # per job, as in CPR's emulation (a 56-hour job's average)
TARGET_PLS = 0.1
R = 0.125
SSU_SAMPLE_PERIOD = 2
MIN_FAILURE_GAP = 0.15  # of the job: one rebuild ends before the next failure


@dataclass(frozen=True)
class Failure:
    step: int
    ps: int


def failure_schedule(steps: int, num_ps: int, seed: int) -> list[Failure]:
    """``FAILURES`` failures at seeded uniform times (the same share of the job for every
    PS count and policy), each losing a seeded random PS."""
    times = np.random.default_rng([seed, 0xFA11])
    while True:
        at = np.sort(times.uniform(0.05, 0.95, FAILURES))
        if FAILURES < 2 or np.diff(at).min() >= MIN_FAILURE_GAP:
            break
    which = np.random.default_rng([seed, 0x5E, num_ps]).integers(0, num_ps, FAILURES)
    return [Failure(round(a * steps), int(p)) for a, p in zip(at, which, strict=True)]


@dataclass
class Baseline:
    """The failure-free run of the job with ``num_ps`` PS and what checkpoints cost it."""

    num_ps: int
    auc: float
    step_s: float
    steps: int
    rows: int
    save_s: float
    load_s: float
    partial_save_s: float
    save_bytes: int  # a full save's PS files
    wall_s: float

    @property
    def total_s(self) -> float:
        return self.step_s * self.steps

    def costs(self) -> CheckpointCosts:
        return CheckpointCosts(
            save_s=self.save_s,
            load_s=self.load_s,
            mtbf_s=self.total_s / FAILURES,
            num_emb_ps=self.num_ps,
            reschedule_s=0.0,
            partial_save_s=self.partial_save_s,
        )


@dataclass
class RecoveryStats:
    """ECRM: one failure's rebuild against reloading the lost partition's checkpoint."""

    rebuild_s: float
    rows_s: float
    reload_s: float
    throughput_ratio: float
    steps_during: float  # steps trained while rebuilding, pro rata
    verdict: Verdict
    chunks: int
    held: int


@dataclass(frozen=True)
class PartialStats:
    """CPR-MFU/SSU: what the partial saves wrote and what each restore read."""

    saves: int
    rows: int
    bytes: int
    restore_bytes: list[int]  # per restore: the files it read
    table_bytes: list[int]  # per restore: the lost PS's full table then
    folds: int
    fold_s: float  # folding the chains, in the background


@dataclass
class RunResult:
    policy: str
    num_ps: int
    auc: float
    save_s: float = 0.0
    load_s: float = 0.0
    lost_s: float = 0.0
    other_s: float = 0.0  # ECRM: slower steps while rebuilding
    running: float = 0.0  # ECRM: the busiest PS's parity work, share of the step time
    serial_running: float = 0.0  # ECRM: all PS's parity work (as this process does it)
    overhead: float = 0.0  # share of the failure-free training time
    model_overhead: float = 0.0  # the formula (core.policies) at the measured costs
    pls: float = 0.0
    saves: int = 0
    retrained_steps: int = 0
    interval_steps: float | None = None
    note: str = ""
    recoveries: list[RecoveryStats] = field(default_factory=list)
    partial: PartialStats | None = None
    wall_s: float = 0.0


def _train_all(cluster: Cluster, steps: int) -> list[float]:
    times = []
    for step in range(steps):
        start = time.perf_counter()
        cluster.train_step(step)
        times.append(time.perf_counter() - start)
    return times


def run_baseline(work: Workload, net: DenseNet, num_ps: int, root: Path) -> Baseline:
    """The job without failures, then its checkpoint costs measured on the trained tables
    (the fastest of a few full saves, loads of every PS and MFU saves of r*N rows: other
    processes on the machine only ever add to them)."""
    started = time.perf_counter()
    cluster = Cluster(work, num_ps, net)
    times = _train_all(cluster, work.steps)
    auc = cluster.evaluate()
    step_s = statistics.median(times[WARMUP_STEPS:])  # robust to other processes' bursts
    store = CheckpointStore(root / f"calibrate-{num_ps}")
    saves, loads, partial = [], [], []
    for _ in range(CALIBRATION_REPEATS):
        saves.append(store.save_full(cluster, 0).pause)
        loads.append(max(store.load_ps(cluster, p) for p in range(num_ps)))
        partial.append(store.save_partial(cluster, R, "mfu").pause)
    store.close()
    return Baseline(
        num_ps=num_ps,
        auc=auc,
        step_s=step_s,
        steps=work.steps,
        rows=cluster.rows_held(),
        save_s=min(saves),
        load_s=min(loads),
        partial_save_s=min(partial),
        save_bytes=store.full_bytes,
        wall_s=time.perf_counter() - started,
    )


def plan_for(policy: str, base: Baseline) -> CheckpointPlan:
    """What ``core.policies`` schedules for ``policy`` at the measured costs."""
    costs = base.costs()
    mtbf = costs.mtbf_s
    if policy in ("full", "partial"):
        cfg = CheckpointPolicyConfig(policy="full", mtbf_s=mtbf)
    else:
        variant = policy.removeprefix("cpr-")
        cfg = CheckpointPolicyConfig.model_validate(
            {
                "policy": "cpr",
                "mtbf_s": mtbf,
                "cpr": {
                    "variant": variant,
                    "target_pls": TARGET_PLS,
                    "r": R,
                    "ssu_sample_period": SSU_SAMPLE_PERIOD,
                },
            }
        )
    return plan_checkpoints(cfg, costs)


def run_checkpointed(
    work: Workload,
    net: DenseNet,
    base: Baseline,
    policy: str,
    failures: list[Failure],
    root: Path,
) -> RunResult:
    """Full recovery, naive partial recovery or CPR (vanilla / MFU / SSU) through the job."""
    started = time.perf_counter()
    plan = plan_for(policy, base)
    if policy == "partial":  # CPR's "partial (naive)": full recovery's interval
        mode, variant = "partial", "vanilla"
    else:
        mode = "full" if plan.policy == "full" else "partial"
        variant = plan.variant or "vanilla"
    cluster = Cluster(work, base.num_ps, net)
    if variant == "ssu":
        cluster.enable_ssu(R, SSU_SAMPLE_PERIOD)
    store = CheckpointStore(root / f"{policy}-{base.num_ps}")
    interval = plan.interval_s or math.inf
    schedule = CprSaveSchedule(interval, variant if mode == "partial" else "vanilla", R)  # type: ignore[arg-type]
    pls = PlsTracker(work.num_train, base.num_ps)
    result = RunResult(policy, base.num_ps, 0.0, interval_steps=interval / base.step_s)
    if plan.policy != plan.requested and policy != "partial":
        result.note = "fell back to full recovery (CPR's benefit check)"
    pending = list(failures)
    own: list[float] = []  # this run's step times
    step = 0
    while step < work.steps:
        samples = step * BATCH_SIZE
        due = schedule.due(step * base.step_s)
        if due is not None:
            if due.kind == "full":
                result.save_s += store.save_full(cluster, step).pause
                pls.checkpoint(samples)
            else:
                result.save_s += store.save_partial(cluster, R, variant).pause
                if due.cycle_start:
                    pls.checkpoint(samples)
            result.saves += 1
        if pending and pending[0].step == step:
            failure = pending.pop(0)
            if mode == "full":
                result.load_s += store.load_all(cluster).pause
                redo = step - store.last_full_step
                result.retrained_steps += redo
                step = store.last_full_step
                continue
            if variant == "vanilla":
                result.load_s += store.load_ps(cluster, failure.ps)
            else:
                result.load_s += store.load_chain(cluster, failure.ps)  # SSU lists start empty
            pls.failure(samples)
        start = time.perf_counter()
        cluster.train_step(step)
        own.append(time.perf_counter() - start)
        step += 1
    store.close()
    result.partial = PartialStats(
        saves=store.partial_saves,
        rows=store.partial_rows,
        bytes=store.partial_bytes,
        restore_bytes=store.restore_bytes,
        table_bytes=store.table_bytes_at_restore,
        folds=store.folds,
        fold_s=store.fold_s,
    )
    result.auc = cluster.evaluate()
    result.pls = pls.pls
    # Charged at this run's own time per step (the machine may be busier or quieter than
    # during the failure-free run): redone samples and the failure-free time alike.
    step_s = statistics.median(own[WARMUP_STEPS:])
    result.lost_s = result.retrained_steps * step_s
    total = result.save_s + result.load_s + result.lost_s + result.other_s
    result.overhead = total / (step_s * work.steps)
    result.model_overhead = plan.overhead.total
    result.wall_s = time.perf_counter() - started
    return result


def run_ecrm(
    work: Workload,
    net: DenseNet,
    base: Baseline,
    k: int,
    rows_per_lock: int,
    failures: list[Failure],
    root: Path,
) -> RunResult:
    """ECRM with ``k`` rows per parity: parity kept up to date on every push, each failure
    rebuilt from parity in a background thread while training goes on, plus the backup
    checkpoint ``core.policies`` schedules for it."""
    started = time.perf_counter()
    cluster = Cluster(work, base.num_ps, net)
    hooks = EcrmHooks(cluster, k, rows_per_lock)
    cluster.hooks = hooks
    costs = base.costs()
    cfg = CheckpointPolicyConfig.model_validate(
        {"policy": "ecrm", "mtbf_s": costs.mtbf_s, "ecrm": {"k": k, "rows_per_lock": rows_per_lock}}
    )
    backup = plan_checkpoints(cfg, costs).interval_s or math.inf
    schedule = CprSaveSchedule(backup, "vanilla")
    store = CheckpointStore(root / f"ecrm{k}-{base.num_ps}")
    result = RunResult(f"ecrm-k{k}", base.num_ps, 0.0, interval_steps=backup / base.step_s)
    starts: list[float] = []
    ends: list[float] = []
    parity: list[float] = []
    busiest: list[float] = []
    reloads: list[float] = []
    pending = list(failures)
    for step in range(work.steps):
        due = schedule.due(step * base.step_s)
        if due is not None:
            hooks.join()  # a backup is a consistent save: not during a rebuild
            result.save_s += store.save_full(cluster, step).pause
            result.saves += 1
        start = time.perf_counter()
        if pending and pending[0].step == step:
            failure = pending.pop(0)
            reloads.append(_reload_time(cluster, failure.ps, root / f"reload-{k}-{base.num_ps}"))
            start = time.perf_counter()
            hooks.fail(failure.ps, step)
        before = cluster.clock.parity
        hooks.take_busiest()
        cluster.train_step(step)
        starts.append(start)
        ends.append(time.perf_counter())
        parity.append(cluster.clock.parity - before)
        busiest.append(hooks.take_busiest())
    hooks.join()
    result.auc = cluster.evaluate()
    _charge_ecrm(result, hooks, starts, ends, parity, busiest, reloads)
    over = plan_checkpoints(
        cfg,
        CheckpointCosts(
            **{
                **vars(costs),
                "ecrm_normal_overhead": result.running,
                "ecrm_recovery_drop": _mean_drop(result),
                "ecrm_rebuild_s": statistics.fmean(r.rebuild_s for r in result.recoveries),
            }
        ),
    ).overhead
    result.model_overhead = over.total
    result.wall_s = time.perf_counter() - started
    return result


def _mean_drop(result: RunResult) -> float:
    return min(1.0, max(0.0, 1.0 - statistics.fmean(r.throughput_ratio for r in result.recoveries)))


def _reload_time(cluster: Cluster, p: int, where: Path) -> float:
    """What checkpoint recovery of this partition costs: its rows written now as a real
    checkpoint part (not timed), then checksum + ``np.load`` + ``restore`` into a fresh PS."""
    path = where / f"ps-{p}.npz"
    write_npz(path, cluster.ps[p].snapshot().items())
    start = time.perf_counter()
    cluster.new_ps(p).restore(read_npz(path))
    return time.perf_counter() - start


def _charge_ecrm(
    result: RunResult,
    hooks: EcrmHooks,
    starts: list[float],
    ends: list[float],
    parity: list[float],
    busiest: list[float],
    reloads: list[float],
) -> None:
    """From this run's own steps: the running cost (the busiest PS's parity work per normal
    step over the step time without parity: PS propagate in parallel in a cluster, here one
    after the other), each rebuild's throughput (steps begun during it against as many
    normal steps just before it) and the extra time those steps took."""
    start = np.array(starts)
    end = np.array(ends)
    par = np.array(parity)
    busy = np.array(busiest)
    during = np.zeros(start.size, dtype=bool)
    for rb in hooks.rebuilds:
        during |= (start >= rb.started) & (start < rb.done_at)
        during[rb.step] = True
    normal = ~during
    normal[:WARMUP_STEPS] = False
    dur = end - start
    running = float(busy[normal].sum() / (dur[normal] - par[normal]).sum())
    result.serial_running = float(par[normal].sum() / (dur[normal] - par[normal]).sum())
    normal_step = float(np.median(dur[normal]))
    extra = 0.0
    for rb, reload_s in zip(hooks.rebuilds, reloads, strict=True):
        # Steps done within [failure, rebuild done], a step cut by either end pro rata.
        window = rb.done_at - rb.started
        inside = np.clip(np.minimum(end, rb.done_at) - np.maximum(start, rb.started), 0, None)
        n = float((inside / dur).sum())
        before = np.arange(max(WARMUP_STEPS, rb.step - max(20, math.ceil(n))), rb.step)
        before = before[normal[before]]
        normal_rate = before.size / float(dur[before].sum())
        rate = n / window
        extra += max(0.0, window - n * normal_step)
        result.recoveries.append(
            RecoveryStats(
                rebuild_s=rb.seconds,
                rows_s=rb.rows_seconds,
                reload_s=reload_s,
                throughput_ratio=rate / normal_rate,
                steps_during=n,
                verdict=hooks.verify(rb),
                chunks=rb.chunks,
                held=rb.held,
            )
        )
    base_time = float((dur[normal] - par[normal]).mean()) * start.size
    result.running = running
    result.other_s = extra
    result.overhead = running + (extra + result.save_s) / base_time
