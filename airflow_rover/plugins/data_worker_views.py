"""What the job page shows of a job's data workers: the status's ``data_workers`` section (or
the history record's copy of it) made into a panel and a timeline of scaling decisions.

Plain functions of plain data, like ``job_views``; values that are not what the master writes
are shown as missing, never trusted into the page.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_rover.history.records import int_or_none, number_or_none


@dataclass(frozen=True)
class DataWorkerDecisionLine:
    """One entry of the data workers' timeline: a change of their count, and why."""

    at: float | None
    previous: int | None
    count: int | None
    rule: str
    reason: str


@dataclass(frozen=True)
class DataWorkersPanel:
    """The job's data workers: mode, bounds, counts, the last window's figures, decisions."""

    mode: str
    target: int | None
    running: int | None
    min: int | None
    max: int | None
    input_wait: float | None  # fraction of the trainers' time spent waiting for input
    ready_fill: float | None  # mean ready batches / capacity
    samples_per_s: float | None  # the trainers' throughput
    decisions: list[DataWorkerDecisionLine]  # newest first


def decision_lines(decisions: Any) -> list[DataWorkerDecisionLine]:
    """The decisions as timeline lines, newest first (entries that are not mappings skipped)."""
    lines = [
        DataWorkerDecisionLine(
            at=number_or_none(d.get("at")),
            previous=int_or_none(d.get("previous")),
            count=int_or_none(d.get("count")),
            rule=str(d.get("rule") or ""),
            reason=str(d.get("reason") or ""),
        )
        for d in (decisions if isinstance(decisions, list) else ())
        if isinstance(d, Mapping)
    ]
    order = sorted(enumerate(lines), key=lambda p: (p[1].at or 0.0, p[0]), reverse=True)
    return [line for _, line in order]


def data_workers_panel(section: Any) -> DataWorkersPanel | None:
    """The panel of a ``data_workers`` section; None where there is none or its mode is off."""
    if not isinstance(section, Mapping):
        return None
    mode = str(section.get("mode") or "off")
    if mode == "off":
        return None
    return DataWorkersPanel(
        mode=mode,
        target=int_or_none(section.get("target")),
        running=int_or_none(section.get("running")),
        min=int_or_none(section.get("min")),
        max=int_or_none(section.get("max")),
        input_wait=number_or_none(section.get("input_wait")),
        ready_fill=number_or_none(section.get("ready_fill")),
        samples_per_s=number_or_none(section.get("samples_per_s")),
        decisions=decision_lines(section.get("decisions")),
    )
