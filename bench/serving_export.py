"""How long the SavedModel export takes and how big it is, for the demo's model.

Trains the demo's job (``dags/daily_retrain.py``'s defaults: 200,000 rows, 2 PS, 2 workers,
``wide_deep`` with 16-wide tables over ~529k ids) with ``rover``'s ``run_job``, then exports
it in a process of its own as the training task does, and prints the partitions' size, the
SavedModel's size and the export's time, and the time of loading and scoring it.

    python bench/serving_export.py [--rows 200000] [--out /tmp/serving_export]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from airflow_rover.cli import run_job
from airflow_rover.core.spec import JobSpec
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset

LOAD_AND_SCORE = """
import sys, time
import numpy as np
import tensorflow as tf
t = time.monotonic()
model = tf.saved_model.load(sys.argv[1])
loaded = time.monotonic() - t
inputs = {k: tf.constant(v) for k, v in np.load(sys.argv[2]).items()}
t = time.monotonic()
model.serve(inputs)
print(f"{loaded:.2f} {time.monotonic() - t:.3f}")
"""


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--out", type=Path, default=Path("/tmp/serving_export"))
    args = parser.parse_args()
    data = generate_dataset(args.out / "data", SyntheticConfig(num_train=args.rows, num_eval=8192))
    spec = JobSpec.model_validate(
        {
            "job_id": "serving-export-bench",
            "train_data": str(data.train_dir),
            "plan": {"num_ps": 2, "num_workers": 2},
        }
    )
    status = run_job(spec, args.out / "job", poll_s=0.5, quiet=True)
    if status["state"] != "succeeded":
        sys.exit(f"the job {status['state']}: {status.get('message')}")
    folder = (args.out / "job" / "model").resolve()
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "airflow_rover.worker.export", str(folder)], check=True)
    export_s = time.monotonic() - started
    info = json.loads((folder / "saved_model" / "export.json").read_text())

    import numpy as np

    from airflow_rover.data.reader import open_dataset

    reader = open_dataset(data.eval_dir)
    batch = reader.read(0, 8192)
    names = [c.name for c in reader.schema.categorical]
    inputs: dict[str, Any] = {"dense_features": batch.dense}
    inputs |= {n: batch.categorical[:, j] for j, n in enumerate(names)}
    np.savez(args.out / "batch.npz", **inputs)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            LOAD_AND_SCORE,
            str(folder / "saved_model"),
            str(args.out / "batch.npz"),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    partitions = sum(p.stat().st_size for p in folder.glob("ps-*.npz"))
    print(f"trained rows:      {info['trained_rows']:,}")
    print(f"PS partitions:     {partitions / 1e6:.1f} MB (rows and optimizer state)")
    print(f"SavedModel:        {_size(folder / 'saved_model') / 1e6:.1f} MB")
    print(f"export:            {export_s:.1f} s in its process ({info['export_s']:.1f} s inside)")
    print(f"load / score 8192: {out[0]} s / {out[1]} s")


if __name__ == "__main__":
    main()
