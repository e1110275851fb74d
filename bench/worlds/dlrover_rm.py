"""DLRover-RM's own model as the truth (section 4.1, the paper's coefficients, per-workload
multipliers): the family the cold prior comes from, so the easiest world to be right in.

One iteration of one worker takes, in units of ``TIME_UNIT_S``,

    T = a_grad*m/lw + max_j [ a_upd*w*s_j/c_j + a_emb*m*D*s_j + a_sync*(M*s_j)/(B/w) ] + b

(``m`` and ``D`` in units of the paper's batch of 512 and of a width of 16): a worker waits for
its slowest PS, and PS ``j`` holds the share ``s_j`` of the parameters on ``c_j`` cores. With
an even split and equal PS this is exactly ``airflow_rover.core.throughput.ThroughputModel``.
Hot PS: TensorFlow places parameters a whole tensor at a time, so one large tensor (share
``hot_share``) lands on PS 0, which then holds ``h + (1 - h)/p``: more cores on that PS shrink
its update time, more PS only the ``(1 - h)/p`` part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from airflow_rover.core.throughput import Coefficients
from bench._simcore import INIT_S, POD_START_S, Config
from bench._world import grid_plans

TIME_UNIT_S = 0.01  # the paper's coefficients give iterations of ~50-200 units
CPU_SIZES = (1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0)
MAX_WORKERS, MAX_PS = 32, 16
PAPER = Coefficients.paper()


@dataclass(frozen=True)
class DlroverRmWorld:
    name: str
    label: str
    truth: Coefficients  # in TIME_UNIT_S, on m = D = 1
    hot_share: float = 0.0  # share of the parameters in the one big tensor on PS 0
    total_steps: float = 200_000.0
    noise: float = 0.05
    batch_size: int = 512
    embedding_dim: int = 16
    pod_start_s: float = POD_START_S
    init_s: float = INIT_S
    budget: float = 200.0
    resizable: bool = True
    host_cores: float | None = None
    model_size: float = 0.25
    bandwidth: float = 1.0
    max_workers: int = MAX_WORKERS
    max_ps: int = MAX_PS
    cpu_sizes: tuple[float, ...] = CPU_SIZES

    def shares(self, p: int) -> np.ndarray:
        s = np.full(p, (1.0 - self.hot_share) / p)
        s[0] += self.hot_share
        return s

    def _ps_units(self, cfg: Config) -> np.ndarray:
        c, s, w = self.truth, self.shares(cfg.num_ps), cfg.workers
        return (
            c.upd * w * s / np.array(cfg.ps_cpu)
            + c.emb * s
            + c.sync * self.model_size * s * w / self.bandwidth
        )

    def _units(self, cfg: Config) -> float:
        c = self.truth
        return float(c.grad / cfg.worker_cpu + self._ps_units(cfg).max() + c.bias)

    def iteration_s(self, cfg: Config) -> float:
        return self._units(cfg) * TIME_UNIT_S

    def cpu_used(self, cfg: Config) -> tuple[float, tuple[float, ...]]:
        t, c = self._units(cfg), self.truth
        worker = c.grad / cfg.worker_cpu / t * cfg.worker_cpu
        busy = c.upd * cfg.workers * self.shares(cfg.num_ps) / np.array(cfg.ps_cpu) / t
        ps = np.minimum(busy, 1.0) * np.array(cfg.ps_cpu)
        return worker, tuple(float(x) for x in ps)

    def plans(self) -> list[Config]:
        return grid_plans(self.hot_share > 0, self.max_workers, self.max_ps, self.cpu_sizes)

    def runs(self, cfg: Config) -> bool:
        return (
            1 <= cfg.workers <= self.max_workers
            and 1 <= cfg.num_ps <= self.max_ps
            and 0 < cfg.worker_cpu <= max(self.cpu_sizes)
            and all(0 < c <= max(self.cpu_sizes) for c in cfg.ps_cpu)
        )


def scaled(**factors: float) -> Coefficients:
    """The paper's coefficients with some terms multiplied (a workload's character)."""
    values = {k: getattr(PAPER, k) * factors.get(k, 1.0) for k in ("grad", "upd", "sync", "emb")}
    return Coefficients(bias=PAPER.bias * factors.get("bias", 1.0), **values)


def worlds() -> list[DlroverRmWorld]:
    return [
        DlroverRmWorld(
            "dlrover_rm/wide_deep",
            "DLRover-RM model, Wide&Deep-like: I/O-bound, hot PS (one tensor = 30% of the "
            "parameters)",
            truth=scaled(upd=24.0),
            hot_share=0.3,
        ),
        DlroverRmWorld(
            "dlrover_rm/xdeepfm",
            "DLRover-RM model, xDeepFM-like: compute-bound, parameters evenly spread",
            truth=scaled(grad=12.0),
        ),
    ]
