"""Continuing from a previous model (``init_from``): what a job starts from, and which rows it
keeps of it.

Pure logic: the operator resolves ``init_from`` (``"previous"`` through the history store, or
a path) into an ``InitSource`` in the job's spec; every PS loads its rows of that source when
the job has no checkpoint of its own yet (``ps.initial``). Rows carry the day they were last
trained on (``seen``, days since 1970-01-01 UTC); at load, rows not seen for more than
``evict_after_days`` days before the job's day are dropped, so tables do not grow without
bound.
"""

from __future__ import annotations

import datetime as dt

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

PREVIOUS = "previous"
"""``init_from="previous"``: the last successful run of the same DAG and task."""
UNKNOWN_DAY = -1
"""``seen`` of a row whose day is not known (a job without a day, an older model)."""
MODEL_CARD = "model.json"


class InitSource(BaseModel):
    """The model or checkpoint a job starts from when it has no checkpoint of its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    location: str = Field(
        min_length=1,
        description="absolute path of a model folder (model.json, ps-<i>.npz) or of a "
        "checkpoint (ckpt-<n>/ with ps-<i>.npz)",
    )
    origin: str = Field(
        default="",
        description="what it is, for the logs: the run it came from, or the path as given",
    )
    evict_after_days: int | None = Field(
        default=None,
        ge=0,
        description="drop rows not trained on for more than this many days before the job's "
        "day (none: keep every row)",
    )


def day_number(when: dt.datetime | dt.date) -> int:
    """Days since 1970-01-01 of ``when`` (its UTC date for an aware datetime)."""
    if isinstance(when, dt.datetime):
        if when.tzinfo is not None:
            when = when.astimezone(dt.UTC)
        when = when.date()
    return (when - dt.date(1970, 1, 1)).days


def kept_rows(seen: np.ndarray, day: int | None, evict_after_days: int | None) -> np.ndarray:
    """Which rows of a loaded table stay: all without eviction (or without a job day); else
    those seen within ``evict_after_days`` days before ``day``, and those of unknown day."""
    if evict_after_days is None or day is None:
        return np.ones(seen.shape, dtype=bool)
    return (seen == UNKNOWN_DAY) | (seen >= day - evict_after_days)


def check_init_option(owner: str, init_from: object, evict_after_days: object) -> None:
    """Parse-time check of ``init_from`` and ``evict_after_days`` (templates pass)."""
    if init_from is not None and not isinstance(init_from, str):
        raise ValueError(
            f"{owner}: init_from={init_from!r}: accepted: None, {PREVIOUS!r}, or the path or "
            "file:// URI of a model folder or checkpoint"
        )
    literal = isinstance(init_from, str) and bool(init_from) and "{{" not in init_from
    if literal and init_from != PREVIOUS and not str(init_from).startswith(("/", "file://")):
        raise ValueError(
            f"{owner}: init_from={init_from!r}: accepted: {PREVIOUS!r}, an absolute path "
            "or a file:// URI of a model folder (model.json, ps-<i>.npz) or checkpoint"
        )
    if evict_after_days is None or (isinstance(evict_after_days, str) and "{{" in evict_after_days):
        return
    if isinstance(evict_after_days, bool) or not isinstance(evict_after_days, int):
        raise ValueError(
            f"{owner}: evict_after_days={evict_after_days!r}: must be a whole number of days "
            ">= 0, or None to keep every row"
        )
    if evict_after_days < 0:
        raise ValueError(f"{owner}: evict_after_days={evict_after_days}: must be >= 0")
