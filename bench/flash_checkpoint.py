"""Flash checkpoint of one parameter server: save speed next to this machine's memcpy speed,
the training pause before and after, and what the background persist and a restore cost.

A realistic PS partition (``--rows`` rows of dim ``--dim`` with Adagrad state, access counts,
ids, a small dense part and a batch ledger of ``--ledger`` keys) is checkpointed:

- memcpy: ``np.copyto`` of the same arrays into a buffer already faulted in (the ceiling), and
  into freshly allocated arrays (what a copy that allocates pays);
- before: the previous ``save()``: the snapshot copied under the apply lock (fresh arrays, the
  ledger sorted under the lock), then ``np.savez`` and fsync while the Save call, and so the
  master, waited;
- after: the flash save (``ParameterServer.save`` in ``flash`` mode): the copy into the PS's
  shared-memory slot under the apply lock (the ledger as one array, unsorted), the reply, then
  the persister's sort of the ledger, checksummed write and fsync; the first one (which
  allocates the slot) and the steady state (median of ``--repeats``), with what the Save call
  spends outside the copy;
- while each runs, a thread pushes small keyed batches and the slowest push is reported;
- restore: checking a part's SHA-256, and loading it from disk vs from shared memory.

    python bench/flash_checkpoint.py                  # 4 M rows x dim 16 (~0.56 GB)
    python bench/flash_checkpoint.py --rows 1000000   # a quicker run
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_rover.core.checkpoint_files import read_digest
from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.job_dir import ENV_FLASH_DIR, flash_dir_for
from airflow_rover.core.spec import FeatureConfig, TableConfig
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.ps.flash import FlashCheckpointer
from airflow_rover.ps.server import ParameterServer

GOAL_RATIO = 0.5
CHUNK_ROWS = 500_000


def build_ps(rows: int, dim: int, ledger: int) -> tuple[ParameterServer, str]:
    features = FeatureConfig(
        num_dense=13, tables=(TableConfig(name="t", column="C1", vocab_size=rows + 1000, dim=dim),)
    )
    layout = EmbeddingPlacement.from_features(features)
    group = layout.groups[0].name
    ps = ParameterServer(0, 1, layout, Optimizer("adagrad", 0.05), seed=1)
    ps.init_dense({"dense/mlp/kernel": np.ones((512, 256), np.float32)})
    for key, start in enumerate(range(0, rows, CHUNK_ROWS)):
        ids = np.arange(start, min(start + CHUNK_ROWS, rows), dtype=np.int64)
        grads = np.full((ids.size, dim), 0.01, dtype=np.float32)
        ps.push({"key": np.array([key]), f"ids/{group}": ids, f"grad/{group}": grads})
    ps.ledger.applied.update(range(1000, 1000 + ledger))  # the batches of a long job so far
    return ps, group


def live_arrays(ps: ParameterServer) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for table in ps.tables.values():
        n = table.size
        out += [table.live_ids, table.rows[:n], table.counts[:n]]
        out += [v[:n] for v in table.state.values()]
    out += list(ps.dense.values.values())
    out += [v for slots in ps.dense.state.values() for v in slots.values()]
    return out


def copy_all(pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for target, source in pairs:
        np.copyto(target, source)


def best_of(repeats: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def memcpy_rates(arrays: list[np.ndarray], repeats: int) -> tuple[float, float]:
    nbytes = sum(a.nbytes for a in arrays)
    targets = [np.empty_like(a) for a in arrays]
    for d, a in zip(targets, arrays, strict=True):
        np.copyto(d, a)  # fault the pages in
    pairs = list(zip(targets, arrays, strict=True))
    warm = best_of(repeats, lambda: copy_all(pairs))
    pairs.clear()
    targets.clear()
    fresh = best_of(repeats, lambda: [a.copy() for a in arrays])
    return nbytes / warm / 1e9, nbytes / fresh / 1e9


def legacy_save(ps: ParameterServer, path: Path) -> tuple[float, float, int]:
    """The save() this change replaced: (apply-lock pause, whole Save call, bytes)."""
    start = time.perf_counter()
    with ps.applying():
        locked = time.perf_counter()
        arrays: dict[str, np.ndarray] = {}
        for name, table in ps.tables.items():
            arrays.update({f"table/{name}/{k}": v for k, v in table.snapshot().items()})
        arrays.update(ps.dense.snapshot())
        arrays.update(ps.ledger.to_arrays())
        arrays["num_ps"] = np.array([ps.num_ps], dtype=np.int64)
        arrays["ps_index"] = np.array([ps.index], dtype=np.int64)
        pause = time.perf_counter() - locked
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return pause, time.perf_counter() - start, sum(a.nbytes for a in arrays.values())


def flash_save(ps: ParameterServer, path: Path) -> dict[str, float]:
    req = {
        "path": np.frombuffer(str(path).encode(), dtype=np.uint8),
        "mode": np.frombuffer(b"flash", dtype=np.uint8),
    }
    start = time.perf_counter()
    reply = ps.save(req)
    returned = time.perf_counter()
    status = {"path": req["path"], "mode": np.frombuffer(b"status", dtype=np.uint8)}
    while int(ps.save(status)["state"][0]) == 1:
        time.sleep(0.005)
    if int(ps.save(status)["state"][0]) != 2:
        raise RuntimeError(f"persist failed: {ps.save(status)}")
    return {
        "bytes": float(reply["bytes"][0]),
        "pause_s": float(reply["pause_s"][0]),
        "save_s": returned - start,
        "persisted_s": time.perf_counter() - start,
    }


class Pusher:
    """Small keyed pushes in a loop (a worker's traffic); records the slowest."""

    def __init__(self, ps: ParameterServer, group: str, dim: int) -> None:
        self.ps, self.group, self.dim = ps, group, dim
        self.stop = threading.Event()
        self.worst = 0.0
        self.count = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        rng = np.random.default_rng(0)
        key = 10**9
        while not self.stop.is_set():
            ids = np.unique(rng.integers(0, 100_000, 512)).astype(np.int64)
            grads = np.full((ids.size, self.dim), 0.001, dtype=np.float32)
            start = time.perf_counter()
            self.ps.push(
                {"key": np.array([key]), f"ids/{self.group}": ids, f"grad/{self.group}": grads}
            )
            self.worst = max(self.worst, time.perf_counter() - start)
            self.count += 1
            key += 1
            time.sleep(0.001)

    def __enter__(self) -> Pusher:
        self.thread.start()
        time.sleep(0.05)
        self.worst = 0.0
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--ledger", type=int, default=1_000_000, help="batch keys applied")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="durable checkpoint folder")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="flash-bench-", dir=args.dir))
    checkpoints = work / "checkpoints"
    slot_root = os.environ.get(ENV_FLASH_DIR) or "/dev/shm (default)"
    try:
        t0 = time.perf_counter()
        ps, group = build_ps(args.rows, args.dim, args.ledger)
        arrays = live_arrays(ps)
        nbytes = sum(a.nbytes for a in arrays)
        print(
            f"PS partition: {args.rows:,} rows x dim {args.dim}, Adagrad, "
            f"{len(ps.ledger.applied):,} ledger keys: {nbytes / 1e9:.3f} GB of arrays "
            f"(built in {time.perf_counter() - t0:.1f} s); cores: {os.cpu_count()}, "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        print(f"durable folder: {checkpoints} ; shared memory: {slot_root}\n")

        warm, fresh = memcpy_rates(arrays, args.repeats)
        print(f"memcpy (np.copyto, pages faulted in): {warm:6.2f} GB/s")
        print(f"memcpy into fresh arrays (allocating): {fresh:6.2f} GB/s\n")

        legacy = []
        for i in range(args.repeats):
            with Pusher(ps, group, args.dim) as pusher:
                pause, call, size = legacy_save(ps, work / f"legacy-{i}.npz")
            legacy.append((pause, call, pusher.worst))
        l_pause = statistics.median(p for p, _, _ in legacy)
        l_call = statistics.median(c for _, c, _ in legacy)
        l_worst = max(w for _, _, w in legacy)
        print("before (snapshot under the lock, then np.savez + fsync inside the Save call):")
        print(f"  training pause (apply lock held)  {l_pause * 1e3:8.1f} ms")
        rate = size / l_call / 1e9
        print(f"  Save call (master waits)           {l_call * 1e3:8.1f} ms  ({rate:.2f} GB/s)")
        print(f"  slowest push while saving          {l_worst * 1e3:8.1f} ms\n")

        # Each flash save right after a memcpy of the same bytes: the two see the same load
        # (this machine may be shared), and their ratio is taken pair by pair.
        targets = [np.empty_like(a) for a in arrays]
        pairs = list(zip(targets, arrays, strict=True))
        for d, a in pairs:
            np.copyto(d, a)
        runs = []
        for i in range(args.repeats + 1):
            target = checkpoints / f"ckpt-{i + 1:06d}" / "ps-0.npz"
            memcpy_s = best_of(1, lambda: copy_all(pairs))
            with Pusher(ps, group, args.dim) as pusher:
                run = flash_save(ps, target)
            run["worst_push_s"] = pusher.worst
            run["memcpy_gbs"] = nbytes / memcpy_s / 1e9
            runs.append(run)
        pairs.clear()
        targets.clear()
        first, steady = runs[0], runs[1:]
        f_bytes = first["bytes"]
        pause = statistics.median(r["pause_s"] for r in steady)
        call = statistics.median(r["save_s"] for r in steady)
        persisted = statistics.median(r["persisted_s"] for r in steady)
        worst = max(r["worst_push_s"] for r in steady)
        copy_rate = f_bytes / pause / 1e9
        save_rate = f_bytes / call / 1e9
        paired = statistics.median(r["memcpy_gbs"] for r in steady)
        ratio = statistics.median(f_bytes / r["save_s"] / 1e9 / r["memcpy_gbs"] for r in steady)
        copy_ratio = statistics.median(
            f_bytes / r["pause_s"] / 1e9 / r["memcpy_gbs"] for r in steady
        )
        print(
            "after (flash: copy into the shared-memory slot under the lock, persist in background):"
        )
        print(
            f"  first checkpoint (allocates the slot): pause {first['pause_s'] * 1e3:.1f} ms, "
            f"Save call {first['save_s'] * 1e3:.1f} ms"
        )
        print(f"  training pause (apply lock held)  {pause * 1e3:8.1f} ms  ({copy_rate:.2f} GB/s)")
        print(f"  Save call (master waits)           {call * 1e3:8.1f} ms  ({save_rate:.2f} GB/s)")
        outside = statistics.median(r["save_s"] - r["pause_s"] for r in steady)
        print(f"  of which outside the copy          {outside * 1e3:8.1f} ms")
        rate = f_bytes / persisted / 1e9
        print(f"  durable (persist ends) after       {persisted * 1e3:8.1f} ms  ({rate:.2f} GB/s)")
        print(f"  memcpy measured just before each   {paired:8.2f} GB/s")
        print(f"  slowest push while saving+persisting {worst * 1e3:6.1f} ms\n")

        part = checkpoints / f"ckpt-{len(runs):06d}" / "ps-0.npz"
        content = part.read_bytes()
        sha = best_of(1, lambda: hashlib.sha256(content).digest())
        content = b""
        verify = best_of(args.repeats, lambda: read_digest(part))
        size = part.stat().st_size
        share = sha / persisted
        print(f"SHA-256 alone: {size / sha / 1e9:.2f} GB/s ({share:.0%} of the persist time)")
        print(f"checking a part's SHA-256 (restore): {size / verify / 1e9:.2f} GB/s")

        def from_disk() -> None:
            fresh_ps = ParameterServer(0, 1, ps_layout, Optimizer("adagrad", 0.05), seed=1)
            with np.load(part) as npz:
                fresh_ps.restore(dict(npz))

        assert ps.flash is not None
        meta = ps.flash.slot.read_meta()
        assert meta is not None

        def from_shm() -> None:
            fresh_ps = ParameterServer(0, 1, ps_layout, Optimizer("adagrad", 0.05), seed=1)
            views = FlashCheckpointer.for_job(checkpoints, 0).slot.arrays(meta)
            fresh_ps.restore(views)
            del views

        ps_layout = EmbeddingPlacement.from_features(
            FeatureConfig(
                num_dense=13,
                tables=(
                    TableConfig(name="t", column="C1", vocab_size=args.rows + 1000, dim=args.dim),
                ),
            )
        )
        print(f"restore from disk (np.load, page cache): {best_of(1, from_disk):.2f} s")
        print(f"restore from shared memory:              {best_of(1, from_shm):.2f} s\n")

        print(
            f"flash checkpoint save speed {save_rate:.2f} GB/s (the copy itself {copy_rate:.2f} "
            f"GB/s) vs memcpy {paired:.2f} GB/s in the same run: ratio {ratio:.2f} (the copy "
            f"{copy_ratio:.2f}; median of {len(steady)} paired runs); goal >= {GOAL_RATIO:.2f}: "
            f"{'MET' if ratio >= GOAL_RATIO else 'NOT MET'}"
        )
        print(
            f"training pause: {l_pause * 1e3:.1f} ms before -> {pause * 1e3:.1f} ms after; "
            f"Save call the master waits for: {l_call * 1e3:.0f} ms -> {call * 1e3:.1f} ms"
        )
        return 0 if ratio >= GOAL_RATIO else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(flash_dir_for(checkpoints), ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
