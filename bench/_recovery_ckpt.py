"""Checkpoints of the emulated job (``bench/recovery.py``): real files, real restore paths.

A full save writes every PS's ``ParameterServer.snapshot()`` with
``core.checkpoint_files.write_npz`` (checksummed, fsynced, renamed) plus the dense model; a
load checks the file's checksum and reads it (``read_npz``), then ``restore``-s it into a
fresh ``ParameterServer``, as a replacement PS does. MFU/SSU saves are the PS's own
``partial_save`` (the ``r*N`` rows its access counters select or SSU draws from them), kept per PS
in a ``core.cpr_chain.PartialChain`` that folds them off the timed pauses, as the runtime's
flash checkpoints bound its chain (at most ``1/r`` files); a restore reads the folded base and
the saves since.

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

from airflow_rover.core.checkpoint_files import read_npz, write_npz
from airflow_rover.core.cpr_chain import PartialChain
from airflow_rover.ps.server import ParameterServer, partial_saves_synced
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
    chains: dict[int, PartialChain] = field(default_factory=dict)
    saves: int = 0
    partial_saves: int = 0
    partial_rows: int = 0
    full_bytes: int = 0  # the last full save's PS files
    partial_bytes: int = 0
    restore_bytes: list[int] = field(default_factory=list)  # per partial restore: files read
    table_bytes_at_restore: list[int] = field(default_factory=list)  # the lost PS's full table

    def __post_init__(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)

    # -- full saves

    def save_full(self, cluster: Cluster, step: int) -> SaveTimes:
        target = self.root / f"full-{self.saves:04d}-step{step}"
        per_ps = []
        for p, ps in enumerate(cluster.ps):
            start = time.perf_counter()
            self.full_bytes = write_npz(target / f"ps-{p}.npz", ps.snapshot().items()).bytes + (
                self.full_bytes if p else 0
            )
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

    def save_partial(self, cluster: Cluster, r: float, variant: str) -> SaveTimes:
        """Each PS writes ``ceil(r*N)`` rows per table (N: the rows it holds) with the product's
        ``ParameterServer.partial_save``: MFU the most accessed since their last save (their
        counters cleared), SSU rows drawn from the same counters (``core.cpr.SsuSampler``;
        every counter cleared). The PS's ``PartialChain`` takes the file and folds the chain,
        untimed, once it holds more than the PS's full table."""
        index = self.partial_saves
        per_ps = []
        for p, ps in enumerate(cluster.ps):
            start = time.perf_counter()
            path = self.root / f"partial-{index:05d}" / f"ps-{p}.npz"
            self.partial_rows += ps.partial_save(path, variant, r)
            per_ps.append(time.perf_counter() - start)
            # Each PS's fsyncs run on its own host after its reply; here, on one disk, they
            # would stall the next PS's timed write: wait for them, untimed.
            partial_saves_synced()
            self.partial_bytes += path.stat().st_size
        files = math.ceil(1 / r)  # as the runtime: a flash checkpoint and 1/r - 1 saves
        for p, ps in enumerate(cluster.ps):  # after the pauses: a fold is not the save's cost
            path = self.root / f"partial-{index:05d}" / f"ps-{p}.npz"
            self.chain(p, files).add(path, table_bytes(ps))
        self.partial_saves += 1
        return SaveTimes(per_ps)

    def chain(self, p: int, max_files: int | None = None) -> PartialChain:
        """PS ``p``'s chain (``max_files`` when it is made: the files a restore opens). It
        folds inside ``add``, outside the timed pauses: in this one process a fold thread
        would take the cores the next PS's save is timed on (the folds stand in for what
        bounds the runtime's chain, its flash checkpoints, which persist on the PS's own
        host)."""
        if p not in self.chains:
            self.chains[p] = PartialChain(
                self.root / f"chain-ps-{p}", background=False, max_files=max_files
            )
        return self.chains[p]

    def load_chain(self, cluster: Cluster, p: int) -> float:
        """Replace PS ``p`` by a fresh one holding, for each row ever saved, its newest saved
        copy (the folded base and the saves since); every other row restarts from its seeded
        initial value."""
        start = time.perf_counter()
        ps = cluster.new_ps(p)
        chain = self.chain(p)
        saved = chain.read()
        self.restore_bytes.append(chain.read_bytes)
        self.table_bytes_at_restore.append(table_bytes(cluster.ps[p]))
        for name, table in ps.tables.items():
            prefix = f"table/{name}/"
            fields = {k[len(prefix) :]: v for k, v in saved.items() if k.startswith(prefix)}
            if fields and fields["ids"].size:
                fields["counts"] = np.zeros(fields["ids"].size, np.uint32)  # saved: 0 since
                table.restore(fields)
        cluster.ps[p] = ps
        return time.perf_counter() - start

    def close(self) -> None:
        """Wait for the folds in flight (their time is reported, not charged)."""
        for chain in self.chains.values():
            chain.wait()

    @property
    def fold_s(self) -> float:
        return sum(c.fold_s for c in self.chains.values())

    @property
    def folds(self) -> int:
        return sum(c.folds for c in self.chains.values())


def table_bytes(ps: ParameterServer) -> int:
    """What a full save of ``ps``'s rows takes: every row with its id, state and counters."""
    total = 0
    for table in ps.tables.values():
        per_row = table.rows.itemsize * table.dim * (1 + len(table.state))
        total += table.size * (per_row + table.live_ids.itemsize + 4 + 4)  # counts, seen
    return total
