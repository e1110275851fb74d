"""The measured world: what the real runtime did on this machine at every plan it can run
(``measured.json``, written by ``bench/measure_world.py``), one world per workload measured.

A plan's iteration time and busy cores are the table's; a plan not in the table is not in this
world (``plans()`` lists the measured ones, anything else is refused). Noise, pod start and
initialisation are the medians of what the runs measured; the budget is the largest measured
plan's cores; the job is sized so that the best measured plan trains it in ``ORACLE_JCT_S``.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._simcore import Config
from bench._world import World

TABLE = Path(__file__).with_name("measured.json")
ORACLE_JCT_S = 40 * 60.0  # the best plan's job completion time, first launch included


@dataclass(frozen=True)
class PlanFigures:
    """One measured plan: seconds per worker iteration and busy cores (one worker, each PS)."""

    iteration_s: float
    worker_cpu_used: float
    ps_cpu_used: tuple[float, ...]


@dataclass  # not frozen: the World protocol's attributes are plain (settable) ones
class MeasuredWorld:
    name: str
    label: str
    total_steps: float
    batch_size: int
    embedding_dim: int
    noise: float
    pod_start_s: float
    init_s: float
    budget: float
    table: Mapping[Config, PlanFigures] = field(compare=False)
    resizable: bool = False  # the local launcher: node sizes are fixed while a job runs
    host_cores: float | None = None  # the measuring machine's cores, which every node shared

    def plans(self) -> Sequence[Config]:
        return tuple(self.table)

    def runs(self, cfg: Config) -> bool:
        return cfg in self.table

    def iteration_s(self, cfg: Config) -> float:
        return self._row(cfg).iteration_s

    def cpu_used(self, cfg: Config) -> tuple[float, tuple[float, ...]]:
        row = self._row(cfg)
        return row.worker_cpu_used, row.ps_cpu_used

    def _row(self, cfg: Config) -> PlanFigures:
        try:
            return self.table[cfg]
        except KeyError:
            runs = ", ".join(c.describe() for c in self.table)
            raise ValueError(
                f"cfg: {cfg.describe()} was not measured in {self.name}; it runs only: {runs}"
            ) from None


def worlds() -> list[World]:
    """One world per workload of the committed table."""
    return list(load(TABLE))


def load(path: Path) -> list[MeasuredWorld]:
    """The worlds of a table ``bench/measure_world.py`` wrote; a missing or bad figure is a
    ``ValueError`` naming the file, the workload, the plan and the field."""
    record = json.loads(path.read_text())
    where = str(path)
    machine = _get(record, "machine", where)
    measured_on = (
        f"measured {str(_get(record, 'measured_at', where))[:10]} on "
        f"{_get(machine, 'cpu_count', where)} cores ({_get(machine, 'cpu_model', where)}), "
        f"TF {_get(_get(record, 'software', where), 'tensorflow', where)}"
    )
    workloads = _get(record, "workloads", where)
    return [
        _world(w, machine, f"{where}: workload {i}", measured_on) for i, w in enumerate(workloads)
    ]


def _world(
    workload: dict[str, Any], machine: dict[str, Any], where: str, measured_on: str
) -> MeasuredWorld:
    rows = _get(workload, "plans", where)
    if not rows:
        raise ValueError(f"{where}: plans is empty; expected the measured plans")
    table: dict[Config, PlanFigures] = {}
    for i, row in enumerate(rows):
        at = f"{where}, plan {i}"
        cfg = Config(
            int(_positive(row, "workers", at)),
            _positive(row, "worker_cpu", at),
            tuple(_positives(row, "ps_cpu", at)),
        )
        ps_used = tuple(_positives(row, "ps_cpu_used", at))
        if len(ps_used) != cfg.num_ps:
            raise ValueError(f"{at}: ps_cpu_used has {len(ps_used)} entries for {cfg.num_ps} PS")
        table[cfg] = PlanFigures(
            _positive(row, "iteration_s", at), _positive(row, "worker_cpu_used", at), ps_used
        )
    best = max(c.workers / f.iteration_s for c, f in table.items())  # global steps/s
    pod_start = statistics.median(_positive(r, "launch_to_workers_s", where) for r in rows)
    init = statistics.median(s for r in rows for s in _positives(r, "worker_init_s", where))
    return MeasuredWorld(
        name=f"measured/{_get(workload, 'name', where)}",
        label=f"{_get(workload, 'label', where)}; {measured_on}",
        total_steps=round(best * (ORACLE_JCT_S - pod_start - init)),
        batch_size=int(_positive(workload, "batch_size", where)),
        embedding_dim=int(_positive(workload, "embedding_dim", where)),
        noise=statistics.median(_positive(r, "step_time_rel_sd", where) for r in rows),
        pod_start_s=pod_start,
        init_s=init,
        budget=max(c.cores for c in table),
        table=table,
        host_cores=float(_positive(machine, "cpu_count", where)),
    )


def _get(record: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in record:
        raise ValueError(f"{where}: {key} is missing")
    return record[key]


def _positive(record: Mapping[str, Any], key: str, where: str) -> float:
    value = _get(record, key, where)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{where}: {key} must be a positive number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{where}: {key} must be finite, got {value!r}")
    return float(value)


def _positives(record: Mapping[str, Any], key: str, where: str) -> list[float]:
    values = _get(record, key, where)
    if not isinstance(values, list) or not values:
        raise ValueError(f"{where}: {key} must be a non-empty list of positive numbers")
    return [_positive({key: v}, key, where) for v in values]
