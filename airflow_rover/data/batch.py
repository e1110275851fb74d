"""The samples a reader serves (``Batch``), the columns a model is built from (``Schema``),
and the helpers every reader shares to serve index ranges."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CategoricalColumn:
    """One categorical feature: ids are integers in ``[0, vocab_size)``. ``values``: what
    the files hold (``ids`` used as they are, ``ints`` or ``strings`` hashed); ``table``: a
    table shared with other columns (None: the column's own). ``raw``: the ids are any int64
    (raw 64-bit ids, read by a table of index 'ids'), ``vocab_size`` only their expected count."""

    name: str
    vocab_size: int
    values: str = "ids"
    table: str | None = None
    raw: bool = False


@dataclass(frozen=True)
class ListColumn:
    """A multi-valued categorical feature: each sample holds any number of ids in
    ``[0, vocab_size)`` (any int64 when ``raw``), whose embeddings ``combiner`` (sum or mean)
    makes one."""

    name: str
    vocab_size: int
    combiner: str = "sum"
    values: str = "ids"
    table: str | None = None
    raw: bool = False  # any int64 key (``data.arrow_columns``), not an id in the vocabulary


@dataclass(frozen=True)
class RaggedIds:
    """A list column's ids: sample ``i`` holds ``values[row_splits[i]:row_splits[i + 1]]``."""

    values: np.ndarray  # int64
    row_splits: np.ndarray  # int64 (n + 1,), from 0 to len(values), non-decreasing

    def __len__(self) -> int:
        return int(self.row_splits.shape[0]) - 1

    def rows(self, lo: int, hi: int) -> RaggedIds:
        """Samples ``[lo, hi)`` (views of the values)."""
        first, last = int(self.row_splits[lo]), int(self.row_splits[hi])
        return RaggedIds(self.values[first:last], self.row_splits[lo : hi + 1] - first)


def concat_ragged(parts: list[RaggedIds]) -> RaggedIds:
    """One RaggedIds of ``parts``' samples in order."""
    splits = [np.zeros(1, np.int64)]
    total = 0
    for part in parts:
        splits.append(part.row_splits[1:] + total)
        total += int(part.row_splits[-1])
    return RaggedIds(np.concatenate([p.values for p in parts]), np.concatenate(splits))


@dataclass(frozen=True)
class Schema:
    """Column layout shared by every batch of a dataset (what a model needs to be built)."""

    num_dense: int
    categorical: tuple[CategoricalColumn, ...]
    lists: tuple[ListColumn, ...] = ()

    @property
    def num_categorical(self) -> int:
        return len(self.categorical)

    @property
    def vocab_sizes(self) -> tuple[int, ...]:
        return tuple(column.vocab_size for column in self.categorical)


@dataclass(frozen=True)
class Batch:
    """A block of consecutive samples, column-major by feature kind, ready for a model."""

    dense: np.ndarray  # float32 (n, num_dense)
    categorical: np.ndarray  # int64 (n, num_categorical)
    label: np.ndarray  # float32 (n,)
    lists: tuple[RaggedIds, ...] = ()  # one per list column of the Schema
    weight: np.ndarray | None = None  # float32 (n,), >= 0: each sample's loss weight; None: 1

    def __post_init__(self) -> None:
        """Catch mismatched or mistyped columns here, not deep inside a training step."""
        n = self.label.shape[0] if self.label.ndim == 1 else -1
        if n < 0:
            raise ValueError(f"label must be 1-D, got shape {self.label.shape}")
        if self.dense.ndim != 2 or self.dense.shape[0] != n:
            raise ValueError(f"dense must have shape ({n}, num_dense), got {self.dense.shape}")
        if self.categorical.ndim != 2 or self.categorical.shape[0] != n:
            raise ValueError(
                f"categorical must have shape ({n}, num_categorical), got {self.categorical.shape}"
            )
        for name, array, dtype in (
            ("dense", self.dense, np.float32),
            ("categorical", self.categorical, np.int64),
            ("label", self.label, np.float32),
        ):
            if array.dtype != dtype:
                raise ValueError(f"{name} must be {np.dtype(dtype).name}, got {array.dtype}")
        if self.weight is not None and (
            self.weight.dtype != np.float32 or self.weight.shape != (n,)
        ):
            raise ValueError(
                f"weight must be float32 ({n},), got {self.weight.dtype} {self.weight.shape}"
            )

        for j, ragged in enumerate(self.lists):
            splits = ragged.row_splits
            if ragged.values.dtype != np.int64 or splits.dtype != np.int64 or len(ragged) != n:
                raise ValueError(
                    f"lists[{j}] must be int64 values and {n + 1} int64 row_splits, got "
                    f"{ragged.values.dtype} and {splits.dtype} {splits.shape}"
                )
            if splits[0] != 0 or splits[-1] != len(ragged.values) or (np.diff(splits) < 0).any():
                raise ValueError(f"lists[{j}]: row_splits must rise from 0 to len(values)")

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def __getitem__(self, rows: slice) -> Batch:
        """The samples ``rows`` (a slice without step: views, no copy)."""
        lo, hi, step = rows.indices(len(self))
        if step != 1:
            raise ValueError("a Batch is sliced without a step")
        hi = max(lo, hi)
        return Batch(
            self.dense[lo:hi],
            self.categorical[lo:hi],
            self.label[lo:hi],
            tuple(ragged.rows(lo, hi) for ragged in self.lists),
            None if self.weight is None else self.weight[lo:hi],
        )


def concat_batches(parts: list[Batch]) -> Batch:
    """One Batch of ``parts``' samples in order (the only one itself, not a copy)."""
    if len(parts) == 1:
        return parts[0]
    return Batch(
        dense=np.concatenate([p.dense for p in parts]),
        categorical=np.concatenate([p.categorical for p in parts]),
        label=np.concatenate([p.label for p in parts]),
        lists=tuple(concat_ragged([p.lists[j] for p in parts]) for j in range(len(parts[0].lists))),
        weight=_concat_weights(parts),
    )


def _concat_weights(parts: list[Batch]) -> np.ndarray | None:
    """The parts' weights in order; None when no part has any (a part without: weight 1)."""
    if all(p.weight is None for p in parts):
        return None
    return np.concatenate(
        [p.weight if p.weight is not None else np.ones(len(p), np.float32) for p in parts]
    )


def check_range(start: int, stop: int, num_samples: int) -> None:
    """``[start, stop)`` lies in ``[0, num_samples]``; ValueError naming start/stop if not."""
    for name, value in (("start", start), ("stop", stop)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if not 0 <= start <= num_samples:
        raise ValueError(f"start must be in [0, {num_samples}], got {start}")
    if not start <= stop <= num_samples:
        raise ValueError(f"stop must be in [start={start}, {num_samples}], got {stop}")
