"""A resource plan's life: one typed record from the proposal to its end.

The master's autoscaler (or a person, ``POST /plans``) proposes a plan; the trigger applies it
(within a cluster budget, when the job shares one); the master applies it, declines it, or
replaces it with a newer proposal; the history store keeps every one. All of them hold a
``PlanRecord``; the status JSON carries ``PlanRecord.to_json()``, and whatever reads a status
turns its entries back into records once, with ``plan_records``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from airflow_rover.core.spec import ResourcePlan


class PlanState(StrEnum):
    INITIAL = "initial"  # the plan the job was launched with (history only)
    PROPOSED = "proposed"  # waits for the trigger (and the cluster budget) to apply it
    APPLYING = "applying"  # accepted; a PS resize in progress moves the rows
    APPLIED = "applied"
    DECLINED = "declined"  # the master cannot apply it now; ``note`` says why
    SUPERSEDED = "superseded"  # a newer proposal replaced it before it was applied


ENDED_STATES = frozenset({PlanState.APPLIED, PlanState.DECLINED, PlanState.SUPERSEDED})


class PlanRecord(BaseModel):
    """One proposed plan and what became of it.

    ``rule`` names what proposed it (a post-scaling rule, ``pareto``, ``requested``);
    ``expected_gain`` is the samples/s the fitted model expects from it (the cluster arbiter
    ranks scale-ups by it); a PS resize records the rows it moved and the pause it cost.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    id: int = Field(default=0, ge=0)  # 1, 2, ... per job; 0 for the initial plan
    at: float | None = None
    plan: ResourcePlan
    previous: ResourcePlan | None = None
    rule: str | None = None
    reason: str = ""
    state: PlanState = PlanState.PROPOSED
    note: str | None = None
    expected_gain: float | None = None
    applied_at: float | None = None
    moved_rows: int | None = None
    migration_s: float | None = None
    pause_s: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _applied_flag(cls, data: Any) -> Any:
        """Statuses written before plans had a state said ``applied: true|false``."""
        if isinstance(data, Mapping) and "applied" in data:
            data = dict(data)
            applied = bool(data.pop("applied"))
            if data.get("state") is None:
                data["state"] = PlanState.APPLIED if applied else PlanState.PROPOSED
        return data

    @property
    def applied(self) -> bool:
        """Whether the job ran (or runs) this plan."""
        return self.state in (PlanState.APPLIED, PlanState.INITIAL)

    @property
    def pending(self) -> bool:
        return self.state == PlanState.PROPOSED

    def mark_applying(self, note: str) -> None:
        self.state, self.note = PlanState.APPLYING, note

    def mark_applied(self, at: float, note: str | None = None, **measured: Any) -> None:
        self.state, self.applied_at = PlanState.APPLIED, at
        if note is not None:
            self.note = note
        for name, value in measured.items():
            setattr(self, name, value)

    def decline(self, note: str) -> None:
        self.state, self.note = PlanState.DECLINED, note

    def supersede(self, note: str) -> None:
        self.state, self.note = PlanState.SUPERSEDED, note

    def to_json(self) -> dict[str, Any]:
        """The record as the status JSON carries it (fields never set left out)."""
        return self.model_dump(mode="json", exclude_none=True)


def plan_records(entries: Any) -> list[PlanRecord]:
    """The plan records of a status's ``plans`` list; an entry that is not a valid record (no
    plan, a plan out of bounds) is left out."""
    records = []
    for entry in entries if isinstance(entries, Iterable) else ():
        if not isinstance(entry, Mapping):
            continue
        try:
            records.append(PlanRecord.model_validate(entry))
        except ValidationError:
            continue
    return records


def pending_plan(records: Iterable[PlanRecord]) -> PlanRecord | None:
    """The proposal waiting to be applied (a master keeps at most one)."""
    return next((r for r in records if r.pending), None)
