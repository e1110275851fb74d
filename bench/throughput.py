"""Training throughput of airflow-rover next to single-process ceilings and TF's own PS.

Measures, in one run, on the same synthetic data and the same Wide&Deep model (26 tables of
dim 16 + 26 wide tables of dim 1, MLP 256-128, batch 512, Adagrad lr 0.2, one epoch):

    (a)  single-process Keras ``model.fit`` with in-graph ``Embedding`` lookups (one Embedding
         per table, and one fused Embedding per dim group; the faster is (a));
    (a*) the same model as a single-process ``tf.function`` loop over plain variables with a
         sparse-row Adagrad: Keras' Adagrad updates every row of every table on each step
         (its ``sqrt(accumulator + eps)`` is dense), so this is the real in-graph ceiling;
    (b)  TensorFlow's ``ParameterServerStrategy`` on localhost, 1 PS + 1 worker, a custom loop
         with (a*)'s math and the variables on the PS; (b') the same with 2 workers;
    (c)  airflow-rover (``run_job`` on the local launcher), 1 PS + 1 worker and 1 PS + 2 workers;
         (c') the same reading the same rows as Parquet files with string ids (hashed into 8
         buckets per id) from an S3 stand-in (moto's server on loopback), side by side with (c).

Every configuration runs alone, in its own child process (a fresh TensorFlow runtime; its
servers are killed afterwards), ``--repeats`` times (3 by default), the configurations in
alternating order (forward, then backward, ...), so a slow spell of the machine does not fall
on one configuration alone; the table shows each one's median and spread. Before each run the
load average and the cores' busy share are checked: the bench waits for a quiet machine, and a
run after which the machine was busy is run again (a bounded number of times, said so).

Rates are steady state for every configuration: (a), (a*) and (b) after their first 20 steps
(tracing included in those); (c) from the workers' step timelines (``core.step_profile``),
from the moment every worker has done 20 steps to the moment the first one finished. (c) is
also measured end to end: the master's figure, first worker ready to last shard done (process
start-up and step tracing excluded: a worker traces its step before it reports ready; the
first PS round trips, lazy row creation and the last flush included), and the job's wall time,
process starts and evaluation included. In (b) and (c) the PS and the workers share the
machine's cores. AUC and log loss are on the held-out split. The first rover run of each
configuration prints its step profile (where a worker's step and a PS request go).

    python bench/throughput.py                    # 300k training samples, 3 runs each
    python bench/throughput.py --quick            # 60k, 1 run each, no waiting: a smoke run
    python bench/throughput.py --configs tf-loop,rover-1w,rover-2w,tf-ps --repeats 5
    python bench/throughput.py --configs rover-1w,rover-1w-parquet-s3   # npy against Parquet
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_rover.core.spec import default_features
from airflow_rover.data import open_dataset
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset

if TYPE_CHECKING:
    from bench._baselines import BenchSetup
    from bench._machine import Quiet

NUM_EVAL = 50_000
QUICK_NUM_TRAIN = 60_000
WARMUP_STEPS = 20  # per worker, as bench._baselines.WARMUP_STEPS for the baselines
BATCH_SIZE = 512
LEARNING_RATE = 0.2
SHARD_SIZE = 8192
EMBEDDING_DIM = 16


@dataclass(frozen=True)
class Config:
    key: str
    group: str  # "a", "a*", "b" or "c"
    label: str


CONFIGS = (
    Config("keras-per-table", "a", "(a) Keras fit, one Embedding per table"),
    Config("keras-fused", "a", "(a) Keras fit, one Embedding per dim group"),
    Config("tf-loop", "a*", "(a*) tf.function loop, sparse-row Adagrad"),
    Config("tf-ps", "b", "(b) TF ParameterServerStrategy, 1 PS + 1 worker"),
    Config("tf-ps-2w", "b", "(b') TF ParameterServerStrategy, 1 PS + 2 workers"),
    Config("rover-1w", "c", "(c) airflow-rover, 1 PS + 1 worker"),
    Config("rover-2w", "c", "(c) airflow-rover, 1 PS + 2 workers"),
    Config("rover-1w-parquet-s3", "c", "(c') airflow-rover, 1 PS + 1 worker, Parquet on S3"),
    Config("rover-2w-parquet-s3", "c", "(c') airflow-rover, 1 PS + 2 workers, Parquet on S3"),
)
PARQUET_SUFFIX = "-parquet-s3"
BUCKETS_PER_ID = 8
BY_KEY = {c.key: c for c in CONFIGS}
DEFAULT_CONFIGS = tuple(c.key for c in CONFIGS)


@dataclass(frozen=True)
class ChildArgs:
    """What a child process needs to run one configuration (passed as JSON)."""

    config: str
    train_dir: str
    eval_dir: str
    work_dir: str
    run_id: str
    worker_cpu: float
    data_schema: dict[str, Any] | None = None  # Parquet configs: the files' schema


# -- one configuration (runs in a child process) ------------------------------------------------
def _setup(args: ChildArgs) -> BenchSetup:
    from bench._baselines import BenchSetup

    schema = open_dataset(args.train_dir).schema
    columns = [(c.name, c.vocab_size) for c in schema.categorical]
    return BenchSetup(
        train_dir=Path(args.train_dir),
        eval_dir=Path(args.eval_dir),
        features=default_features(columns, schema.num_dense, "wide_deep", EMBEDDING_DIM),
        columns=tuple(name for name, _ in columns),
        batch_size=BATCH_SIZE,
        learning_rate=LEARNING_RATE,
    )


def run_rover(args: ChildArgs, num_workers: int) -> dict[str, Any]:
    from airflow_rover.cli import run_job
    from airflow_rover.core.data_schema import DataSchema
    from airflow_rover.core.job_dir import JobDir
    from airflow_rover.core.spec import JobSpec, ResourcePlan, TrainingConfig
    from airflow_rover.core.step_profile import steady_rate
    from airflow_rover.launchers.local import LocalBackend
    from bench._step_profile import read_profiles

    job_id = f"bench-{args.config}-{args.run_id}"
    job_dir = Path(args.work_dir) / "jobs" / job_id
    shutil.rmtree(job_dir, ignore_errors=True)
    spec = JobSpec(
        job_id=job_id,
        train_data=args.train_dir,
        eval_data=args.eval_dir,
        data_schema=DataSchema.model_validate(args.data_schema) if args.data_schema else None,
        plan=ResourcePlan(num_workers=num_workers, num_ps=1, worker_cpu=args.worker_cpu),
        training=TrainingConfig(
            optimizer="adagrad",  # what every baseline here uses
            batch_size=BATCH_SIZE,
            learning_rate=LEARNING_RATE,
            shard_size=SHARD_SIZE,
        ),
    )
    started = time.perf_counter()
    try:
        status = run_job(spec, job_dir, quiet=True)
    finally:
        LocalBackend().stop_master(JobDir(job_dir.resolve()))
    wall = time.perf_counter() - started
    if status.get("state") != "succeeded" or not status.get("result"):
        raise RuntimeError(f"rover job {job_id}: {status.get('state')}: {status.get('message')}")
    result = status["result"]
    profiles = read_profiles(job_dir)
    timelines = [(p["worker"]["step_ends"], p["worker"]["step_samples"]) for p in profiles]
    steady = steady_rate(timelines, WARMUP_STEPS) if len(profiles) == num_workers else None
    return {
        "samples_per_second": steady if steady is not None else result["samples_per_second"],
        "steady": steady is not None,
        "e2e_samples_per_second": result["samples_per_second"],
        "wall_samples_per_second": result["samples_trained_this_run"] / wall,
        "train_seconds": result["train_seconds"],
        "auc": result["auc"],
        "logloss": result.get("logloss"),
        "job_wall_seconds": wall,
        "job_dir": str(job_dir),
        "profile": profiles[0] if profiles else None,
    }


def run_one(args: ChildArgs) -> dict[str, Any]:
    if args.config.startswith("rover-"):
        return run_rover(args, num_workers=int(args.config.split("-")[1][:-1]))
    from bench._baselines import run_keras, run_local_loop, run_tf_ps

    setup = _setup(args)
    if args.config == "keras-per-table":
        return run_keras(setup, fused=False)
    if args.config == "keras-fused":
        return run_keras(setup, fused=True)
    if args.config == "tf-loop":
        return run_local_loop(setup)
    if args.config == "tf-ps":
        return run_tf_ps(setup, num_workers=1)
    if args.config == "tf-ps-2w":
        return run_tf_ps(setup, num_workers=2)
    raise ValueError(f"unknown config {args.config!r}")


def child_main(spec_json: str, result_file: str) -> int:
    args = ChildArgs(**json.loads(spec_json))
    Path(result_file).write_text(json.dumps(run_one(args)))
    return 0


# -- the bench (parent process) -------------------------------------------------------------
def run_child(args: ChildArgs, log_file: Path, timeout_s: float) -> dict[str, Any]:
    """Run one configuration in a fresh interpreter; its output goes to ``log_file``."""
    result_file = log_file.with_suffix(".json")
    result_file.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--child", json.dumps(asdict(args)), str(result_file)]
    from bench._machine import CpuMonitor

    with open(log_file, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            with CpuMonitor(proc.pid) as cpu:
                code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            if args.config.startswith("rover-"):  # its master runs in a session of its own
                from airflow_rover.core.job_dir import JobDir
                from airflow_rover.launchers.local import LocalBackend

                job_dir = Path(args.work_dir) / "jobs" / f"bench-{args.config}-{args.run_id}"
                LocalBackend().stop_master(JobDir(job_dir.resolve()))
            raise RuntimeError(f"{args.config}: timed out after {timeout_s:.0f}s") from None
    if code != 0 or not result_file.exists():
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{args.config}: exit code {code}; see {log_file}\n{tail}")
    result: dict[str, Any] = json.loads(result_file.read_text())
    result["cpu_seconds"], result["other_cores"] = cpu.by_role(), cpu.other_cores()
    return result


def _fmt(value: float | None, spec: str, width: int = 6) -> str:
    return f"{'-':>{width}}" if value is None else format(value, spec)


def _median(runs: list[dict[str, Any]], field: str) -> float | None:
    values = [r[field] for r in runs if r.get(field) is not None]
    return statistics.median(values) if values else None


def _fastest(median: dict[str, float], group: str) -> str | None:
    keys = [k for k in median if BY_KEY[k].group == group]
    return max(keys, key=median.__getitem__) if keys else None


def print_table(results: dict[str, list[dict[str, Any]]], num_train: int) -> None:
    """One row per configuration (median over repeats) and the ratios the issue asks for.

    (a) is the faster Keras ``fit`` variant; (a*) the single-process custom loop with the
    same sparse-row Adagrad as the PS baselines, the real ceiling of in-graph embeddings
    here (Keras' Adagrad touches every row of every table on each step).
    """
    median: dict[str, float] = {
        k: statistics.median(r["samples_per_second"] for r in runs)
        for k, runs in results.items()
        if runs
    }
    keras_fit, loop, ps_base = _fastest(median, "a"), _fastest(median, "a*"), median.get("tf-ps")

    def ratio(rate: float, base: str | float | None) -> float | None:
        value = median.get(base) if isinstance(base, str) else base
        return rate / value if value else None

    width = max(len(BY_KEY[k].label) for k in results)
    print(
        f"\n{'config':<{width}}  {'samples/s':>9}  {'AUC':>6}  {'logloss':>7}  {'vs (a)':>6}"
        f"  {'vs(a*)':>6}  {'vs (b)':>6}  {'spread':>6}  runs (samples/s)"
    )
    for key, runs in results.items():
        if not runs:
            print(f"{BY_KEY[key].label:<{width}}  failed")
            continue
        rate = median[key]
        rates = [r["samples_per_second"] for r in runs]
        each = ", ".join(
            f"{x:.0f}{'*' if r.get('busy') else ''}" for x, r in zip(rates, runs, strict=True)
        )
        spread = (max(rates) - min(rates)) / rate if rate else 0.0
        print(
            f"{BY_KEY[key].label:<{width}}  {rate:>9.0f}  {_fmt(_median(runs, 'auc'), '6.4f')}"
            f"  {_fmt(_median(runs, 'logloss'), '7.4f', 7)}"
            f"  {_fmt(ratio(rate, keras_fit), '6.2f')}  {_fmt(ratio(rate, loop), '6.2f')}"
            f"  {_fmt(ratio(rate, ps_base), '6.2f')}  {spread:>6.1%}  {each}"
        )
    print()
    for name, base_key in (("(a) ", keras_fit), ("(a*)", loop), ("(b) ", "tf-ps")):
        if base_key in median:
            label = BY_KEY[base_key].label.split(" ", 1)[1]
            print(f"{name} = {label}: {median[base_key]:.0f} samples/s")
    bases = (("(c)/(a)", keras_fit), ("(c)/(a*)", loop), ("(c)/(b)", ps_base))
    for key in ("rover-1w", "rover-2w"):
        if key in median:
            parts = [f"{name} = {_fmt(ratio(median[key], base), '.2f', 1)}" for name, base in bases]
            ref = next((k for k in (loop, keras_fit, "tf-ps") if k in median), None)
            auc = _median(results[key], "auc")
            ref_auc = _median(results[ref], "auc") if ref else None
            if auc is not None and ref_auc is not None:
                parts.append(f"AUC {auc - ref_auc:+.4f} vs {ref}")
            print(f"{BY_KEY[key].label}: {', '.join(parts)}")
    for key, runs in results.items():
        e2e, wall = (
            _median(runs, "e2e_samples_per_second"),
            _median(runs, "wall_samples_per_second"),
        )
        if e2e is not None and wall is not None:
            vs = f" (master's / (a*) = {e2e / median[loop]:.2f})" if loop in median else ""
            print(
                f"{BY_KEY[key].label}, end to end (medians): master's rate {e2e:.0f}{vs}, "
                f"job wall {wall:.0f} samples/s"
            )
    loads = [r["load_before"] for runs in results.values() for r in runs if "load_before" in r]
    others = [r["other_cores"] for runs in results.values() for r in runs]
    if loads:
        print(
            f"load average before the runs: {min(loads):.2f} to {max(loads):.2f}; cores other "
            f"processes kept busy during them: {min(others):.2f} to {max(others):.2f} "
            f"(median {statistics.median(others):.2f}); * = a run kept although busy"
        )
    for workers in ("1w", "2w"):
        npy, parquet = (
            median.get(f"rover-{workers}"),
            median.get(f"rover-{workers}{PARQUET_SUFFIX}"),
        )
        if npy and parquet:
            print(
                f"(c') Parquet on S3 / (c) npy-columns, {workers}: {parquet:.0f} / {npy:.0f} "
                f"samples/s = {parquet / npy:.2f}"
            )
    print(
        f"\n{num_train} training samples, {NUM_EVAL} held-out; batch {BATCH_SIZE}, "
        f"Adagrad lr {LEARNING_RATE}, 1 epoch.\n"
        f"os.cpu_count() = {os.cpu_count()}. One configuration runs at a time; in (b) and (c) "
        "the PS, the worker(s)\nand (c)'s master and evaluator share these cores, (a) and (a*) "
        "have them to themselves.\nOther processes on the machine skew every figure: see the "
        "load averages above.\nMedians of the runs; spread = (max - min) / median. (a), (a*), "
        "(b): steady state after 20\nwarm-up steps; (c): steady state from the workers' step "
        "timelines (every worker past 20\nsteps, to the first one done), and end to end as "
        "printed."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--num-train", type=int, default=300_000)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_NUM_TRAIN} samples")
    parser.add_argument(
        "--repeats", type=int, default=None, help="runs of each configuration (3; --quick: 1)"
    )
    parser.add_argument(
        "--max-load",
        type=float,
        default=float(os.cpu_count() or 1),
        help="1-minute load average above which a run waits (the bench's own runs add to it)",
    )
    parser.add_argument(
        "--max-busy",
        type=float,
        default=0.5,
        help="cores other processes may keep busy: before a run (sampled while the bench is "
        "idle) or it waits, and during it (the machine's busy time less the run's) or it is "
        "run again",
    )
    parser.add_argument("--wait", type=float, default=120.0, help="seconds to wait for quiet")
    parser.add_argument("--retries", type=int, default=2, help="repeats of a busy run, at most")
    parser.add_argument(
        "--configs",
        default=",".join(DEFAULT_CONFIGS),
        help=f"comma-separated, from: {', '.join(BY_KEY)}",
    )
    parser.add_argument(
        "--worker-cpu", type=float, default=1.0, help="rover ResourcePlan.worker_cpu"
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "airflow-rover-bench",
        help="datasets, job directories and child logs (kept for inspection)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="per run, seconds")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(*args.child)

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in BY_KEY]
    if unknown:
        parser.error(f"--configs: unknown {unknown}; choose from {list(BY_KEY)}")
    num_train = QUICK_NUM_TRAIN if args.quick else args.num_train
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.quick:
        args.wait, args.retries = min(args.wait, 10.0), 0
    work_dir = args.work_dir.resolve()
    data = generate_dataset(
        work_dir / f"data-n{num_train}-s0",
        SyntheticConfig(num_train=num_train, num_eval=NUM_EVAL, seed=0),
    )
    logs = work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    print(
        f"data: {data.root} (teacher AUC {data.teacher_auc:.4f}); logs: {logs}; "
        f"os.cpu_count() = {os.cpu_count()}",
        flush=True,
    )

    cpu_tag = "" if args.worker_cpu == 1 else f"-cpu{args.worker_cpu:g}"
    with contextlib.ExitStack() as stack:
        parquet = None
        if any(c.endswith(PARQUET_SUFFIX) for c in configs):
            parquet = stack.enter_context(parquet_on_s3(data.train_dir, data.eval_dir, logs))
        results = run_configs(configs, args, data, work_dir, num_train, cpu_tag, logs, parquet)
    print_table(results, num_train)
    return 0 if all(results.values()) else 1


@contextlib.contextmanager
def parquet_on_s3(
    train_dir: Path, eval_dir: Path, logs: Path
) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """The splits as Parquet with string ids on the S3 stand-in: (train URI, eval URI,
    schema); this process's environment reads S3 from it while the block runs."""
    from airflow_rover.data.synthetic_files import parquet_schema, write_parquet
    from bench._s3_standin import apply_env, s3_standin, upload

    files = train_dir.parent / "parquet"
    train = write_parquet(train_dir, files / "train", num_files=8, string_ids=True)
    held_out = write_parquet(eval_dir, files / "eval", num_files=2, string_ids=True)
    schema = parquet_schema(train_dir, string_ids=True, buckets_per_id=BUCKETS_PER_ID)
    with s3_standin(logs / "moto.log") as endpoint:
        apply_env(endpoint)
        uris = (
            upload(endpoint, train, "bench", "train"),
            upload(endpoint, held_out, "bench", "eval"),
        )
        print(f"Parquet on the S3 stand-in: {uris[0]}, {uris[1]}", flush=True)
        yield uris[0], uris[1], schema.model_dump(mode="json")


def _order(configs: list[str], rep: int) -> list[str]:
    """Run ``rep``'s order: forward, backward, forward, ... (alternating)."""
    return configs if rep % 2 == 0 else configs[::-1]


def run_configs(
    configs: list[str],
    args: argparse.Namespace,
    data: Any,
    work_dir: Path,
    num_train: int,
    cpu_tag: str,
    logs: Path,
    parquet: tuple[str, str, dict[str, Any]] | None,
) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    for rep in range(args.repeats):
        for key in _order(configs, rep):
            on_s3 = parquet is not None and key.endswith(PARQUET_SUFFIX)
            child = ChildArgs(
                config=key,
                train_dir=parquet[0] if on_s3 and parquet else str(data.train_dir),
                eval_dir=parquet[1] if on_s3 and parquet else str(data.eval_dir),
                data_schema=parquet[2] if on_s3 and parquet else None,
                work_dir=str(work_dir),
                run_id=f"n{num_train}-r{rep}" + cpu_tag,
                worker_cpu=args.worker_cpu,
            )
            res = run_quietly(child, args, logs / f"{key}-{child.run_id}.log", f"run {rep + 1}")
            if res is None:
                continue
            results[key].append(res)
            if res.get("profile") and len(results[key]) == 1:
                from bench._step_profile import format_profile

                print(format_profile(res["profile"], BY_KEY[key].label), flush=True)
    return results


def run_quietly(
    child: ChildArgs, args: argparse.Namespace, log_file: Path, name: str
) -> dict[str, Any] | None:
    """One run of ``child`` on a quiet machine: wait for one before it, and run it again when
    other processes kept more than ``args.max_busy`` cores busy during it (at most
    ``args.retries`` times, each said so); None when it failed."""
    from bench._machine import wait_quiet

    key = child.config
    res: dict[str, Any] | None = None
    for attempt in range(args.retries + 1):
        before = wait_quiet(args.max_load, args.max_busy, args.wait)
        if not before.quiet:
            print(f"  {key} {name}: machine still busy ({before.describe()}), run anyway")
        started = time.perf_counter()
        try:
            res = run_child(child, log_file, args.timeout)
        except RuntimeError as exc:
            print(f"  {key} {name}: FAILED: {exc}", flush=True)
            return None
        res["load_before"] = before.load
        print(_run_line(key, name, res, time.perf_counter() - started, before), flush=True)
        if res["other_cores"] <= args.max_busy:
            return res
        if attempt < args.retries:
            print(f"  {key} {name}: other processes were busy during it; running it again")
        else:
            print(f"  {key} {name}: busy during {args.retries + 1} tries; the last one kept")
            res["busy"] = True
    return res


def _run_line(key: str, name: str, res: dict[str, Any], wall: float, before: Quiet) -> str:
    e2e = ""
    if "e2e_samples_per_second" in res:
        e2e = (
            f" ({'steady' if res['steady'] else 'NO TIMELINE: master'}; end to end: "
            f"{res['e2e_samples_per_second']:.0f} master's, "
            f"{res['wall_samples_per_second']:.0f} job wall)"
        )
    cpu = ", ".join(f"{role} {s:.1f}" for role, s in sorted(res["cpu_seconds"].items()))
    return (
        f"  {key} {name}: {res['samples_per_second']:.0f} samples/s{e2e}, AUC {res['auc']:.4f}"
        f"\n    {wall:.0f}s wall; before: {before.describe()}; during: other processes "
        f"{res['other_cores']:.2f} cores; CPU s: {cpu}"
    )


if __name__ == "__main__":
    sys.exit(main())
