"""Discrete-event simulation of PS training jobs under airflow-rover and the policies it must beat.

airflow-rover here is the master's own ``Autoscaler`` (``bench/_master_policy.py``), with only
the clock and the cluster simulated. For every world (``--world module:function``, default:
every world of ``bench/worlds/``) and each of its workloads it runs one job under:

- the oracle: the world's best plan from time 0 (exhaustive over the world's plans);
- airflow-rover, warm: started from the history of earlier runs of the same daily job (other
  data sizes), as the history store hands them to a warm start: the smoothed final plans
  (Algorithm 1) refined by the model of their pooled throughput samples, and the prior of its
  throughput model and the scaling costs they measured; and cold: the paper's prior, default
  costs, a small first plan;
- DLRover's shipped heuristic, cold and warm (its Brain service's creation plan from the
  job's earlier runs under DLRover), Optimus (greedy each round until the marginal gain runs
  out) and ES (``bench/_policies.py``), the last two with the best one-size-PS plan's node
  sizes;

and prints the job completion time (JCT) against each and the goals, MET / NOT MET: warm
<= 1.03x the oracle, cold <= 1.10x; at least 25% below Optimus, 15% below ES, and below DLRover.
The 1,000-job trace (the cluster arbiter against FIFO on a shared budget): ``bench/_trace.py``.

    python bench/simulator.py              # the full run (minutes on 2 cores)
    python bench/simulator.py --quick      # a smoke run: shorter jobs, a 60-job trace
    python bench/simulator.py --world bench.worlds.contention:worlds --seed 3

Deterministic for a given ``--seed``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_rover.core.autoscale_prior import prior_from
from airflow_rover.core.optimizer import ScalingCosts
from airflow_rover.core.spec import FeatureConfig, ResourcePlan, TableConfig
from airflow_rover.core.throughput import BusyShare, JobShape
from airflow_rover.core.warm_start import (
    JobTraits,
    PastJob,
    Refinement,
    refine,
    warm_start,
)
from airflow_rover.master.autoscaler import REPORTED_SAMPLES
from bench._brain import PastRun
from bench._master_policy import MasterAutoscaler, config_of, plan_of
from bench._policies import DLRoverHeuristic, ElasticScheduler, Optimus, Setting, Static
from bench._simcore import Config, Policy, RunResult, simulate, steps_per_s
from bench._trace import TraceResult, run_trace
from bench._world import World, load, oracle

DEFAULT_WORLDS = (
    "bench.worlds.dlrover_rm:worlds",
    "bench.worlds.contention:worlds",
    "bench.worlds.measured:worlds",
)
GOAL_WARM = 1.03
GOAL_COLD = 1.10
GOAL_VS_OPTIMUS = 0.25
GOAL_VS_ES = 0.15
ES_STEP = 2  # workers ES adds per step (DLRover's evaluation: 4 for Wide&Deep, 1 for xDeepFM)
HISTORY_SIZES = (0.6, 0.8, 1.2)  # the earlier runs' data, in shares of today's


def shape_of(world: World) -> JobShape:
    return JobShape.sized(world.batch_size, world.embedding_dim)


def traits(world: World) -> JobTraits:
    """The daily job's traits: every run of it the same but its data size."""
    tables = (
        TableConfig(name=f"c{i}", column=f"c{i}", vocab_size=100_000, dim=16) for i in range(26)
    )
    features = FeatureConfig(num_dense=13, tables=tuple(tables))
    samples = int(world.total_steps * world.batch_size)
    return JobTraits.of(world.name, features, samples, "daily_retraining", "train")


def cold_plan(setting: Setting) -> ResourcePlan:
    """What a user starts a new job with: one worker and two PS of a middling size."""
    bounds = setting.bounds
    return ResourcePlan(
        num_workers=1,
        num_ps=min(2, bounds.max_ps),
        worker_cpu=statistics.median_low(bounds.worker_cpus),
        ps_cpu=statistics.median_low(bounds.ps_cpus),
    )


@dataclass
class Past:
    """One finished run of the job, as the history store keeps it."""

    job: PastJob
    observations: list[tuple[ResourcePlan, float]]
    busy: list[BusyShare]
    hot_share: float
    costs: ScalingCosts


def rover(world: World, setting: Setting, history: list[Past], label: str) -> MasterAutoscaler:
    """airflow-rover for ``world``: warm-started from ``history`` when it has similar jobs."""
    cold = cold_plan(setting)
    if not history:
        return MasterAutoscaler(label, world, setting, cold)
    decision = warm_start(traits(world), [p.job for p in history], cold_start=cold)
    observations = [obs for p in history for obs in p.observations]
    busy = [share for p in history for share in p.busy]
    budget = setting.budget

    def fits(plan: ResourcePlan) -> bool:
        return plan.total_cores <= budget + 1e-9 and world.runs(config_of(plan))

    hot_shares = [p.hot_share for p in history]
    costs = [p.costs for p in history]
    prior = prior_from(shape_of(world), observations, hot_shares, costs, busy=busy)
    # Before the launch every plan costs the same: the history's model picks the start among
    # every plan the job may have, the hot PS's own size included where there is one.
    shape = replace(shape_of(world), hot_share=prior.hot_share)
    bounds = replace(setting.bounds, hot_ps=0 if prior.hot_share > 0 else None)
    decision = refine(decision, observations, Refinement(shape, bounds, fits), busy=busy)
    return MasterAutoscaler(label, world, setting, decision.plan, prior)


def past_runs(world: World, setting: Setting, seed: int, runs: int) -> tuple[list[Past], list[str]]:
    """Earlier runs of the daily job on other data sizes: the first cold, each later one
    warm-started from those before it."""
    history: list[Past] = []
    notes: list[str] = []
    for i, size in enumerate(HISTORY_SIZES[:runs]):
        past = replace(world, total_steps=world.total_steps * size)  # type: ignore[type-var]
        policy = rover(past, setting, history, f"history-{i}")
        result = simulate(past, policy, seed + 1000 + i)
        scaler = policy.autoscaler
        plan = plan_of(result.final, policy.start).model_dump()
        job = PastJob(f"{world.name}-{i}", traits(past), plan, float(i))
        kept = scaler.throughput[-REPORTED_SAMPLES:]  # what the history store keeps
        observations, busy = [], []
        for s in kept:
            seen, seconds = ResourcePlan.model_validate(s["plan"]), s["step_time_ms"] / 1000.0
            observations.append((seen, seconds))
            if "worker_busy" in s:
                busy.append(BusyShare(seen, seconds, s["worker_busy"], s["ps_busy"]))
        history.append(Past(job, observations, busy, scaler.shape.hot_share, scaler.costs()))
        how = "warm" if i else "cold"
        notes.append(
            f"history run {i} ({past.total_steps:,.0f} steps, {how}): {result.final.describe()}"
        )
    return history, notes


@dataclass
class Row:
    label: str
    result: RunResult


def dlrover_runs(world: World, setting: Setting, seed: int, runs: int) -> list[PastRun]:
    """Earlier runs of the daily job under DLRover: what its Brain reads at the next creation."""
    history: list[PastRun] = []
    for i, size in enumerate(HISTORY_SIZES[:runs]):
        past = replace(world, total_steps=world.total_steps * size)  # type: ignore[type-var]
        policy = DLRoverHeuristic(setting, history or None)
        simulate(past, policy, seed + 2000 + i)
        history.append(PastRun.of_reports(policy.observed))
    return history


def uniform_best(world: World) -> Config:
    """The best plan whose PS are all one size: the node sizes Optimus and ES are given (the
    "well-tuned node resources" of DLRover's evaluation), as neither sizes a PS apart."""
    fitting = [
        c for c in world.plans() if len(set(c.ps_cpu)) == 1 and c.cores <= world.budget + 1e-9
    ]
    return max(fitting, key=lambda c: steps_per_s(world, c))


def run_world(world: World, seed: int, quick: bool) -> tuple[list[Row], list[str]]:
    setting = Setting.of(world)
    runs = 1 if quick else len(HISTORY_SIZES)
    history, notes = past_runs(world, setting, seed, runs)
    warm = rover(world, setting, history, "airflow-rover (warm)")
    notes.append(f"warm start: {config_of(warm.start).describe()}")
    tuned = uniform_best(world)
    policies: list[Policy] = [
        Static("oracle", oracle(world)),
        warm,
        rover(world, setting, [], "airflow-rover (cold)"),
        DLRoverHeuristic(setting, dlrover_runs(world, setting, seed, runs)),
        DLRoverHeuristic(setting),
        Optimus(tuned.worker_cpu, tuned.ps_cpu[0], setting),
        ElasticScheduler(Config(1, tuned.worker_cpu, tuned.ps_cpu), ES_STEP, setting),
    ]
    rows = [Row(p.name, simulate(world, p, seed + i)) for i, p in enumerate(policies)]
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
BASELINES = (("Optimus", "optimus", GOAL_VS_OPTIMUS), ("ES", "es", GOAL_VS_ES))


def print_world(world: World, rows: list[Row], notes: list[str]) -> list[Goal]:
    print(f"\n== {world.name}: {world.label}")
    print(f"   {world.total_steps:,.0f} global steps, budget {world.budget:g} cores")
    oracle_s, dlrover = jct(rows, "oracle"), jct(rows, "dlrover-heuristic")
    optimus, es = jct(rows, "optimus"), jct(rows, "es")
    dlrover_for = {"warm": "dlrover-heuristic-brain", "cold": "dlrover-heuristic"}
    lines = [
        [
            r.label,
            f"{r.result.jct_s:.0f}",
            f"{r.result.jct_s / oracle_s:.3f}",
            f"{r.result.jct_s / optimus:.3f}",
            f"{r.result.jct_s / es:.3f}",
            f"{r.result.jct_s / dlrover:.3f}",
            f"{r.result.final_plan_s:.0f}",
            f"{len(r.result.changes) - 1}",
            r.result.final.describe(),
        ]
        for r in rows
    ]
    header = ["policy", "JCT s", "/oracle", "/Optimus", "/ES", "/DLRover", "final plan at s"]
    table([*header, "changes", "final plan"], [20, 7, 7, 8, 6, 8, 15, 7, 0], lines)
    for note in notes:
        print(f"   {note}")
    goals: list[Goal] = []
    for start, goal in (("warm", GOAL_WARM), ("cold", GOAL_COLD)):
        label = f"airflow-rover ({start})"
        mine = jct(rows, label)
        name = f"{world.name}: {label}"
        ratio = mine / oracle_s
        miss = "" if ratio <= goal else f", {ratio / goal - 1:.1%} over the goal"
        goals.append((f"{name} <= {goal}x oracle", ratio <= goal, f"{ratio:.3f}x{miss}"))
        for base, base_label, target in BASELINES:
            below = 1 - mine / jct(rows, base_label)
            ceiling = 1 - oracle_s / jct(rows, base_label)
            miss = "" if below >= target else f", {target - below:.1%} short of the goal"
            detail = f"{below:.1%} below{miss} (the oracle: {ceiling:.1%} below)"
            goals.append((f"{name} >= {target:.0%} below {base}", below >= target, detail))
        theirs = jct(rows, dlrover_for[start])
        below = 1 - mine / theirs
        text = f"{name} below DLRover ({start})"
        goals.append((text, below > 0, f"{below:.1%} below"))
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
    parser.add_argument(
        "--world",
        action="append",
        metavar="MODULE:FUNCTION",
        help="the worlds to run (repeatable); default: " + ", ".join(DEFAULT_WORLDS),
    )
    parser.add_argument("--no-trace", action="store_true", help="skip the 1,000-job trace")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    goals: list[Goal] = []
    for spec in args.world or DEFAULT_WORLDS:
        for world in load(spec):
            if args.quick:
                world = replace(world, total_steps=world.total_steps / 4)  # type: ignore[type-var]
            rows, notes = run_world(world, args.seed, args.quick)
            goals += print_world(world, rows, notes)
    if not args.no_trace:
        goals += print_trace(run_trace(seed=args.seed, jobs=60 if args.quick else 1000))
    print("\n== Goals")
    for text, ok, detail in goals:
        print(f"{'MET    ' if ok else 'NOT MET'}  {text}: {detail}")
    met = sum(ok for _, ok, _ in goals)
    run = "quick" if args.quick else "full"
    print(f"\n{met} of {len(goals)} goals met (seed {args.seed}, {run} run, "
          f"{time.perf_counter() - started:.1f} s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
