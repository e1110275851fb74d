"""``autoscale.prior``: what a job's autoscaler starts from, as the spec carries it.

Warm start fills it from similar past jobs (``HistoryStore.warm_start``); a job without it
starts cold: the paper's proportions scaled to its first observation and the default scaling
costs. ``core.autoscale_prior`` turns it into the autoscaler's ``Prior``. How a job runs, not
what it learns: it is not in the training fingerprint (``data.fingerprint.MODEL_FIELDS``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

COEFFICIENTS = ("grad", "upd", "sync", "emb", "bias")
COSTS = ("worker_start_s", "ps_start_s", "ps_reload_s")

Coefficient = Annotated[
    float | None,
    Field(default=None, ge=0, allow_inf_nan=False, description="seconds per unit of its term"),
]
Seconds = Annotated[float | None, Field(default=None, ge=0, le=86_400, allow_inf_nan=False)]


class AutoscalePrior(BaseModel):
    """Set by warm start from similar past jobs: the throughput model's coefficients fitted on
    their iteration times (all five, or none: the paper's), the share of PS load their hot PS
    kept, and the scaling costs they measured (each absent: the default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    grad: Coefficient
    upd: Coefficient
    sync: Coefficient
    emb: Coefficient
    bias: Coefficient
    hot_share: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    worker_start_s: Seconds
    ps_start_s: Seconds
    ps_reload_s: Seconds
    jobs: tuple[Annotated[str, Field(min_length=1, max_length=200)], ...] = Field(
        default=(), max_length=100, description="the past jobs it came from"
    )

    @model_validator(mode="after")
    def _all_coefficients_or_none(self) -> AutoscalePrior:
        given = [name for name in COEFFICIENTS if getattr(self, name) is not None]
        if given and len(given) < len(COEFFICIENTS):
            missing = [name for name in COEFFICIENTS if name not in given]
            raise ValueError(
                f"autoscale.prior: coefficients {given} without {missing}: give all of "
                f"{list(COEFFICIENTS)} or none (the paper's)"
            )
        return self
