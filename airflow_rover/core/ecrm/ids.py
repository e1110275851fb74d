"""Id arrays, fast: uniqueness, membership and grouping by PS, without ``np.unique``'s sort
where the ids come sorted or unique (a PS's pushes and a group's members do)."""

from __future__ import annotations

import numpy as np


def all_unique(ids: np.ndarray) -> bool:
    """Whether ``ids`` has no repeats; sorted input (a PS's pushes are) needs no sort."""
    if ids.size < 2 or bool(np.all(ids[1:] > ids[:-1])):
        return True
    return bool(np.unique(ids).size == ids.size)


def distinct_ps(ps: np.ndarray) -> np.ndarray:
    """The distinct PS indices in ``ps``, ascending: a count per PS, not a sort of the rows."""
    return np.flatnonzero(np.bincount(ps)) if ps.size else np.empty(0, dtype=np.int64)


def sorted_inverse(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` for ids that are (almost always) unique
    already: one argsort, and the unique path only when there are repeats."""
    order = np.argsort(ids, kind="stable")
    uniq = ids[order]
    if uniq.size > 1 and not bool(np.all(uniq[1:] > uniq[:-1])):
        return np.unique(ids, return_inverse=True)
    inverse = np.empty(ids.size, dtype=np.int64)
    inverse[order] = np.arange(ids.size)
    return uniq, inverse


def sorted_unique(ids: np.ndarray) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64).ravel()
    if ids.size < 2 or bool((ids[1:] > ids[:-1]).all()):
        return ids
    return np.unique(ids)


def in_sorted(have: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Mask of ``ids`` found in the sorted array ``have``."""
    if have.size == 0:
        return np.zeros(ids.size, dtype=bool)
    pos = np.minimum(np.searchsorted(have, ids), have.size - 1)
    return have[pos] == ids


def gather_plan(
    member_ps: np.ndarray, member_ids: np.ndarray, skip: int | None
) -> tuple[dict[int, np.ndarray], dict[int, tuple[np.ndarray, np.ndarray]]]:
    """Per PS: the unique member ids to read, and (row in the plan, index into that read)."""
    reads: dict[int, np.ndarray] = {}
    gather: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    present = member_ids >= 0
    if skip is not None:
        present &= member_ps != skip
    rows, cols = np.nonzero(present)
    ps_of = member_ps[rows, cols]
    for ps in distinct_ps(ps_of):
        sel = ps_of == ps
        ids = member_ids[rows[sel], cols[sel]]
        uniq, inverse = sorted_inverse(ids)  # a group has one member per PS: no repeats
        reads[int(ps)] = uniq
        gather[int(ps)] = (rows[sel], inverse)
    return reads, gather
