"""NSGA-II over a plan space too large to enumerate (pymoo), kept apart from ``optimizer``
so that a master imports pymoo only when a search needs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2
from pymoo.core.problem import ElementwiseProblem
from pymoo.operators.crossover.sbx import SBX
from pymoo.operators.mutation.pm import PM
from pymoo.operators.repair.rounding import RoundingRepair
from pymoo.operators.sampling.rnd import IntegerRandomSampling
from pymoo.optimize import minimize

from airflow_rover.core.spec import ResourcePlan

if TYPE_CHECKING:
    from airflow_rover.core.optimizer import PlanBounds

CostAndGain = Callable[[ResourcePlan], tuple[float, float]]


class _PlanProblem(ElementwiseProblem):
    """Minimise (cost, -gain) over integer genomes within ``bounds``."""

    def __init__(self, objectives: CostAndGain, current: ResourcePlan, bounds: PlanBounds) -> None:
        super().__init__(
            n_var=len(bounds.lower), n_obj=2, xl=bounds.lower, xu=bounds.upper, vtype=int
        )
        # (pymoo's Problem has a ``bounds()`` of its own)
        self.plan_of = lambda genome: bounds.plan(genome, like=current)
        self.objectives = objectives

    def _evaluate(self, x: np.ndarray, out: dict, *args: object, **kwargs: object) -> None:
        cost, gain = self.objectives(self.plan_of(x))
        out["F"] = [cost, -gain]


def nsga2_genomes(
    objectives: CostAndGain,
    current: ResourcePlan,
    bounds: PlanBounds,
    seed: int,
    generations: int,
    population: int,
) -> np.ndarray:
    """The genomes of NSGA-II's last front (clipped to ``bounds``), one per row."""
    algorithm = NSGA2(
        pop_size=population,
        sampling=IntegerRandomSampling(),
        crossover=SBX(prob=0.9, eta=15, vtype=float, repair=RoundingRepair()),
        mutation=PM(eta=20, vtype=float, repair=RoundingRepair()),
        eliminate_duplicates=True,
    )
    problem = _PlanProblem(objectives, current, bounds)
    result = minimize(problem, algorithm, ("n_gen", generations), seed=seed, verbose=False)
    return np.clip(np.atleast_2d(result.X), bounds.lower, bounds.upper)
