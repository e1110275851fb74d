"""Resizing a running job: what it costs in training pause, side by side with the alternatives.

    python bench/elastic.py              # ~3 min on 2 cores
    python bench/elastic.py --samples 200000

Three measurements, each next to its baseline in the same run:

1. PS 2 -> 3 on a training job (2 workers). airflow-rover: the plan is requested and applied
   live (new PS start while training goes on; leases pause until the leased shards land; rows
   move; workers switch). Baseline, stop-checkpoint-restart: the same job, stopped right after a
   committed checkpoint and relaunched with 3 PS from it (the checkpoint is re-partitioned on
   load). Pause: airflow-rover's is the master's window with no lease handed out (drain +
   migration + the workers' next lease); the baseline's runs from the stop until a worker trains
   again (its checkpoint time is not counted, which favours the baseline). Goal: >= 5x shorter.
2. Adding 2 workers to a 1-worker job: worker-0's progress while the new workers start (their
   TensorFlow start-up shares this machine's cores) against before. Goal: worker-0 never pauses
   (its longest gap between progress reports stays at the heartbeat interval).
3. Flash checkpoint save speed next to memcpy in the same run (``bench/flash_checkpoint.py``).
   Goal: >= 50% of memcpy.
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from airflow_rover.core.plans import PlanRecord
from airflow_rover.core.spec import JobSpec
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.rpc.master_api import API_PREFIX

GOAL_PAUSE_RATIO = 5.0
HEARTBEAT_S = 1.0  # workers report progress this often (worker/progress.py)


def spec_for(data: Any, job_id: str, num_ps: int, num_workers: int) -> JobSpec:
    return JobSpec.model_validate(
        {
            "job_id": job_id,
            "train_data": str(data.train_dir),
            "plan": {"num_ps": num_ps, "num_workers": num_workers},
            "training": {"shard_size": 2048, "epochs": 50, "optimizer": "adagrad"},
            "autoscale": {"enabled": False},
            "recovery": {"checkpoint_interval_s": 3},
        }
    )


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 300.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def worker_samples(status: dict[str, Any], node: str | None = None) -> int:
    return sum(
        n["samples"]
        for n in status.get("nodes", [])
        if n["role"] == "worker" and (node is None or n["id"] == node)
    )


def training(hook: ElasticJobHook, at_least: int) -> Callable[[], bool]:
    def check() -> bool:
        status = hook.get_status()
        return status.get("state") == "running" and worker_samples(status) >= at_least

    return check


def start_apply(hook: ElasticJobHook, **counts: int) -> PlanRecord:
    """Request a plan and apply it as the trigger does (``POST /plans/{id}/apply``)."""
    record = hook.request_plan(reason="bench", **counts)
    layout = hook.get_conn()
    httpx.post(
        f"{layout.master_info()['address']}{API_PREFIX}/plans/{record.id}/apply",
        headers={"Authorization": f"Bearer {layout.token_file.read_text().strip()}"},
        timeout=30,
    ).raise_for_status()
    return record


def apply(hook: ElasticJobHook, **counts: int) -> dict[str, Any]:
    """``start_apply``, then wait until the master says the plan is applied."""
    record = start_apply(hook, **counts)

    def applied() -> dict[str, Any] | None:
        plans = hook.get_status()["plans"]
        now = next(p for p in plans if p["id"] == record.id)
        if now["state"] not in ("proposed", "applying", "applied"):
            raise RuntimeError(f"plan {record.id} {now['state']}: {now.get('note')}")
        return now if now["state"] == "applied" else None

    return dict(wait_for("the plan applied", applied))


def live_resize(data: Any, root: Path) -> dict[str, float]:
    hook = ElasticJobHook(root / "live")
    hook.launch(spec_for(data, "live", 2, 2))
    try:
        wait_for("training", training(hook, 30_000))
        record = apply(hook, num_ps=3)
        wait_for("training on 3 PS", training(hook, worker_samples(hook.get_status()) + 4096))
        return {
            "pause_s": record["pause_s"],
            "migration_s": record["migration_s"],
            "moved_rows": record["moved_rows"],
        }
    finally:
        hook.stop("bench done")


def stop_checkpoint_restart(data: Any, root: Path) -> dict[str, float]:
    hook = ElasticJobHook(root / "restart")
    spec = spec_for(data, "restart", 2, 2)
    hook.launch(spec)
    try:
        wait_for("training", training(hook, 30_000))
        before = hook.get_status()["recovery"]["checkpoints"]
        wait_for(
            "a committed checkpoint",
            lambda: hook.get_status()["recovery"]["checkpoints"] > before,
        )
        stopped = time.perf_counter()
        hook.stop("resize by restart")
        grown = spec.model_copy(update={"plan": spec.plan.model_copy(update={"num_ps": 3})})
        hook.launch(grown)
        wait_for("training again", training(hook, 1))
        resumed = time.perf_counter()
        return {"pause_s": resumed - stopped}
    finally:
        hook.stop("bench done")


def add_workers(data: Any, root: Path) -> dict[str, float]:
    """worker-0's progress reports before and while 2 workers join."""
    hook = ElasticJobHook(root / "workers")
    hook.launch(spec_for(data, "workers", 1, 1))

    def trace(until: Callable[[dict[str, Any]], bool]) -> list[tuple[float, int]]:
        points: list[tuple[float, int]] = []
        while True:
            status = hook.get_status()
            points.append((time.perf_counter(), worker_samples(status, "worker-0")))
            if until(status):
                return points
            time.sleep(0.05)

    try:
        wait_for("training", training(hook, 20_000))
        start = time.perf_counter()
        before = trace(lambda _s: time.perf_counter() - start > 8)
        start_apply(hook, num_workers=3)

        def joined(status: dict[str, Any]) -> bool:
            return all(worker_samples(status, f"worker-{i}") > 0 for i in (1, 2))

        during = trace(joined)
        return {
            "rate_before": rate(before),
            "rate_during": rate(during),
            "gap_before_s": longest_gap(before),
            "gap_during_s": longest_gap(during),
            "join_s": during[-1][0] - during[0][0],
        }
    finally:
        hook.stop("bench done")


def rate(points: list[tuple[float, int]]) -> float:
    (t0, s0), (t1, s1) = points[0], points[-1]
    return (s1 - s0) / (t1 - t0)


def longest_gap(points: list[tuple[float, int]]) -> float:
    """The longest time between two increases of the sample count."""
    changes = [t for (_, prev), (t, s) in itertools.pairwise(points) if s > prev]
    return max((b - a for a, b in itertools.pairwise(changes)), default=0.0)


def flash_summary(rows: int) -> list[str]:
    bench = Path(__file__).with_name("flash_checkpoint.py")
    out = subprocess.run(
        [sys.executable, str(bench), "--rows", str(rows), "--repeats", "3"],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = out.stdout.strip().splitlines()
    return [line for line in lines if line.startswith(("flash checkpoint", "memcpy ("))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200_000, help="training set size")
    parser.add_argument("--flash-rows", type=int, default=2_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="elastic-bench-") as tmp:
        root = Path(tmp)
        data = generate_dataset(
            root / "data", SyntheticConfig(num_train=args.samples, num_eval=1000, seed=4)
        )
        live = live_resize(data, root)
        restart = stop_checkpoint_restart(data, root)
        workers = add_workers(data, root)
    ratio = restart["pause_s"] / live["pause_s"]
    print("== PS 2 -> 3 on a training job (2 workers)")
    print(
        f"airflow-rover live resize    pause {live['pause_s']:6.2f} s "
        f"(of which moving {live['moved_rows']:,} rows: {live['migration_s']:.2f} s)"
    )
    print(f"stop-checkpoint-restart      pause {restart['pause_s']:6.2f} s")
    verdict = "MET" if ratio >= GOAL_PAUSE_RATIO else "NOT MET"
    print(f"ratio {ratio:.1f}x shorter; goal >= {GOAL_PAUSE_RATIO:.0f}x: {verdict}\n")
    print("== adding 2 workers to a 1-worker job (worker-0's progress)")
    print(
        f"before: {workers['rate_before']:8.0f} samples/s, longest gap between progress "
        f"reports {workers['gap_before_s']:.2f} s"
    )
    print(
        f"while 2 workers join ({workers['join_s']:.0f} s): {workers['rate_during']:8.0f} "
        f"samples/s, longest gap {workers['gap_during_s']:.2f} s"
    )
    paused = workers["gap_during_s"] > max(2 * HEARTBEAT_S, 1.5 * workers["gap_before_s"])
    verdict = "NOT MET" if paused else "MET"
    print(f"worker-0 paused: {'yes' if paused else 'no'}; goal: no pause: {verdict}")
    print("\n== flash checkpoint vs memcpy (bench/flash_checkpoint.py, same run)")
    for line in flash_summary(args.flash_rows):
        print(line)
    return 0 if ratio >= GOAL_PAUSE_RATIO and not paused else 1


if __name__ == "__main__":
    sys.exit(main())
