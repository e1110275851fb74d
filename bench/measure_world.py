"""The simulator's measured world: the real runtime's speed at every plan this machine can run.

    python bench/measure_world.py               # 18 plans of 2 workloads, ~12 min on 2 cores
    python bench/measure_world.py --trial       # 1 plan per workload, 1 min: does it work
    python bench/measure_world.py --workloads wide_deep --plans 1x1x1,3x2x1

Each plan (``WxPxC``: W workers, P PS, C threads a node) runs as a fresh job on the local
launcher: the real master, PS and worker processes, real TensorFlow, on synthetic Criteo-shaped
data, with autoscaling and checkpoints off so the plan stays as it is. The local launcher gives
every node ``int(worker_cpu)`` threads (``OMP_NUM_THREADS``, TensorFlow's intra-op pool), so a
plan's PS get the workers' size (``ps_cpu = worker_cpu``). Once every worker has reported
training, ``--warmup-s`` pass, then a window of ``--window-s`` gives, per plan:

- ``iteration_s``: wall seconds per step of a worker (steps between its first and last
  progress report in the window), the mean over workers;
- ``step_time_rel_sd``: the relative sd of one reported step time (the workers' own moving
  average, what the master's autoscaler reads), each report over its worker's mean;
- ``worker_cpu_used`` (mean over workers) and ``ps_cpu_used`` (each PS): busy cores, CPU
  seconds over the window (psutil, every thread of the process) per wall second;
- delays: launch -> the workers' processes start (the master starts, then the PS, then the
  workers: the local "pod start"), and each worker's start -> ready (TensorFlow imported, model
  built, step traced: its initialisation; it leases its first shard right after).

The cores are shared with the master, every node and anything else on the machine (the load
average before each plan is recorded): plans with more threads than cores show it. The table
goes to ``bench/worlds/measured.json``; ``bench/worlds/measured.py`` serves it as worlds.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from airflow_rover.core.spec import JobSpec  # noqa: E402
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset  # noqa: E402
from airflow_rover.hooks.elastic_job import ElasticJobHook  # noqa: E402
from bench._job_probe import (  # noqa: E402
    NodeTimes,
    Progress,
    cpu_seconds,
    master_cpu_seconds,
    master_timeline,
    node_processes,
    poll_until,
)

OUT = ROOT / "bench" / "worlds" / "measured.json"
NUM_TRAIN = 131_072  # 16 shards of 8192; 50 epochs outlast any plan's window
BATCH_SIZE = 512
LEARNING_RATE = 0.2
SEED = 7


@dataclass(frozen=True)
class Workload:
    name: str
    model: str  # a reference model of airflow_rover.worker.models
    embedding_dim: int
    plans: tuple[str, ...]  # WxPxC
    label: str


ALL_PLANS = tuple(f"{w}x{p}x{c}" for c in (1, 2) for p in (1, 2) for w in (1, 2, 3))
WORKLOADS = (
    Workload(
        "wide_deep",
        "wide_deep",
        16,
        ALL_PLANS,
        "Wide&Deep (26 tables dim 16 + 26 wide dim 1, MLP 256-128), batch 512, Adagrad",
    ),
    Workload(
        "deepfm",
        "deepfm",
        32,
        tuple(p for p in ALL_PLANS if p.endswith("x1")),
        "DeepFM (26 tables dim 32 + 26 wide dim 1), batch 512, Adagrad",
    ),
)
BY_NAME = {w.name: w for w in WORKLOADS}


def parse_plan(text: str) -> tuple[int, int, int]:
    """``WxPxC`` -> (workers, PS, threads a node); a clear error for anything else."""
    parts = text.split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"--plans: {text!r} is not WxPxC (positive integers, e.g. 2x1x1)")
    w, p, c = (int(x) for x in parts)
    return w, p, c


def spec_for(workload: Workload, plan: str, train_dir: Path) -> JobSpec:
    workers, ps, cpu = parse_plan(plan)
    return JobSpec.model_validate(
        {
            "job_id": f"world-{workload.name.replace('_', '-')}-{plan}",
            "train_data": str(train_dir),
            "model": workload.model,
            "embedding_dim": workload.embedding_dim,
            "plan": {"num_workers": workers, "num_ps": ps, "worker_cpu": cpu, "ps_cpu": cpu},
            "training": {
                "batch_size": BATCH_SIZE,
                "epochs": 50,
                "optimizer": "adagrad",
                "learning_rate": LEARNING_RATE,
            },
            "autoscale": {"enabled": False},
            "recovery": {"checkpoint_interval_s": 0},
        }
    )


def measure_plan(
    workload: Workload, plan: str, train_dir: Path, root: Path, warmup_s: float, window_s: float
) -> dict[str, Any]:
    """Run ``plan`` as a fresh job, measure its steady window, stop it."""
    spec = spec_for(workload, plan, train_dir)
    job_dir = root / spec.job_id
    shutil.rmtree(job_dir, ignore_errors=True)
    hook = ElasticJobHook(job_dir)
    load = os.getloadavg()[0]
    progress = Progress()
    launched = time.time()
    hook.launch(spec)
    try:
        workers = spec.plan.num_workers

        def all_training(status: dict[str, Any]) -> bool:
            return len(progress.beats) == workers

        poll_until(hook.get_status, progress, all_training, timeout_s=180)
        training_at = time.time()
        poll_until(hook.get_status, progress, lambda _s: time.time() > training_at + warmup_s, 60)
        procs = node_processes(hook.get_conn())
        cpu0, master0, start = cpu_seconds(procs), master_cpu_seconds(hook.get_conn()), time.time()
        poll_until(hook.get_status, progress, lambda _s: time.time() > start + window_s, 60)
        cpu1, master1, end = cpu_seconds(procs), master_cpu_seconds(hook.get_conn()), time.time()
    finally:
        hook.stop("measured")
    listening, nodes = master_timeline(hook.get_conn().log_file("master"))
    busy = {n: (cpu1[n] - cpu0[n]) / (end - start) for n in cpu0 if n in cpu1}
    per_worker = progress.iteration_s(start, end)
    worker_ids = [n for n, t in nodes.items() if t.role == "worker"]
    if len(per_worker) < workers or len(worker_ids) < workers:
        raise RuntimeError(f"{plan}: only {sorted(per_worker)} reported in the window")
    num_ps = spec.plan.num_ps
    return {
        "workers": workers,
        "worker_cpu": float(spec.plan.worker_cpu),
        "ps_cpu": [float(spec.plan.ps_cpu)] * num_ps,
        "iteration_s": statistics.fmean(per_worker.values()),
        "iteration_s_per_worker": [per_worker[w] for w in sorted(per_worker)],
        "reported_step_s": progress.reported_mean_s(start, end),
        "step_time_rel_sd": progress.reported_rel_sd(start, end),
        "worker_cpu_used": statistics.fmean(busy[w] for w in worker_ids if w in busy),
        "ps_cpu_used": [busy.get(f"ps-{i}", float("nan")) for i in range(num_ps)],
        "master_cpu_used": (master1 - master0) / (end - start) if master0 and master1 else None,
        "window_s": end - start,
        "launch_to_master_s": listening - launched if listening else None,
        "launch_to_workers_s": statistics.fmean(nodes[w].started - launched for w in worker_ids),
        "worker_init_s": _init_s(nodes, "worker"),
        "ps_init_s": _init_s(nodes, "ps"),
        "load_average_before": load,
    }


def _init_s(nodes: dict[str, NodeTimes], role: str) -> list[float]:
    """Each node's start -> ready, in node order."""
    return [t.ready - t.started for _, t in sorted(nodes.items()) if t.role == role and t.ready]


def describe(row: dict[str, Any]) -> str:
    ps = ", ".join(f"{c:.2f}" for c in row["ps_cpu_used"])
    init = ", ".join(f"{s:.1f}" for s in row["worker_init_s"])
    return (
        f"{row['workers']}w x {row['worker_cpu']:g}c + {len(row['ps_cpu'])}ps: "
        f"{row['iteration_s'] * 1000:6.1f} ms/step ({row['workers'] / row['iteration_s']:5.1f} "
        f"steps/s), reported sd {row['step_time_rel_sd']:.3f}, worker {row['worker_cpu_used']:.2f}"
        f" cores, PS {ps}; workers start {row['launch_to_workers_s']:.1f} s after launch, "
        f"init {init} s (load {row['load_average_before']:.1f})"
    )


def machine() -> dict[str, Any]:
    cpu_model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "platform": platform.platform(),
    }


def tensorflow_version() -> str:
    """The installed TensorFlow's version, whichever distribution provides it."""
    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-intel"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise RuntimeError("TensorFlow is not installed")


def commit() -> str:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workloads", default=",".join(BY_NAME), help=f"from {list(BY_NAME)}")
    parser.add_argument("--plans", help="WxPxC,... (default: each workload's own)")
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--window-s", type=float, default=16.0)
    parser.add_argument("--trial", action="store_true", help="1x1x1 only, 6 s window, no table")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        parser.error(f"--workloads: unknown {unknown}; choose from {list(BY_NAME)}")
    plans = args.plans.split(",") if args.plans else None
    try:
        for plan in plans or ():
            parse_plan(plan)
    except ValueError as exc:
        parser.error(str(exc))
    if args.trial:
        plans, args.window_s, args.warmup_s = ["1x1x1"], 6.0, 2.0
    software = {
        "python": platform.python_version(),
        "tensorflow": tensorflow_version(),
        "airflow_rover_commit": commit(),
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="measure-world-") as tmp:
        root = Path(tmp)
        data = generate_dataset(
            root / "data", SyntheticConfig(num_train=NUM_TRAIN, num_eval=1000, seed=SEED)
        )
        table = []
        for name in names:
            workload = BY_NAME[name]
            rows = []
            for plan in plans or workload.plans:
                row = measure_plan(
                    workload, plan, data.train_dir, root, args.warmup_s, args.window_s
                )
                print(f"{name} {describe(row)}", flush=True)
                rows.append(row)
            table.append(
                {
                    "name": name,
                    "model": workload.model,
                    "label": workload.label,
                    "embedding_dim": workload.embedding_dim,
                    "batch_size": BATCH_SIZE,
                    "optimizer": "adagrad",
                    "learning_rate": LEARNING_RATE,
                    "plans": rows,
                }
            )
    wall = time.perf_counter() - started
    print(f"measured in {wall:.0f} s", flush=True)
    if args.trial:
        return 0
    record = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "software": software,
        "dataset": {
            "kind": "synthetic Criteo-shaped (airflow_rover.data.synthetic)",
            "num_train": NUM_TRAIN,
            "seed": SEED,
            "num_dense": SyntheticConfig().num_dense,
            "vocab_sizes": list(SyntheticConfig().vocab_sizes),
        },
        "method": {
            "launcher": "local (real master, PS and worker processes)",
            "warmup_s": args.warmup_s,
            "window_s": args.window_s,
            "checkpoints": "off",
            "wall_s": round(wall, 1),
            "doc": "bench/measure_world.py",
        },
        "workloads": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
