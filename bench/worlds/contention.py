"""A world of another family than the throughput model: contention the model does not write.

- Workers scale as Amdahl says: a share ``serial`` of a batch's compute runs on one core
  whatever the node's size.
- Every worker's traffic crosses one shared fabric: an iteration's exchange takes
  ``exchange_mb / min(node_bw, fabric_bw / w)``, so past ``fabric_bw / node_bw`` workers each
  added worker slows all the others.
- PS cores scale sublinearly (``c ** ps_scaling``: locks, memory bandwidth), and the PS work
  comes in tables placed whole, largest first on the least loaded PS (as TensorFlow's greedy
  placement does): a PS's cost grows with its hottest table, which no PS count splits.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from bench._simcore import Config
from bench._world import grid_plans

CPU_SIZES = (1.0, 2.0, 4.0, 8.0, 16.0)
MAX_WORKERS, MAX_PS = 24, 8


def zipf(n: int, exponent: float) -> tuple[float, ...]:
    weights = 1.0 / np.arange(1, n + 1) ** exponent
    return tuple(float(x) for x in weights / weights.sum())


@dataclass(frozen=True)
class ContentionWorld:
    name: str
    label: str
    compute_s: float  # one batch's compute on one core
    serial: float  # the share of it that runs on one core
    ps_core_s: float  # PS core-seconds per worker and iteration, all tables together
    tables: tuple[float, ...]  # each table's share of the PS work
    exchange_mb: float  # what one worker pushes and pulls per iteration
    total_steps: float
    node_bw: float = 1000.0  # MB/s of one node's link
    fabric_bw: float = 6000.0  # MB/s the workers' traffic shares
    ps_scaling: float = 0.85
    bias_s: float = 0.02
    noise: float = 0.08
    batch_size: int = 512
    embedding_dim: int = 16
    pod_start_s: float = 30.0
    init_s: float = 60.0
    budget: float = 96.0
    resizable: bool = True
    host_cores: float | None = None

    def ps_shares(self, p: int) -> np.ndarray:
        """Each PS's share of the PS work, busiest first."""
        return _placement(self.tables, p)

    def _ps_times(self, cfg: Config) -> np.ndarray:
        cores = np.array(cfg.ps_cpu) ** self.ps_scaling
        return self.ps_core_s * cfg.workers * self.ps_shares(cfg.num_ps) / cores

    def iteration_s(self, cfg: Config) -> float:
        compute = self.compute_s * (self.serial + (1 - self.serial) / cfg.worker_cpu)
        exchange = self.exchange_mb / min(self.node_bw, self.fabric_bw / cfg.workers)
        return float(compute + self._ps_times(cfg).max() + exchange + self.bias_s)

    def cpu_used(self, cfg: Config) -> tuple[float, tuple[float, ...]]:
        t = self.iteration_s(cfg)
        worker = self.compute_s / t
        ps = np.minimum(self._ps_times(cfg) * np.array(cfg.ps_cpu) / t, np.array(cfg.ps_cpu))
        return worker, tuple(float(x) for x in ps)

    def plans(self) -> list[Config]:
        hot = len(self.tables) > 0 and max(self.tables) > 1.5 / len(self.tables)
        return grid_plans(hot, MAX_WORKERS, MAX_PS, CPU_SIZES)

    def runs(self, cfg: Config) -> bool:
        return (
            1 <= cfg.workers <= MAX_WORKERS
            and 1 <= cfg.num_ps <= MAX_PS
            and cfg.worker_cpu in CPU_SIZES
            and all(c in CPU_SIZES for c in cfg.ps_cpu)
        )


@functools.cache
def _placement(tables: tuple[float, ...], p: int) -> np.ndarray:
    loads = np.zeros(p)
    for share in sorted(tables, reverse=True):
        loads[int(np.argmin(loads))] += share
    return np.sort(loads)[::-1]


def worlds() -> list[ContentionWorld]:
    return [
        ContentionWorld(
            "contention/ranker",
            "Contention model, ranking model: shared fabric, one table of a third of the PS work",
            compute_s=0.3,
            serial=0.15,
            ps_core_s=0.12,
            tables=zipf(12, 1.1),
            exchange_mb=60.0,
            total_steps=400_000.0,
        ),
        ContentionWorld(
            "contention/tower",
            "Contention model, deep tower: compute-bound, Amdahl workers, tables evenly sized",
            compute_s=2.4,
            serial=0.3,
            ps_core_s=0.02,
            tables=(1 / 16,) * 16,
            exchange_mb=20.0,
            total_steps=60_000.0,
        ),
    ]
