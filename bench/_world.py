"""What the simulator needs of a world: the job's true speed for a plan, its noise, and what a
change costs. Worlds are plug-ins (``bench/simulator.py --world module:function``): the function
returns one world per workload.

Every world counts work in global steps: one iteration of one worker is one step of
``batch_size`` samples, so the job trains ``workers / iteration_s`` steps per second.
"""

from __future__ import annotations

import functools
import importlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from airflow_rover.core.optimizer import PlanBounds
from bench._simcore import Config, steps_per_s


class World(Protocol):
    name: str  # short id, e.g. "dlrover_rm/wide_deep"
    label: str  # one line for the table header
    total_steps: float  # global steps (batches) the job trains
    batch_size: int  # samples per step of one worker
    embedding_dim: int
    noise: float  # relative sd of one reported iteration time
    pod_start_s: float  # a new node's pod (process) starts in this many seconds
    init_s: float  # then its training process initialises in this many seconds
    budget: float  # cores the job may use
    resizable: bool  # whether a running job's nodes change size (Kubernetes) or not (local)
    host_cores: float | None  # the cores all nodes share on one host (local); None: their own

    def plans(self) -> Sequence[Config]:
        """Every plan this world can run: the oracle's space and the bounds of every policy."""
        ...

    def runs(self, cfg: Config) -> bool:
        """Whether ``cfg`` is one of ``plans()``."""
        ...

    def iteration_s(self, cfg: Config) -> float:
        """True mean seconds of one worker iteration under ``cfg``."""
        ...

    def cpu_used(self, cfg: Config) -> tuple[float, tuple[float, ...]]:
        """True busy cores of one worker, and of each PS, under ``cfg``."""
        ...


def load(spec: str) -> list[World]:
    """The worlds of ``module:function`` (the function is called without arguments)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--world {spec!r}: give it as module:function")
    factory: Callable[[], Sequence[World]] = getattr(importlib.import_module(module_name), attr)
    worlds = list(factory())
    if not worlds:
        raise ValueError(f"--world {spec!r}: the function returned no world")
    return worlds


def oracle(world: World) -> Config:
    """The plan of the world with the most steps/s within its budget, started at time 0."""
    fitting = [c for c in world.plans() if c.cores <= world.budget + 1e-9]
    if not fitting:
        raise ValueError(f"{world.name}: no plan fits the budget of {world.budget:g} cores")
    return max(fitting, key=lambda c: steps_per_s(world, c))


@dataclass(frozen=True)
class Setting:
    """What every policy of a run shares: the job's CPU budget and the plans it may have."""

    budget: float
    bounds: PlanBounds

    @classmethod
    def of(cls, world: World) -> Setting:
        plans = world.plans()
        return cls(
            world.budget,
            PlanBounds(
                max_workers=max(c.workers for c in plans),
                max_ps=max(c.num_ps for c in plans),
                worker_cpus=tuple(sorted({c.worker_cpu for c in plans})),
                ps_cpus=tuple(sorted({size for c in plans for size in c.ps_cpu})),
            ),
        )

    @property
    def max_cpu(self) -> float:
        return max(*self.bounds.worker_cpus, *self.bounds.ps_cpus)


@functools.cache
def grid_plans(hot: bool, max_workers: int, max_ps: int, sizes: tuple[float, ...]) -> list[Config]:
    """Every plan of one worker size and one PS size; with a hot PS (the busiest, PS 0) also
    those where that PS alone is bigger."""
    found = []
    for w, p, wc, pc in itertools.product(
        range(1, max_workers + 1), range(1, max_ps + 1), sizes, sizes
    ):
        found.append(Config(w, wc, (pc,) * p))
        if hot and p >= 2:
            found += [Config(w, wc, (big, *(pc,) * (p - 1))) for big in sizes if big > pc]
    return found
