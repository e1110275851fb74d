"""Checkpoints of the emulated job (``bench/recovery.py``): real files, real restore paths.

A full save writes every PS's ``ParameterServer.snapshot()`` with
``core.checkpoint_files.write_npz`` (checksummed, fsynced, renamed) plus the dense model; a
load checks the file's checksum and reads it (``read_npz``), then ``restore``-s it into a
fresh ``ParameterServer``, as a replacement PS does. MFU/SSU saves write the ``r*N`` selected
rows of each PS (``core.cpr``: ``top_rows`` over the PS's own access counters, or an
``SsuTracker``'s list) and a restore replays that PS's chain with ``latest_rows``.

Every PS's save and load is timed on its own: in a cluster the PS save and load in parallel,
so a save (or a full restore) pauses training for the slowest PS's time, a partial restore for
the failed PS's time. Here they run one after the other in one process.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from airflow_rover.core.checkpoint_files import read_npz, read_npz_parts, write_npz
from airflow_rover.core.cpr import SsuTracker, latest_rows, top_rows
from bench._recovery_cluster import Cluster


@dataclass
class SaveTimes:
    """Seconds each PS took for one save (index = PS)."""

    per_ps: list[float]

    @property
    def pause(self) -> float:
        return max(self.per_ps)


@dataclass
class CheckpointStore:
    """The checkpoints of one run under ``root``: the last full save, and per PS the chain
    of MFU/SSU partial saves since the start (a row never saved is still its seeded initial
    value, so the chain needs no base save)."""

    root: Path
    last_full: Path | None = None
    last_full_step: int = 0
    chains: dict[int, list[Path]] = field(default_factory=dict)
    saves: int = 0
    partial_saves: int = 0

    def __post_init__(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)

    # -- full saves

    def save_full(self, cluster: Cluster, step: int) -> SaveTimes:
        target = self.root / f"full-{self.saves:04d}-step{step}"
        per_ps = []
        for p, ps in enumerate(cluster.ps):
            start = time.perf_counter()
            write_npz(target / f"ps-{p}.npz", ps.snapshot().items())
            if p == 0:  # the dense model is saved with PS 0
                write_npz(target / "dense.npz", cluster.net.state().items())
            per_ps.append(time.perf_counter() - start)
        if self.last_full is not None:
            shutil.rmtree(self.last_full, ignore_errors=True)
        self.last_full, self.last_full_step = target, step
        self.saves += 1
        return SaveTimes(per_ps)

    def load_ps(self, cluster: Cluster, p: int) -> float:
        """Replace PS ``p`` by a fresh one restored from the last full save (or left empty,
        i.e. at the seeded initial values, when there is none yet)."""
        start = time.perf_counter()
        ps = cluster.new_ps(p)
        if self.last_full is not None:
            ps.restore(read_npz(self.last_full / f"ps-{p}.npz"))
        cluster.ps[p] = ps
        return time.perf_counter() - start

    def load_all(self, cluster: Cluster) -> SaveTimes:
        """Full recovery: every PS and the dense model back to the last full save."""
        per_ps = []
        for p in range(cluster.num_ps):
            seconds = self.load_ps(cluster, p)
            if p == 0:
                start = time.perf_counter()
                if self.last_full is not None:
                    cluster.net.load(read_npz(self.last_full / "dense.npz"))
                else:
                    cluster.net.reset()
                seconds += time.perf_counter() - start
            per_ps.append(seconds)
        return SaveTimes(per_ps)

    # -- MFU / SSU partial saves

    def save_partial(
        self, cluster: Cluster, r: float, ssu: list[dict[str, SsuTracker]] | None
    ) -> SaveTimes:
        """Each PS writes ``ceil(r*N)`` rows per group (N: the ids it owns): MFU the most
        accessed since their last save (the PS's access counters, cleared for the rows
        saved), SSU the rows its tracker listed (the list starts over)."""
        index = self.partial_saves
        per_ps = []
        for p, ps in enumerate(cluster.ps):
            start = time.perf_counter()
            arrays: dict[str, np.ndarray] = {}
            share = cluster.vocab_share(p)
            for name, table in ps.tables.items():
                n = math.ceil(r * share[name])
                with table._lock:  # the PS's own arrays: no call returns them by slot
                    size = table.size
                    if ssu is None:
                        slots = top_rows(table.counts[:size], n)
                    else:
                        ids = cluster.local_ids[name][p][ssu[p][name].take()]
                        slots = table._slot[ids]
                        slots = np.sort(slots[slots >= 0])
                    prefix = f"table/{name}/"
                    arrays[f"{prefix}ids"] = table._ids[slots]
                    arrays[f"{prefix}rows"] = table.rows[slots]
                    for key, value in table.state.items():
                        arrays[f"{prefix}state/{key}"] = value[slots]
                    if ssu is None:
                        table.counts[slots] = 0
            path = self.root / f"partial-{index:05d}" / f"ps-{p}.npz"
            write_npz(path, arrays.items())
            self.chains.setdefault(p, []).append(path)
            per_ps.append(time.perf_counter() - start)
        self.partial_saves += 1
        return SaveTimes(per_ps)

    def load_chain(self, cluster: Cluster, p: int) -> float:
        """Replace PS ``p`` by a fresh one holding, for each row ever saved, its newest saved
        copy (``latest_rows``); every other row restarts from its seeded initial value."""
        start = time.perf_counter()
        ps = cluster.new_ps(p)
        saves = []
        for _, arrays in read_npz_parts(self.chains.get(p, [])):
            if isinstance(arrays, Exception):
                raise arrays
            saves.append(arrays)
        for name, table in ps.tables.items():
            prefix = f"table/{name}/"
            parts = [
                (
                    s[f"{prefix}ids"],
                    {k[len(prefix) :]: v for k, v in s.items() if k.startswith(prefix)},
                )
                for s in saves
            ]
            ids, fields = latest_rows(parts, ascending=False)
            if ids.size:
                fields.pop("ids", None)
                fields["counts"] = np.zeros(ids.size, np.uint32)
                table.restore({"ids": ids, **fields})
        cluster.ps[p] = ps
        return time.perf_counter() - start
