"""When a job counts as "far enough" for a waiting task: a state, a sample count or an AUC.

Shared by the sensor's poke, its trigger and the training trigger, so all agree on the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from airflow_rover.core.states import TERMINAL_STATES, JobState


class Milestone(BaseModel):
    """Reached when the job is in one of ``states``, or has trained ``min_samples``, or has
    a held-out AUC of at least ``min_auc`` (any one is enough)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    states: tuple[JobState, ...] = (JobState.SUCCEEDED,)
    min_samples: int | None = Field(default=None, gt=0)
    min_auc: float | None = Field(default=None, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _something_to_wait_for(self) -> Milestone:
        if not self.states and self.min_samples is None and self.min_auc is None:
            raise ValueError("give at least one of states, min_samples, min_auc")
        return self

    def reached(self, status: Mapping[str, Any]) -> bool:
        if status.get("state") in self.states:
            return True
        samples = (status.get("progress") or {}).get("samples_done", 0)
        if self.min_samples is not None and samples >= self.min_samples:
            return True
        auc = (status.get("evaluation") or {}).get("auc")
        return self.min_auc is not None and auc is not None and auc >= self.min_auc

    def missed(self, status: Mapping[str, Any]) -> str | None:
        """Why the milestone can no longer be reached (the job ended without it), else None."""
        state = status.get("state")
        if state in TERMINAL_STATES and not self.reached(status):
            job = status.get("job_id")
            return f"job {job} ended {state} before the milestone {self.describe()}"
        return None

    def describe(self) -> str:
        parts = [f"state in {[str(s) for s in self.states]}"] if self.states else []
        if self.min_samples is not None:
            parts.append(f"samples >= {self.min_samples}")
        if self.min_auc is not None:
            parts.append(f"auc >= {self.min_auc}")
        return " or ".join(parts)
