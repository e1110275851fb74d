"""How close ``ps/tables.py`` comes to plain numpy on the same rows: pull, push, memory, growth.

Speed, side by side in one process (dim 16, Adagrad, a table of ``--rows`` rows): each pull
(``EmbeddingTable.lookup``: checks, index, gather, access counters) against ``np.take`` on a
dense array with the batch's row positions computed beforehand; each push
(``apply_gradients``) against the same Adagrad maths on that array (gather, apply, scatter).
Baseline and table alternate, the same batches each; medians of ``--repeats``. Beside each
pull, the index's own lookup (ids to row positions, no row read): what any pull through the
index pays before numpy's whole work begins.

Memory, each size in a fresh process: bytes per row after creating the rows (raw 64-bit ids,
in batches of 4,096, as pulls create them) against the minimum, row + Adagrad state + an
8-byte id, judged on the larger of two measures: resident (the process's growth, which the
heap's own slack blurs by a few MB) and counted (``EmbeddingTable.nbytes``); and the peak
while growing: the largest ratio, over the batches that take the table from half to all its
rows, of the batch's peak resident memory to the memory after it (the table's share of both:
the process's resident memory less what it held before).

    python bench/tables.py              # speed at 1e6 rows; memory at 1e5 and 1e6 rows
    python bench/tables.py --big        # memory at 1e7 rows too (a minute, about 2 GB)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_rover.core.id_probe import PROBE
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.ps.tables import EmbeddingTable, IndexKind

DIM = 16
ADAGRAD = Optimizer("adagrad", 0.05)
MIN_ROW_BYTES = DIM * 4 * 2 + 8  # row + Adagrad accumulator + the id
GOALS = {"pull": 1.5, "push": 1.3, "memory": 1.2, "growth": 1.15}
BATCHES_PER_TIMING = 8
CREATE_BATCH = 4096
ZIPF = 1.1  # data.synthetic's default exponent


def raw_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` distinct ids from the whole int64 range."""
    out = np.unique(rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n))
    while out.size < n:  # a repeat among 2^64 values: vanishingly rare
        out = np.unique(np.concatenate([out, rng.integers(0, 2**62, n - out.size)]))
    return out


def filled(
    kind: IndexKind, rows: int, rng: np.random.Generator
) -> tuple[EmbeddingTable, np.ndarray]:
    """A table holding ``rows`` rows, and its ids."""
    table = EmbeddingTable("bench", DIM, vocab_size=rows, seed=1, optimizer=ADAGRAD, index=kind)
    ids = raw_ids(rng, rows) if kind == "ids" else np.arange(rows, dtype=np.int64)
    for start in range(0, rows, 65_536):
        table.lookup(np.sort(ids[start : start + 65_536]))
    return table, ids


def timed(fn: Callable[[int], object]) -> float:
    start = time.perf_counter()
    for i in range(BATCHES_PER_TIMING):
        fn(i)
    return time.perf_counter() - start


def draw(rng: np.random.Generator, ids: np.ndarray, batch: int, how: str) -> np.ndarray:
    """``batch`` distinct ids, sorted (as a worker sends them): ``uniform`` over the table,
    or ``zipf`` (exponent ZIPF over a random ranking of the ids, as real id logs and
    ``data.synthetic`` are; drawn without replacement by the Gumbel top-k trick)."""
    if how == "uniform":
        return np.sort(rng.choice(ids, batch, replace=False))
    rank = rng.permutation(ids.size) + 1
    keys = -ZIPF * np.log(rank) + rng.gumbel(size=ids.size)
    return np.sort(ids[np.argpartition(-keys, batch)[:batch]])


def speed(kind: IndexKind, rows: int, batch: int, how: str, repeats: int) -> dict[str, float]:
    """Median seconds per batch of the table and of numpy, pull and push."""
    rng = np.random.default_rng(batch)
    table, ids = filled(kind, rows, rng)
    dense = table.rows[:rows].copy()
    accum = table.state["accum"][:rows].copy()
    batches = [draw(rng, ids, batch, how) for _ in range(BATCHES_PER_TIMING)]
    where = [table.index.lookup(b).astype(np.intp) for b in batches]  # numpy's index type
    grads = [rng.normal(0, 0.01, (batch, DIM)).astype(np.float32) for _ in batches]

    def np_pull(i: int) -> object:
        return np.take(dense, where[i], axis=0)

    def np_push(i: int) -> None:
        at = where[i]
        row, state = np.take(dense, at, axis=0), {"accum": np.take(accum, at, axis=0)}
        ADAGRAD.apply(row, state, grads[i])
        dense[at] = row
        accum[at] = state["accum"]

    def pull(i: int) -> object:
        return table.lookup(batches[i])

    def push(i: int) -> None:
        table.apply_gradients(batches[i], grads[i])

    def find(i: int) -> object:
        return table.index.lookup(batches[i])

    times: dict[str, list[float]] = {k: [] for k in ("np_pull", "pull", "find", "np_push", "push")}
    for _ in range(repeats):
        for name, fn in (
            ("np_pull", np_pull),
            ("pull", pull),
            ("find", find),
            ("np_push", np_push),
            ("push", push),
        ):
            times[name].append(timed(fn) / BATCHES_PER_TIMING)
    return {k: statistics.median(v) for k, v in times.items()}


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory(kind: IndexKind, rows: int) -> dict[str, float]:
    """(In a fresh process) the table's resident bytes per row and its peak while growing."""
    rng = np.random.default_rng(rows)
    ids = raw_ids(rng, rows) if kind == "ids" else rng.permutation(rows).astype(np.int64)
    warm = EmbeddingTable("warm", DIM, vocab_size=rows, seed=1, optimizer=ADAGRAD, index=kind)
    warm.lookup(np.sort(ids[:CREATE_BATCH]))  # the heap then holds a batch's temporaries
    del warm
    table = EmbeddingTable("bench", DIM, vocab_size=rows, seed=1, optimizer=ADAGRAD, index=kind)
    base = _status_kb("VmRSS")
    growth = 0.0
    for start in range(0, rows, CREATE_BATCH):
        batch = np.sort(ids[start : start + CREATE_BATCH])
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        table.lookup(batch)
        if start >= rows // 2:
            held = _status_kb("VmRSS") - base
            growth = max(growth, (_status_kb("VmHWM") - base) / held)
    resident = _status_kb("VmRSS") - base
    return {
        "resident_per_row": resident / rows,
        "counted_per_row": table.nbytes() / rows,
        "growth_peak": growth,
    }


def memory_in_child(kind: IndexKind, rows: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--memory-child", kind, str(rows)],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout))


def verdict(name: str, ratio: float) -> str:
    return (
        f"{ratio:5.2f}x  (goal <= {GOALS[name]}x: {'met' if ratio <= GOALS[name] else 'NOT met'})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=1_000_000, help="table rows for speed")
    parser.add_argument("--repeats", type=int, default=5, help="timings per figure (median)")
    parser.add_argument("--batches", default="4096,65536", help="ids per pull/push")
    parser.add_argument("--index", default="ids,vocab", help="table kinds to measure")
    parser.add_argument("--draws", default="uniform,zipf", help="how batches pick ids")
    parser.add_argument("--big", action="store_true", help="memory at 1e7 rows too")
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        kind, rows = args.memory_child
        print(json.dumps(memory(kind, int(rows))))
        return 0
    kinds: list[IndexKind] = [k for k in ("ids", "vocab") if k in args.index.split(",")]
    print(f"id probe: {'compiled C' if PROBE.compiled else 'numpy twin (not built)'}")
    print(f"speed: dim {DIM}, Adagrad, {args.rows:,} rows, median of {args.repeats}")
    for kind in kinds:
        for how in args.draws.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                t = speed(kind, args.rows, batch, how, max(3, args.repeats))
                print(
                    f"  {kind:5} {how:7} {batch:6,} ids  pull {t['pull'] * 1e6:7.0f} us vs "
                    f"numpy {t['np_pull'] * 1e6:6.0f} us: "
                    f"{verdict('pull', t['pull'] / t['np_pull'])}"
                )
                print(
                    f"  {'':5} {'':7} {'':6}      of which finding the rows alone (no row "
                    f"read) {t['find'] * 1e6:.0f} us: {t['find'] / t['np_pull']:.2f}x numpy's pull"
                )
                print(
                    f"  {'':5} {'':7} {'':6}      push {t['push'] * 1e6:7.0f} us vs "
                    f"numpy {t['np_push'] * 1e6:6.0f} us: "
                    f"{verdict('push', t['push'] / t['np_push'])}"
                )
    sizes = [100_000, 1_000_000, *([10_000_000] if args.big else [])]
    print(f"memory: minimum {MIN_ROW_BYTES} B/row (row + Adagrad state + 8-byte id)")
    for kind in kinds:
        for rows in sizes:
            m = memory_in_child(kind, rows)
            per_row = max(m["resident_per_row"], m["counted_per_row"])  # the worse of both
            print(
                f"  {kind:5} {rows:>10,} rows  {m['resident_per_row']:6.1f} B/row resident, "
                f"{m['counted_per_row']:.1f} counted: "
                f"{verdict('memory', per_row / MIN_ROW_BYTES)}; "
                f"growth peak {verdict('growth', m['growth_peak'])}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
