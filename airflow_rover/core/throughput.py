"""The resource-performance model of a PS training job (DLRover-RM section 4.1), fitted online.

With ``w`` workers of ``lw`` cores, ``p`` PS of ``lp`` cores, batch ``m``, dense model size ``M``,
bandwidth ``B`` and embedding width ``D``, one iteration of one worker takes

    T = a_grad * m/lw + a_upd * w/(p*lp) + a_sync * (M/p)/(B/w) + a_emb * m*D/p + b

(with ``1/p`` generalised to the busiest PS's share ``h + (1-h)/p`` when a hot share ``h`` of
the PS load cannot be spread: ``JobShape.hot_share``, estimated from per-PS CPU)

(``b``: the sum of the paper's four constant terms, which the data cannot tell apart), and the
job trains ``w * m / T`` samples per second. ``m`` and ``D`` enter in units of the paper's
batch (512) and of a reference width (16), so that its coefficients keep their proportions
for any job: they are the cold start's prior. All coefficients are >= 0. ``fit`` finds them from
observed iteration times with non-negative least squares on relative errors (each row divided
by its observed time), a linear stand-in for the paper's RMSLE that NNLS can solve exactly.

Where the nodes share one host (the local launcher), an iteration takes at least what the
host's cores allow (``core.host_bound``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from airflow_rover.core.host_bound import HostBound
from airflow_rover.core.spec import JobSpec, ResourcePlan

TERMS = ("grad", "upd", "sync", "emb")
HOT_SHARE_FLOOR = 0.05
REFERENCE_BATCH = 512  # DLRover-RM's evaluation batch: m = 1 in the paper's units
REFERENCE_DIM = 16  # D = 1 in the paper's units
BUSY_FLOOR = 0.05  # a busy share's error counts relative to it, or to this if it is smaller


@dataclass(frozen=True)
class JobShape:
    """What the model needs to know about a job besides its plan."""

    batch_size: int  # samples
    model_size: float  # dense parameters over ``bandwidth``: the sync term's unit
    bandwidth: float
    embedding_dim: int
    hot_share: float = 0.0  # load that stays on one PS however many there are (hot rows)
    hot_ps: int = 0  # the index of the PS that holds it

    @classmethod
    def of(cls, spec: JobSpec) -> JobShape:
        """A job's shape as its master models it."""
        return cls.sized(spec.training.batch_size, spec.embedding_dim)

    @classmethod
    def sized(cls, batch_size: int, embedding_dim: int) -> JobShape:
        """The shape of a job of this batch and embedding width: step times are fitted
        directly, so the dense size and bandwidth only set the unit of the sync term (the
        paper's proportions)."""
        return cls(batch_size, model_size=0.25, bandwidth=1.0, embedding_dim=embedding_dim)

    def ps_share(self, num_ps: int) -> float:
        """Share of the PS load on the busiest PS: ``h + (1 - h) / p``. Hot rows (a Zipf head,
        one huge tensor) are indivisible, so adding PS spreads only the rest; with ``h = 0``
        this is the paper's even ``1 / p``."""
        return self.hot_share + (1.0 - self.hot_share) / num_ps

    @staticmethod
    def hot_share_from(ps_load: Sequence[float], noise_floor: float = HOT_SHARE_FLOOR) -> float:
        """Estimate ``h`` from the load (e.g. CPU used) of each of ``p >= 2`` PS. Below
        ``noise_floor`` it is 0: measurement noise on evenly loaded PS reads as a few percent,
        and a phantom hot share would steer the plan towards needlessly big PS."""
        p, total = len(ps_load), float(sum(ps_load))
        if p < 2 or total <= 0:
            return 0.0
        share = min(1.0, max(0.0, (max(ps_load) / total * p - 1.0) / (p - 1.0)))
        return share if share >= noise_floor else 0.0


@dataclass(frozen=True)
class Coefficients:
    grad: float
    upd: float
    sync: float
    emb: float
    bias: float

    @classmethod
    def paper(cls) -> Coefficients:
        """The values DLRover-RM reports for its cluster (a_* and the sum of b_*)."""
        return cls(grad=3.48, upd=2.36, sync=0.68, emb=2.45, bias=2.45)

    def as_array(self) -> np.ndarray:
        return np.array([self.grad, self.upd, self.sync, self.emb, self.bias])

    def scaled_to(self, shape: JobShape, plan: ResourcePlan, seconds: float) -> Coefficients:
        """These coefficients in proportion, scaled so that ``plan`` takes ``seconds`` per
        iteration: a cold start's prior from its first observation."""
        predicted = float(features(plan, shape) @ self.as_array())
        factor = seconds / predicted if predicted > 0 else 1.0
        return Coefficients(*(float(v) * factor for v in self.as_array()))


def features(plan: ResourcePlan, shape: JobShape) -> np.ndarray:
    """The four load terms of an iteration under ``plan`` (without coefficients), plus 1. The
    PS terms follow the busiest PS (``JobShape.ps_share``): the iteration waits for it; the
    update term for the PS with the most load per core, where PS are sized apart."""
    w, p, share = plan.num_workers, plan.num_ps, shape.ps_share(plan.num_ps)
    m, d = shape.batch_size / REFERENCE_BATCH, shape.embedding_dim / REFERENCE_DIM
    per_core = share / plan.ps_cpu
    if plan.sizes:
        cold, hot = (1.0 - shape.hot_share) / p, shape.hot_ps if shape.hot_ps < p else 0
        per_core = max((share if j == hot else cold) / plan.size_of(f"ps-{j}")[0] for j in range(p))
    return np.array(
        [
            m / plan.worker_cpu,
            w * per_core,
            (shape.model_size * share) / (shape.bandwidth / w),
            m * d * share,
            1.0,
        ]
    )


@dataclass(frozen=True)
class ThroughputModel:
    coefficients: Coefficients
    shape: JobShape
    host: HostBound | None = None  # where the nodes share one host: what its cores allow

    def iteration_time(self, plan: ResourcePlan) -> float:
        seconds = float(features(plan, self.shape) @ self.coefficients.as_array())
        if self.host is not None:
            seconds = max(seconds, plan.num_workers / self.host.max_steps_per_s(plan))
        return seconds

    def throughput(self, plan: ResourcePlan) -> float:
        """Samples per second of the whole job under ``plan``."""
        return plan.num_workers * self.shape.batch_size / self.iteration_time(plan)

    @classmethod
    def fit(
        cls,
        shape: JobShape,
        observations: Sequence[tuple[ResourcePlan, float]],
        prior: Coefficients | None = None,
        prior_weight: float = 0.0,
        busy: Sequence[BusyShare] = (),
    ) -> ThroughputModel:
        """Fit the coefficients to ``(plan, observed iteration time)`` pairs.

        Few plans cannot pin five coefficients down (a job that never changed its plan has one
        distinct row); ``prior`` with ``prior_weight`` > 0 adds ridge rows that pull each
        coefficient towards the prior's, so the model stays sensible until the data decide.
        ``busy`` adds what the profile shows under a plan: a worker computes (the gradient
        term) for the share of an iteration its cores are busy, and the busiest PS per core
        updates (the update term) for its share: two terms told apart by one plan.
        """
        if not observations:
            raise ValueError("observations: at least one (plan, iteration time) is needed")
        rows, targets = [], []
        for plan, seconds in observations:
            if not seconds > 0:
                raise ValueError(f"observations: iteration time must be > 0, got {seconds}")
            rows.append(features(plan, shape) / seconds)
            targets.append(1.0)
        for share in busy:  # relative errors too, those of a near-idle node from a floor up
            terms = features(share.plan, shape) / share.seconds
            for term, busy_share in ((0, share.worker), (1, share.ps)):
                weight = 1.0 / max(min(busy_share, 1.0), BUSY_FLOOR)
                row = np.zeros(len(TERMS) + 1)
                row[term] = terms[term] * weight
                rows.append(row)
                targets.append(min(busy_share, 1.0) * weight)
        a, y = np.array(rows), np.array(targets)
        if prior is not None and prior_weight > 0:
            ridge = np.sqrt(prior_weight) * np.eye(len(TERMS) + 1)
            target = ridge @ np.ones(len(TERMS) + 1)
            scale = prior.as_array()
            a = np.vstack([a, ridge / np.where(scale > 0, scale, 1.0)])
            y = np.concatenate([y, np.where(scale > 0, target, 0.0)])
        solution, _ = nnls(a, y)
        return cls(Coefficients(*map(float, solution)), shape)


@dataclass(frozen=True)
class BusyShare:
    """The share of an iteration a plan's workers computed and its busiest PS (per core)
    worked, from the nodes' busy cores."""

    plan: ResourcePlan
    seconds: float  # the iteration time it was seen at
    worker: float
    ps: float
