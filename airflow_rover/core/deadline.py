"""A job's deadline: the absolute time by which it must have ended.

It is set once, when the job is submitted (``max_runtime`` from then), and kept in the spec, so
the master, a relaunched master and a retry of the task all see the same one: the master stops
the job there, and a retry does not reattach to a job past it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field


class JobDeadline(BaseModel):
    """The job ends by ``at``: ``max_runtime_s`` after it was submitted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: AwareDatetime
    max_runtime_s: float = Field(gt=0, description="the task's max_runtime, in seconds")

    @classmethod
    def after(cls, max_runtime: timedelta, now: datetime | None = None) -> JobDeadline:
        """The deadline of a job submitted ``now`` that may run for ``max_runtime``."""
        start = now or datetime.now(UTC)
        return cls(at=start + max_runtime, max_runtime_s=max_runtime.total_seconds())

    def remaining(self, now: datetime | None = None) -> timedelta:
        """Time left until the deadline; negative once it has passed."""
        return self.at - (now or datetime.now(UTC))

    def passed(self, now: datetime | None = None) -> bool:
        return self.remaining(now) <= timedelta(0)

    def describe(self) -> str:
        """The deadline and where it comes from, for the messages that name it."""
        at = self.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"deadline {at} (max_runtime={timedelta(seconds=self.max_runtime_s)})"

    def stop_reason(self) -> str:
        """Why the job was stopped: what its state's message says."""
        return f"the job ran past its {self.describe()} and was stopped"
