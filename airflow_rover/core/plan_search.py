"""NSGA-II over a plan space too large to enumerate (pymoo), kept apart from ``optimizer``
so that a master imports pymoo only when a search needs it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2
from pymoo.core.problem import ElementwiseProblem
from pymoo.operators.crossover.sbx import SBX
from pymoo.operators.mutation.pm import PM
from pymoo.operators.repair.rounding import RoundingRepair
from pymoo.operators.sampling.rnd import IntegerRandomSampling
from pymoo.optimize import minimize

CostAndGain = Callable[[np.ndarray], tuple[float, float]]
"""A genome's (resource cost, throughput gain)."""


class _PlanProblem(ElementwiseProblem):
    """Minimise (cost, -gain) over integer genomes between ``lower`` and ``upper``."""

    def __init__(self, objectives: CostAndGain, lower: np.ndarray, upper: np.ndarray) -> None:
        super().__init__(n_var=len(lower), n_obj=2, xl=lower, xu=upper, vtype=int)
        self.objectives = objectives

    def _evaluate(self, x: np.ndarray, out: dict, *args: object, **kwargs: object) -> None:
        cost, gain = self.objectives(x)
        out["F"] = [cost, -gain]


def nsga2_genomes(
    objectives: CostAndGain,
    lower: np.ndarray,
    upper: np.ndarray,
    seed: int,
    generations: int,
    population: int,
) -> np.ndarray:
    """The genomes of NSGA-II's last front (clipped to the bounds), one per row."""
    algorithm = NSGA2(
        pop_size=population,
        sampling=IntegerRandomSampling(),
        crossover=SBX(prob=0.9, eta=15, vtype=float, repair=RoundingRepair()),
        mutation=PM(eta=20, vtype=float, repair=RoundingRepair()),
        eliminate_duplicates=True,
    )
    problem = _PlanProblem(objectives, lower, upper)
    result = minimize(problem, algorithm, ("n_gen", generations), seed=seed, verbose=False)
    return np.clip(np.atleast_2d(result.X), lower, upper)
