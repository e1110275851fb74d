"""Raw 64-bit ids in a collisionless table against the same ids hashed into a vocabulary of
as many rows as there are ids: held-out AUC of the same job on the same samples.

The data (``data.synthetic_raw_ids``): a ``user`` column of ``--ids`` distinct raw ids from
the whole int64 range, each with its own effect on the click, a small ``item`` vocabulary and
two dense features. One job reads the raw column (tables of index 'ids'); the other the same
samples with the ids hashed as the readers hash ints into ``--ids`` buckets (index 'vocab'),
where ids sharing a row average their effects away. Both jobs run here, one after the other,
with the same plan, seed and optimizer (wide_deep, 1 worker, 1 PS, Adam: its steps do not
shrink with the batch's mean gradient of a row seen once in 512 samples, as Adagrad's do
from its initial accumulator, so ids seen some 40 times can learn their effect).

    python bench/raw_ids.py [--ids 10000] [--train 200000] [--out /tmp/raw_ids]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_rover.cli import run_job
from airflow_rover.core.spec import JobSpec
from airflow_rover.data.synthetic_raw_ids import RawIdConfig, collision_share, write_raw_id_dataset


def _train(name: str, data: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The job's result (``auc``, ``embedding_rows``, ...) with its wall time as ``wall_s``."""
    spec = JobSpec.model_validate(
        {
            "job_id": f"raw-ids-{name}",
            "train_data": str(data / "train"),
            "eval_data": str(data / "eval"),
            "plan": {"num_workers": 1, "num_ps": 1},
            "training": {
                "optimizer": "adam",
                "learning_rate": args.lr,
                "batch_size": 512,
                "shard_size": 8192,
                "epochs": args.epochs,
                "seed": 1,
            },
            "autoscale": {"enabled": False},
        }
    )
    started = time.perf_counter()
    status = run_job(spec, out / f"job-{name}", poll_s=0.5, quiet=True)
    if status["state"] != "succeeded":
        raise SystemExit(f"{name} job {status['state']}: {status.get('message')}")
    return dict(status["result"]) | {"wall_s": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=10_000, help="distinct raw ids")
    parser.add_argument("--train", type=int, default=200_000, help="training samples")
    parser.add_argument("--eval", type=int, default=50_000, help="held-out samples")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.01, help="Adam's learning rate")
    parser.add_argument("--out", type=Path, default=Path("/tmp/raw_ids"))
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    config = RawIdConfig(num_train=args.train, num_eval=args.eval, num_ids=args.ids, seed=7)
    raw = write_raw_id_dataset(args.out / "raw", config)
    write_raw_id_dataset(args.out / "vocab", config, buckets=args.ids)
    shared = collision_share(raw.train_ids, args.ids)
    ids = _train("ids", args.out / "raw", args.out, args)
    vocab = _train("vocab", args.out / "vocab", args.out, args)
    print(
        f"{args.train:,} samples x {args.epochs} epochs, {raw.train_ids.size:,} distinct ids "
        f"trained; a vocabulary of {args.ids:,} rows (1x): {shared:.1%} of them share a row"
    )
    for name, result in (("ids", ids), ("vocab 1x", vocab)):
        print(
            f"{name:>9}: held-out AUC {result['auc']:.4f}, logloss {result['logloss']:.4f}, "
            f"{result['embedding_rows']:,} rows, {result['wall_s']:.0f} s"
        )
    gain = ids["auc"] - vocab["auc"]
    print(f"AUC ids - vocab 1x: {gain:+.4f} ({'ids better' if gain > 0 else 'ids NOT better'})")
    summary = {"collision_share": shared, "auc_ids": ids["auc"], "auc_vocab": vocab["auc"]}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
