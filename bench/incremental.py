"""Does continuing from yesterday's model pay? Day 2 from day 1's model on half of day 2's
samples, against day 2 from scratch on all of them, on synthetic data whose teacher drifts a
little from day to day (``SyntheticConfig(day=, drift=)``).

Three real local jobs (master, PS, workers as processes, no Airflow):

1. day 1 from scratch on day 1's samples (its model: ``models/<stamp>/``, saved by
   ``--ps-day1`` PS);
2. day 2 from scratch on all of day 2's samples;
3. day 2 from day 1's model (``JobSpec.init``, what ``init_from`` resolves to) on half as
   many samples of day 2 (drawn from day 2's teacher), with ``--ps-day2`` PS (rows
   re-partitioned at load).

Both day-2 jobs are scored on the same held-out split of day 2. Prints the AUCs and the
ratio of samples side by side; the figures are recorded in ``docs/incremental.md``.

    python bench/incremental.py                    # 200k samples a day, drift 0.1
    python bench/incremental.py --samples 100000 --drift 0.2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_rover.core.incremental import InitSource
from airflow_rover.core.spec import JobSpec
from airflow_rover.data.synthetic import GeneratedDataset, SyntheticConfig, generate_dataset
from airflow_rover.hooks.elastic_job import ElasticJobHook

EVAL_SAMPLES = 50_000
DAY1 = 20_000  # days since 1970 of "day 1" (any number: rows record it as their last day)
JOB_TIMEOUT_S = 1800.0


def dataset(root: Path, day: int, samples: int, args: argparse.Namespace) -> GeneratedDataset:
    config = SyntheticConfig(
        num_train=samples, num_eval=EVAL_SAMPLES, seed=args.seed, day=day, drift=args.drift
    )
    return generate_dataset(root / f"day{day}-{samples}", config)


def run_job(
    root: Path,
    name: str,
    data: GeneratedDataset,
    num_ps: int,
    args: argparse.Namespace,
    **extra: Any,
) -> dict[str, Any]:
    """Launch one job, wait for it to end, return its result (with ``wall_s``)."""
    learning_rate = {} if args.lr is None else {"learning_rate": args.lr}
    spec = JobSpec.model_validate(
        {
            "job_id": name,
            "train_data": str(data.train_dir),
            "eval_data": str(data.eval_dir),
            "plan": {"num_ps": num_ps, "num_workers": args.workers},
            "training": {"epochs": 1, "optimizer": "adagrad", **learning_rate},
            "autoscale": {"enabled": False},
            "recovery": {"checkpoint_interval_s": 30},
            **extra,
        }
    )
    hook = ElasticJobHook(root / name)
    started = time.monotonic()
    hook.launch(spec)
    try:
        while time.monotonic() - started < JOB_TIMEOUT_S:
            status = hook.get_status() or {}
            if status.get("state") in ("succeeded", "failed", "stopped"):
                break
            time.sleep(0.5)
        else:
            raise TimeoutError(f"{name}: not done after {JOB_TIMEOUT_S:.0f} s")
    finally:
        hook.stop("bench over")
    if status.get("state") != "succeeded":
        raise RuntimeError(f"{name}: {status.get('state')}: {status.get('message')}")
    result = dict(status["result"])
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(
        f"  {name}: AUC {result['auc']:.4f}, {result['samples_trained']} samples, "
        f"{result['wall_s']} s"
    )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--samples", type=int, default=200_000, help="training samples a day")
    parser.add_argument("--drift", type=float, default=0.1, help="teacher drift per day")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=None, help="default: Adagrad's, 0.2")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--ps-day1", type=int, default=2)
    parser.add_argument("--ps-day2", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="keep data and jobs here")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="rover-incremental-"))
    half = args.samples // 2
    print(f"data: {args.samples} samples a day, drift {args.drift}, seed {args.seed} ({root})")
    day1 = dataset(root / "data", 1, args.samples, args)
    day2 = dataset(root / "data", 2, args.samples, args)
    day2_half = dataset(root / "data", 2, half, args)  # half as many rows of day 2
    first = run_job(root / "jobs", "day1-scratch", day1, args.ps_day1, args, day=DAY1)
    scratch = run_job(root / "jobs", "day2-scratch", day2, args.ps_day2, args, day=DAY1 + 1)
    source = InitSource(location=first["model_folder"], origin="day1-scratch")
    continued = run_job(
        root / "jobs", "day2-from-day1", day2_half, args.ps_day2, args, day=DAY1 + 1, init=source
    )
    print()
    print(f"teacher AUC on day 2's held-out split: {day2.teacher_auc:.4f}")
    print(f"{'day 2 run':<34} {'samples of day 2':>16} {'held-out AUC':>13}")
    print(f"{'from scratch':<34} {scratch['samples_trained']:>16} {scratch['auc']:>13.4f}")
    label = f"from day 1's model ({args.ps_day1} -> {args.ps_day2} PS)"
    print(f"{label:<34} {continued['samples_trained']:>16} {continued['auc']:>13.4f}")
    ratio = continued["samples_trained"] / scratch["samples_trained"]
    gain = continued["auc"] - scratch["auc"]
    print(
        f"samples ratio {ratio:.2f}; AUC difference {gain:+.4f} "
        f"({'reaches' if gain >= 0 else 'does NOT reach'} the from-scratch AUC)"
    )
    return 0 if gain >= 0 else 1


if __name__ == "__main__":
    sys.exit(main())
