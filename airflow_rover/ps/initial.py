"""A PS's start from a previous model (``JobSpec.init``): its rows of the source, by the job's
placement, whatever PS count saved them.

Only a job without a checkpoint of its own starts here (``ps.__main__.restore`` prefers the
job's checkpoint and its shared-memory snapshot): the job's first checkpoint holds the loaded
rows, so a retry or a relaunched PS resumes from that and never loads the source twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from airflow_rover.core.hashing import owner_of, partition_of
from airflow_rover.core.incremental import UNKNOWN_DAY, InitSource, kept_rows
from airflow_rover.ps.server import ParameterServer, _dense_var

log = logging.getLogger(__name__)

TABLE_PREFIX = "table/"


@dataclass
class InitialLoad:
    """What a PS took of the source: rows kept, rows evicted, dense variables."""

    rows: int = 0
    evicted: int = 0
    dense: int = 0
    parts: int = 0


def source_dir(location: str) -> Path:
    """The local folder of a source location (a path or a ``file://`` URI)."""
    return Path(location.removeprefix("file://"))


def source_parts(folder: Path) -> list[Path]:
    """The partitions of a model folder or checkpoint, in PS order; none is an error naming
    the folder."""
    parts = sorted(folder.glob("ps-*.npz"), key=lambda p: int(p.stem.split("-")[1]))
    if not parts:
        raise FileNotFoundError(
            f"init_from: {folder} holds no ps-<i>.npz partitions (a model folder or a "
            "checkpoint is expected)"
        )
    return parts


def load_initial(ps: ParameterServer, source: InitSource, day: int | None) -> InitialLoad:
    """Load into the empty ``ps`` its rows (``core.hashing.partition_of`` at this job's PS
    count) and its dense variables (``owner_of``) with their optimizer state, from every
    partition of ``source``. Rows not seen within ``source.evict_after_days`` before ``day``
    are left out; rows of unknown day count as seen today. The ledger stays empty: the
    source's batches are not this job's."""
    load = InitialLoad()
    for part in source_parts(source_dir(source.location)):
        with np.load(part) as saved:
            arrays = dict(saved)
        load.parts += 1
        _load_rows(ps, arrays, day, source.evict_after_days, load)
        dense = {
            key: value
            for key, value in arrays.items()
            if (var := _dense_var(key)) is not None and owner_of(var, ps.num_ps) == ps.index
        }
        ps.dense.restore(dense)
        load.dense += sum(1 for key in dense if key.startswith("dense/"))
    return load


def _load_rows(
    ps: ParameterServer,
    arrays: dict[str, np.ndarray],
    day: int | None,
    evict_after_days: int | None,
    load: InitialLoad,
) -> None:
    tables: dict[str, dict[str, np.ndarray]] = {}
    for key, value in arrays.items():
        if key.startswith(TABLE_PREFIX):
            name, field = key[len(TABLE_PREFIX) :].split("/", 1)
            tables.setdefault(name, {})[field] = value
    for name, fields in tables.items():
        table = ps.tables.get(name)
        if table is None:
            raise ValueError(
                f"init_from: the source has embedding group {name!r}, this job has "
                f"{sorted(ps.tables)}"
            )
        ids = np.asarray(fields["ids"], dtype=np.int64)
        seen = np.asarray(fields.get("seen", np.full(ids.size, UNKNOWN_DAY)), dtype=np.int32)
        if day is not None:
            seen = np.where(seen == UNKNOWN_DAY, day, seen).astype(np.int32)
        kept = kept_rows(seen, day, evict_after_days)
        mine = partition_of(name, ids, ps.num_ps) == ps.index
        load.evicted += int(np.count_nonzero(mine & ~kept))
        take = mine & kept
        rows = {k: v[take] for k, v in fields.items() if k == "rows" or k.startswith("state/")}
        rows["ids"] = ids[take]
        rows["seen"] = seen[take]
        rows["counts"] = np.zeros(rows["ids"].size, dtype=np.uint32)
        table.absorb(rows)
        load.rows += int(rows["ids"].size)
