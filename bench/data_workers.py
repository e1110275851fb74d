"""Data workers against trainers that prepare their own batches: which count pays, and whether
``auto`` finds it (GoldMiner's job-level policy, ``core/data_autoscaler.py``).

One job shape, 1 PS and 1 trainer (``--trainers 2`` for two), the default Wide&Deep model on
the synthetic data, batch 512, whose preprocessing (``bench/_preprocess.py``: hashed crosses of
13 column pairs) costs more than its training step; run one after the other in one invocation,
on the same dataset, with:

    off       the trainer prepares its own batches (in its input pipeline's thread)
    fixed-N   N data workers (N = 1 .. 4)
    auto      min 0, max 4, interval_s 4: the master's policy moves the count

Figures per configuration, steady state only: the trainers' samples/s and the fraction of their
time spent waiting for their next batch, over a window of ``--measure-s`` seconds that opens
``--warmup-s`` after every trainer has reported training (and, with data workers, once all of
them serve). ``auto``'s window opens once it has settled (its count served for
``JUDGE_WINDOWS`` + 5.5 intervals with no decision; at most ``--settle-s``); its decisions,
with their reasons, and its whole-run rate (search included) are printed too. Goals: auto's
samples/s within 10% of the best static configuration's; the trainers' input wait under 10% once
auto has settled.

What 2 cores can show: a data worker is a process competing for the same 2 cores as the
trainer, the PS and the master. It pays while a core is left idle by a trainer that waits for
its own preprocessing (the trainer's step and its preprocessing share one GIL), so 1, perhaps
2, data workers speed the job up; beyond that nothing can, the cores are full, and more data
workers only add processes and copies. The input-wait goal cannot hold here when the
preprocessing needs more cores than there are: the trainers then wait at any count. What 2
cores cannot show: GoldMiner's near-linear scaling with data workers on CPUs of their own. The
autoscaler's job on this machine is to find the plateau and not to overshoot it. On a machine
shared with other work (the 1-min load average is printed before and after each run), a job
with more processes also takes a larger share of the cores from its neighbours, so a count past
the plateau can still read faster, and one 4-s window's rate swings by 10-20%.

    python bench/data_workers.py                  # about 5 min on 2 cores
    python bench/data_workers.py --quick          # off, fixed-1, auto (max 2): about 2 min
    python bench/data_workers.py --configs off,fixed-2,auto --trainers 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The job's processes import the preprocessing by path (``bench._preprocess``): the local
# launcher passes this environment on to the master and its nodes.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
)

from airflow_rover.core.data_autoscaler import JUDGE_WINDOWS  # noqa: E402
from airflow_rover.core.job_dir import JobDir  # noqa: E402
from airflow_rover.core.spec import JobSpec  # noqa: E402
from airflow_rover.core.states import TERMINAL_STATES  # noqa: E402
from airflow_rover.data import open_dataset  # noqa: E402
from airflow_rover.data.preprocessing import checked  # noqa: E402
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset  # noqa: E402
from airflow_rover.launchers.local import LocalBackend, local_job_status  # noqa: E402
from bench._preprocess import crossed  # noqa: E402

PREPROCESS = "bench._preprocess:crossed"
BATCH_SIZE = 512
SHARD_SIZE = 4096
NUM_TRAIN = 100_000
EPOCHS = 100  # more than any run trains: the bench stops each job once it has measured it
INTERVAL_S = 4.0  # auto: seconds between two scaling decisions
# auto is settled once its count has served this many intervals with no decision: a step is
# judged JUDGE_WINDOWS windows after the one it leaves out, and a kept one may be followed by
# another at the next window; a window lasts an interval or more (5 steps, all serving)
SETTLED_INTERVALS = JUDGE_WINDOWS + 5.5
POLL_S = 0.5
GOAL_RATIO = 0.9  # auto's samples/s against the best static configuration's
GOAL_WAIT = 0.10  # the trainers' input wait once auto has settled


@dataclass(frozen=True)
class Config:
    key: str
    data_workers: dict[str, Any]

    @property
    def auto(self) -> bool:
        return self.data_workers["mode"] == "auto"


def config(key: str, auto_max: int) -> Config:
    if key == "off":
        return Config(key, {"mode": "off"})
    if key == "auto":
        return Config(key, {"mode": "auto", "min": 0, "max": auto_max, "interval_s": INTERVAL_S})
    if key.startswith("fixed-") and key[6:].isdigit() and int(key[6:]) >= 1:
        return Config(key, {"mode": "fixed", "count": int(key[6:])})
    raise ValueError(f"--configs: unknown configuration {key!r}; accepted: off, fixed-N, auto")


@dataclass
class Point:
    """One poll of the status: the trainers' counters and the data workers' section."""

    at: float
    samples: int
    wait_s: float
    trainers: int
    step_ms: list[float]
    data_workers: dict[str, Any]
    served_ms: list[float]  # each running data worker's ms per batch


@dataclass
class Run:
    config: Config
    points: list[Point] = field(default_factory=list)
    started_at: float | None = None  # every trainer has reported training
    window: tuple[float, float] | None = None
    settled: bool = True
    load: tuple[float, float] = (0.0, 0.0)  # the machine's 1-min load average, before and after

    def between(self, lo: float, hi: float) -> list[Point]:
        return [p for p in self.points if lo <= p.at <= hi]

    def rate(self, lo: float, hi: float) -> tuple[float, float]:
        """(samples/s, input-wait fraction) of the trainers over ``[lo, hi]``."""
        inside = self.between(lo, hi)
        if len(inside) < 2:
            return 0.0, 0.0
        first, last = inside[0], inside[-1]
        elapsed = last.at - first.at
        if elapsed <= 0:
            return 0.0, 0.0
        wait = (last.wait_s - first.wait_s) / (elapsed * max(1, last.trainers))
        return (last.samples - first.samples) / elapsed, wait

    @property
    def steady(self) -> tuple[float, float]:
        return self.rate(*self.window) if self.window else (0.0, 0.0)

    @property
    def decisions(self) -> list[dict[str, Any]]:
        return list(self.points[-1].data_workers.get("decisions", [])) if self.points else []

    def median(self, pick: str) -> float:
        lo, hi = self.window or (0.0, 0.0)
        values = [v for p in self.between(lo, hi) for v in getattr(p, pick)]
        return statistics.median(values) if values else 0.0


def point(status: dict[str, Any]) -> Point:
    nodes = status.get("nodes", [])
    trainers = [n for n in nodes if n["role"] == "worker" and n["state"] == "running"]
    data = [n for n in nodes if n["role"] == "data" and n["state"] == "running"]
    return Point(
        at=time.time(),
        samples=sum(n["samples"] for n in trainers),
        wait_s=sum(n.get("input_wait_s", 0.0) for n in trainers),
        trainers=len(trainers),
        step_ms=[n["step_time_ms"] for n in trainers if n["step_time_ms"]],
        data_workers=status.get("data_workers") or {},
        served_ms=[n["step_time_ms"] for n in data if n["step_time_ms"]],
    )


def serving(p: Point) -> bool:
    """Every data worker the master wants serves (true without data workers)."""
    section = p.data_workers
    return not section or section.get("running") == section.get("target")


def spec_for(cfg: Config, data: Any, trainers: int) -> JobSpec:
    return JobSpec.model_validate(
        {
            "job_id": f"dw-{cfg.key}",
            "train_data": str(data.train_dir),
            "plan": {"num_ps": 1, "num_workers": trainers},
            "training": {"batch_size": BATCH_SIZE, "shard_size": SHARD_SIZE, "epochs": EPOCHS},
            "autoscale": {"enabled": False},
            "recovery": {"checkpoint_interval_s": 0},
            "preprocess": PREPROCESS,
            "data_workers": cfg.data_workers,
        }
    )


def run_config(cfg: Config, data: Any, root: Path, trainers: int, args: Any) -> Run:
    """Launch the job, poll its status until its window is measured, then stop it."""
    layout = JobDir(root / "jobs" / cfg.key)
    backend = LocalBackend()
    run = Run(cfg, load=(os.getloadavg()[0], 0.0))
    backend.launch(layout, spec_for(cfg, data, trainers))
    deadline = time.time() + args.timeout_s
    serving_since: float | None = None
    try:
        while time.time() < deadline:
            status = local_job_status(layout)
            if status["state"] in TERMINAL_STATES:
                raise RuntimeError(
                    f"{cfg.key}: the job ended early, {status['state']}: {status.get('message')}"
                )
            p = point(status)
            run.points.append(p)
            if run.started_at is None:
                if p.trainers == trainers and all(p.step_ms) and len(p.step_ms) == trainers:
                    run.started_at = p.at
            elif run.window is None:
                serving_since = (serving_since or p.at) if serving(p) else None
                if cfg.auto:
                    last = max((d["at"] for d in p.data_workers.get("decisions", [])), default=0)
                    if serving_since is not None and last > serving_since:
                        serving_since = p.at
                    quiet = serving_since is not None and (
                        p.at - serving_since >= SETTLED_INTERVALS * INTERVAL_S
                    )
                    given_up = p.at - run.started_at >= args.settle_s
                    if p.at - run.started_at >= args.warmup_s and (quiet or given_up):
                        run.settled = quiet
                        run.window = (p.at, p.at + args.measure_s)
                elif serving_since is not None and p.at - run.started_at >= args.warmup_s:
                    run.window = (max(p.at, serving_since), p.at + args.measure_s)
            elif p.at >= run.window[1]:
                break
            time.sleep(POLL_S)
        else:
            raise TimeoutError(f"{cfg.key}: not measured within {args.timeout_s:.0f} s")
    finally:
        backend.stop_master(layout)
    run.load = (run.load[0], os.getloadavg()[0])
    return run


def trace(run: Run) -> dict[str, Any]:
    """A run's polled points and windows, for a closer look (``--trace``)."""
    return {
        "config": run.config.key,
        "started_at": run.started_at,
        "window": run.window,
        "points": [asdict(p) for p in run.points],
    }


def preprocess_ms(data: Any, batches: int = 20) -> tuple[float, float]:
    """What one batch costs to preprocess in this process: (fastest, median) of ``batches``
    (the fastest is the least disturbed by whatever else runs on the machine)."""
    reader = open_dataset(str(data.train_dir))
    samples = reader.read(0, BATCH_SIZE * batches)
    times = []
    for lo in range(0, len(samples), BATCH_SIZE):
        batch = samples[lo : lo + BATCH_SIZE]
        t0 = time.perf_counter()
        checked(crossed, batch, reader.schema, PREPROCESS)
        times.append((time.perf_counter() - t0) * 1000)
    return min(times), statistics.median(times)


# -- the report -----------------------------------------------------------------------------
def _count(run: Run) -> str:
    if not run.config.auto:
        return str(run.config.data_workers.get("count", 0))
    lo, hi = run.window or (0.0, 0.0)
    counts = sorted({p.data_workers.get("target", 0) for p in run.between(lo, hi)})
    return "/".join(str(c) for c in counts)


def report(runs: list[Run], prep: tuple[float, float], trainers: int) -> bool:
    print(
        f"\n== {trainers} trainer(s), 1 PS, batch {BATCH_SIZE}; os.cpu_count() = {os.cpu_count()}"
    )
    prep_ms = prep[0]
    print(
        f"preprocessing one batch in the bench's process (bench._preprocess:crossed): fastest "
        f"{prep[0]:.1f} ms, median {prep[1]:.1f} ms"
    )
    static_steps = [r.median("step_ms") for r in runs if r.config.key.startswith("fixed-")]
    if static_steps:
        step = statistics.median(static_steps)
        print(
            f"a training step, data workers preparing (median of fixed-N): {step:7.1f} ms "
            f"-> preprocessing costs {prep_ms / step:.1f}x a step"
        )
    print(
        f"\n{'config':9} {'dw':>5} {'samples/s':>10} {'input wait':>10} {'step ms':>8} "
        f"{'dw ms/batch':>11} {'load 1m':>11}"
    )
    for run in runs:
        rate, wait = run.steady
        served = run.median("served_ms")
        print(
            f"{run.config.key:9} {_count(run):>5} {rate:10.0f} {wait:10.1%} "
            f"{run.median('step_ms'):8.1f} {(f'{served:.1f}' if served else '-'):>11} "
            f"{run.load[0]:5.1f}>{run.load[1]:<5.1f}"
        )
    met = True
    for run in (r for r in runs if r.config.auto):
        met = _report_auto(run, [r for r in runs if not r.config.auto]) and met
    return met


def _report_auto(run: Run, static: list[Run]) -> bool:
    print(f"\n-- auto (min 0, max {run.config.data_workers['max']}, interval {INTERVAL_S:.0f} s)")
    assert run.started_at is not None and run.window is not None
    t0 = run.started_at
    for d in run.decisions:
        at, move = d["at"] - t0, f"{d['previous']} -> {d['count']}"
        print(f"  {at:6.1f} s  {move}  {d['rule']:10} {d['reason']}")
    if not run.decisions:
        print("  no decision")
    whole, _ = run.rate(t0, run.window[1])
    rate, wait = run.steady
    moved = [d for d in run.decisions if run.window[0] <= d["at"] <= run.window[1]]
    print(
        f"  settled on {_count(run)} data worker(s) {run.window[0] - t0:.0f} s after training "
        f"started"
        + ("" if run.settled else " (NOT settled: measured at --settle-s)")
        + (f"; {len(moved)} decision(s) while measured" if moved else "")
    )
    print(f"  whole run from the trainers' start (search included): {whole:.0f} samples/s")
    if not static:
        return run.settled
    best = max(static, key=lambda r: r.steady[0])
    ratio = rate / best.steady[0] if best.steady[0] else 0.0
    near = ratio >= GOAL_RATIO
    low_wait = wait < GOAL_WAIT
    print(
        f"  auto / best static ({best.config.key}, {best.steady[0]:.0f} samples/s): {ratio:.2f}; "
        f"goal >= {GOAL_RATIO:.2f}: {'MET' if near else 'NOT MET'}"
    )
    print(
        f"  input wait once settled: {wait:.1%}; goal < {GOAL_WAIT:.0%}: "
        f"{'MET' if low_wait else 'NOT MET'}"
        + ("" if low_wait else f" (best static's own: {best.steady[1]:.1%})")
    )
    return near and low_wait


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="off,fixed-1,fixed-2,fixed-3,fixed-4,auto")
    parser.add_argument("--trainers", type=int, default=1)
    parser.add_argument("--auto-max", type=int, default=4)
    parser.add_argument("--warmup-s", type=float, default=8.0)
    parser.add_argument("--measure-s", type=float, default=20.0)
    parser.add_argument("--settle-s", type=float, default=150.0, help="auto: the longest wait")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per configuration")
    parser.add_argument("--quick", action="store_true", help="off, fixed-1, auto (max 2), short")
    parser.add_argument("--trace", type=Path, help="write every polled point here (JSON)")
    args = parser.parse_args()
    if args.quick:
        args.configs, args.auto_max = "off,fixed-1,auto", 2
        args.warmup_s, args.measure_s, args.settle_s = 5.0, 10.0, 60.0
    if args.trainers < 1:
        parser.error(f"--trainers={args.trainers}: accepted: an integer >= 1")
    configs = [config(key.strip(), args.auto_max) for key in args.configs.split(",") if key]
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="dw-bench-") as tmp:
        root = Path(tmp)
        data = generate_dataset(
            root / "data", SyntheticConfig(num_train=NUM_TRAIN, num_eval=1000, seed=7)
        )
        prep = preprocess_ms(data)
        runs = []
        for cfg in configs:
            print(f"running {cfg.key} ...", flush=True)
            runs.append(run_config(cfg, data, root, args.trainers, args))
    if args.trace:
        args.trace.write_text(json.dumps([trace(run) for run in runs]))
    met = report(runs, prep, args.trainers)
    print(f"\nbench took {time.time() - started:.0f} s")
    print(
        "On 2 cores a data worker competes with the trainer, the PS and the master for the same "
        "cores: past 1-2 data workers nothing can speed the job up (on a shared machine more "
        "processes only take a larger share from the neighbours), and the trainers may wait "
        "at any count. Data workers on cores of their own (GoldMiner's setting) are not shown."
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
