"""Discrete-event simulation of PS training jobs under airflow-rover and the policies it must beat.

Per workload it runs one job of 200,000 global steps (DLRover-RM's evaluation: batch 512,
200k steps) under each policy and prints its job completion time (JCT), the JCT ratios against
the oracle, Optimus and ES, and the time to its final plan:

- Wide&Deep-like: I/O-bound (PS update and embedding lookups dominate) with a hot PS (one
  tensor of 30% of the parameters sits on one PS);
- xDeepFM-like: compute-bound (gradient computation dominates), parameters evenly spread.

The world (``bench/_simcore.py``) follows DLRover-RM's throughput model with the paper's
coefficients (per-workload multipliers), report noise, and scaling that costs real time (pod
start 20 s, init 100 s, 60 s of sampling after each change). Policies: ``bench/_policies.py``;
the 1,000-job trace (the cluster arbiter against FIFO on a shared budget): ``bench/_trace.py``.

    python bench/simulator.py              # the full run (a few minutes on 2 cores)
    python bench/simulator.py --quick      # a smoke run: shorter jobs, a 60-job trace
    python bench/simulator.py --seed 3

Deterministic for a given ``--seed``. Goals are printed as MET / NOT MET with the margin.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_rover.core.spec import FeatureConfig, ResourcePlan, TableConfig
from airflow_rover.core.throughput import Coefficients, JobShape, ThroughputModel
from airflow_rover.core.warm_start import JobTraits, PastJob, warm_start
from bench._policies import (
    AirflowRover,
    DLRoverHeuristic,
    ElasticScheduler,
    Optimus,
    Setting,
    Static,
    oracle_config,
)
from bench._simcore import Config, RunResult, Workload, simulate
from bench._trace import TraceResult, run_trace

PAPER = Coefficients.paper()
COLD_START = ResourcePlan(num_workers=1, num_ps=2, worker_cpu=8.0, ps_cpu=8.0)
GOAL_ORACLE = 1.03
GOAL_VS_OPTIMUS = 0.25
GOAL_VS_ES = 0.15
GOAL_WARM = 0.20


def scaled(**factors: float) -> Coefficients:
    """The paper's coefficients with some terms multiplied (a workload's character)."""
    values = {k: getattr(PAPER, k) * factors.get(k, 1.0) for k in ("grad", "upd", "sync", "emb")}
    return Coefficients(bias=PAPER.bias * factors.get("bias", 1.0), **values)


WORKLOADS = (
    Workload(
        "wide_deep",
        truth=scaled(upd=24.0),
        shape=JobShape(batch_size=1, model_size=0.25, bandwidth=1.0, embedding_dim=1),
        hot_share=0.3,
        label="Wide&Deep-like: I/O-bound, hot PS (one tensor = 30% of the parameters)",
    ),
    Workload(
        "xdeepfm",
        truth=scaled(grad=12.0),
        shape=JobShape(batch_size=1, model_size=0.25, bandwidth=1.0, embedding_dim=1),
        hot_share=0.0,
        label="xDeepFM-like: compute-bound, parameters evenly spread",
    ),
)
# ES steps and Optimus units as in DLRover's evaluation (section 6.3): ES adds 4 workers at a
# time for Wide&Deep and 1 for xDeepFM; Optimus adds one node (the original Optimus).
ES_STEP = {"wide_deep": 4, "xdeepfm": 1}


def traits(wl: Workload, steps: float) -> JobTraits:
    tables = (
        TableConfig(name=f"c{i}", column=f"c{i}", vocab_size=100_000, dim=16) for i in range(26)
    )
    features = FeatureConfig(num_dense=13, tables=tuple(tables))
    return JobTraits.of(wl.name, features, int(steps * 512), "ctr_daily", "train")


def past_job_workload(wl: Workload, i: int, rng: np.random.Generator) -> Workload:
    """A similar job of the history: other data size, coefficients within +-10%."""
    jitter = rng.uniform(0.9, 1.1, size=5)
    truth = Coefficients(*(float(v) for v in wl.truth.as_array() * jitter))
    return replace(
        wl, name=f"{wl.name}-past{i}", truth=truth, total_steps=wl.total_steps * (0.6 + 0.2 * i)
    )


@dataclass
class Row:
    label: str
    result: RunResult


@dataclass
class Past:
    """One finished job of the history: what the store keeps (final plan) and what warm start
    reuses beyond it (the fitted coefficients, the PS floor its hot-PS rule set)."""

    job: PastJob
    coefficients: Coefficients
    ps_floor: float
    hot_share: float
    observations: list[tuple[ResourcePlan, float]]


def rover(
    wl: Workload, setting: Setting, history: list[Past], seed: int, gens: int
) -> AirflowRover:
    """airflow-rover for ``wl``: warm-started from ``history`` when it has similar jobs."""
    if not history:
        return AirflowRover(
            "airflow-rover-cold",
            wl.shape,
            setting,
            COLD_START,
            seed=seed,
            generations=gens,
            population=gens,
        )
    start = warm_start(traits(wl, wl.total_steps), [p.job for p in history], cold_start=COLD_START)
    prior = Coefficients(
        *(statistics.median(float(p.coefficients.as_array()[k]) for p in history) for k in range(5))
    )
    policy = AirflowRover(
        "airflow-rover",
        wl.shape,
        setting,
        start.plan,
        prior=prior,
        seed=seed,
        generations=gens,
        population=gens,
    )
    policy.ps_floor = statistics.median(p.ps_floor for p in history)
    policy.shape = replace(wl.shape, hot_share=statistics.median(p.hot_share for p in history))
    pooled = [obs for p in history for obs in p.observations]
    model = ThroughputModel.fit(policy.shape, pooled, prior=prior, prior_weight=0.01)
    policy.refine_start(model, wl.total_steps)
    return policy


def run_workload(
    wl: Workload, setting: Setting, seed: int, quick: bool
) -> tuple[list[Row], list[str]]:
    gens = 25 if quick else 40
    rows: list[Row] = []
    notes: list[str] = []
    best = oracle_config(wl, setting)
    rows.append(
        Row("oracle", simulate(wl, Static("oracle", best), setting.budget, seed, setting.limits))
    )

    # The history: earlier runs of the same daily job (other data sizes, coefficients within
    # +-10%), the first cold, each later one warm-started from those before it.
    rng = np.random.default_rng(seed + 17)
    history: list[Past] = []
    for i in range(1 if quick else 3):
        pwl = past_job_workload(wl, i, rng)
        policy = rover(pwl, setting, history, seed + 100 * i, gens)
        res = simulate(pwl, policy, setting.budget, seed + 1000 + i, setting.limits)
        assert policy.model is not None
        plan = res.final.plan(COLD_START).model_dump()
        job = PastJob(f"{wl.name}-{i}", traits(wl, pwl.total_steps), plan, float(i))
        history.append(
            Past(
                job,
                policy.model.coefficients,
                policy.ps_floor,
                policy.shape.hot_share,
                policy.observations,
            )
        )
        how = "warm" if i else "cold"
        notes.append(
            f"history job {i} ({pwl.total_steps:,.0f} steps, {how}): {res.final.describe()}"
        )

    warm = rover(wl, setting, history, seed, gens)
    notes.append(
        f"warm start: {Config.of(warm.start).describe()}, PS floor {warm.ps_floor:g} cores"
    )
    rows.append(
        Row("airflow-rover (warm)", simulate(wl, warm, setting.budget, seed + 1, setting.limits))
    )
    cold = rover(wl, setting, [], seed, gens)
    rows.append(
        Row("airflow-rover (cold)", simulate(wl, cold, setting.budget, seed + 2, setting.limits))
    )
    rows.append(
        Row(
            "dlrover-heuristic",
            simulate(wl, DLRoverHeuristic(setting), setting.budget, seed + 3, setting.limits),
        )
    )
    rows.append(
        Row(
            "optimus",
            simulate(
                wl,
                Optimus(best.worker_cpu, best.ps_cpu[0], setting),
                setting.budget,
                seed + 4,
                setting.limits,
            ),
        )
    )
    es = ElasticScheduler(best, ES_STEP[wl.name], setting)
    rows.append(Row("es", simulate(wl, es, setting.budget, seed + 5, setting.limits)))
    return rows, notes


def jct(rows: list[Row], label: str) -> float:
    return next(r.result.jct_s for r in rows if r.label == label)


def table(header: list[str], widths: list[int], lines: list[list[str]]) -> None:
    """Print a table: the first column left-aligned, the others right-aligned."""

    def fmt(cells: list[str]) -> str:
        first = f"{cells[0]:<{widths[0]}}"
        rest = (f"{c:>{w}}" for c, w in zip(cells[1:-1], widths[1:-1], strict=True))
        return "  ".join([first, *rest, cells[-1]]).rstrip()

    head = fmt(header)
    print(head)
    print("-" * len(head))
    for cells in lines:
        print(fmt(cells))


Goal = tuple[str, bool, str]


def print_table(wl: Workload, rows: list[Row], notes: list[str], setting: Setting) -> list[Goal]:
    print(f"\n== {wl.label}")
    print(f"   {wl.total_steps:,.0f} global steps, budget {setting.budget:g} cores")
    oracle, optimus, es = jct(rows, "oracle"), jct(rows, "optimus"), jct(rows, "es")
    lines = [
        [
            r.label,
            f"{r.result.jct_s:.0f}",
            f"{r.result.jct_s / oracle:.3f}",
            f"{r.result.jct_s / optimus:.3f}",
            f"{r.result.jct_s / es:.3f}",
            f"{r.result.final_plan_s:.0f}",
            f"{len(r.result.changes) - 1}",
            r.result.final.describe(),
        ]
        for r in rows
    ]
    header = ["policy", "JCT s", "/oracle", "/Optimus", "/ES", "time-to-final-plan s", "changes"]
    table([*header, "final plan"], [20, 7, 7, 8, 6, 20, 7, 0], lines)
    for note in notes:
        print(f"   {note}")
    goals: list[Goal] = []
    for label in ("airflow-rover (warm)", "airflow-rover (cold)"):
        mine = jct(rows, label)
        vs_optimus, vs_es = 1 - mine / optimus, 1 - mine / es
        name = f"{wl.name}: {label}"
        ratio = mine / oracle
        ok = ratio <= GOAL_ORACLE
        miss = "" if ok else f", {ratio / GOAL_ORACLE - 1:.1%} over the goal"
        goals.append((f"{name} <= {GOAL_ORACLE}x oracle", ok, f"{ratio:.3f}x{miss}"))
        for base, value, goal in (
            ("Optimus", vs_optimus, GOAL_VS_OPTIMUS),
            ("ES", vs_es, GOAL_VS_ES),
        ):
            miss = "" if value >= goal else f", {goal - value:.1%} short of the goal"
            text = f"{name} >= {goal:.0%} below {base}"
            goals.append((text, value >= goal, f"{value:.1%} below{miss}"))
    w = next(r.result for r in rows if r.label == "airflow-rover (warm)").final_plan_s
    c = next(r.result for r in rows if r.label == "airflow-rover (cold)").final_plan_s
    cut = 1 - w / c if c > 0 else 0.0
    text = f"{wl.name}: warm start cuts time-to-final-plan >= {GOAL_WARM:.0%} vs cold"
    miss = "" if cut >= GOAL_WARM else f", {GOAL_WARM - cut:.1%} short of the goal"
    goals.append((text, cut >= GOAL_WARM, f"{w:.0f} s vs {c:.0f} s: {cut:.1%} less{miss}"))
    return goals


def print_trace(res: TraceResult) -> list[Goal]:
    print(f"\n== Trace: {res.jobs} jobs sharing {res.budget:g} cores, one arrival every")
    print(f"   {res.mean_gap_s:.0f} s on average (Poisson); JCT = completion - arrival")
    fifo = res.stats["fifo"]
    lines = [
        [name]
        + [f"{s[k]:.0f}" for k in ("mean", "median", "p95")]
        + [f"{s['mean'] / fifo['mean']:.3f}"]
        + [f"{s[k]:.0f}" for k in ("wait", "makespan")]
        for name, s in res.stats.items()
    ]
    header = ["allocation", "mean JCT s", "median JCT s", "p95 JCT s", "mean /FIFO", "mean wait s"]
    table([*header, "makespan s"], [16, 10, 12, 9, 10, 11, 0], lines)
    a, f = res.stats["arbiter"]["mean"], fifo["mean"]
    detail = (
        f"{a:.0f} s vs {f:.0f} s ({1 - a / f:.1%} lower)" if a < f else f"{a:.0f} s vs {f:.0f} s"
    )
    return [("trace: the cluster arbiter's mean JCT below FIFO's", a < f, detail)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: short jobs, small trace")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    setting = Setting()
    goals: list[tuple[str, bool, str]] = []
    for wl in WORKLOADS:
        if args.quick:
            wl = replace(wl, total_steps=wl.total_steps / 4)
        rows, notes = run_workload(wl, setting, args.seed, args.quick)
        goals += print_table(wl, rows, notes, setting)
    trace = run_trace(seed=args.seed, jobs=60 if args.quick else 1000)
    goals += print_trace(trace)
    print("\n== Goals")
    for text, ok, detail in goals:
        print(f"{'MET    ' if ok else 'NOT MET'}  {text}: {detail}")
    run = "quick" if args.quick else "full"
    print(f"\n(seed {args.seed}, {run} run, {time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
