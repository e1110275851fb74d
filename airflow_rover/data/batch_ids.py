"""A batch as the trainer's step reads it: the model's inputs and, per embedding group, the
unique fused ids to pull and each sample's index into them.

Plain numpy, no TensorFlow and no PS: the same code runs in a trainer's own input pipeline and
on a data worker, so both hand the step identical elements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from airflow_rover.core.embedding_placement import EmbeddingPlacement, TableSlice
from airflow_rover.core.spec import FeatureConfig
from airflow_rover.data.batch import Batch, RaggedIds

Element = dict[str, np.ndarray]


@dataclass
class BatchIds:
    """Unique fused ids per embedding group, each sample's (batch, scalar tables) index into
    them, and per list table the index of each of its ids and the sample that holds it."""

    unique: dict[str, np.ndarray]
    inverse: dict[str, np.ndarray]
    list_ids: dict[str, np.ndarray]
    segments: dict[str, np.ndarray]


class ElementEncoder:
    """Turns batches into step elements for one feature config. ``columns``: the dataset's
    scalar categorical columns, ``lists``: its list columns (``Batch.lists``)."""

    def __init__(
        self, features: FeatureConfig, columns: Sequence[str], lists: Sequence[str] = ()
    ) -> None:
        missing = sorted({t.column for t in features.tables} - set(columns) - set(lists))
        if missing:
            raise ValueError(f"features.tables: columns {missing} are not in the dataset")
        self.features = features
        self.placement = EmbeddingPlacement.from_features(features)
        self.groups = self.placement.groups
        self.column_index = {name: i for i, name in enumerate(columns)}
        self.list_index = {name: i for i, name in enumerate(lists)}
        self.scalar = [
            tuple(t for t in g.tables if t.column in self.column_index) for g in self.groups
        ]
        # (group index, table) of each entry reading a list column, in a fixed order
        self.lists: list[tuple[int, TableSlice]] = [
            (i, t)
            for i, g in enumerate(self.groups)
            for t in g.tables
            if t.column in self.list_index
        ]

    def batch_ids(self, categorical: np.ndarray, lists: Sequence[RaggedIds] = ()) -> BatchIds:
        """The ids a batch reads: per group, unique fused ids of its scalar and list columns
        together (one pull, one push per id however many columns read it)."""
        ids = BatchIds({}, {}, {}, {})
        for i, group in enumerate(self.groups):
            fused = group.fused_ids(categorical, self.column_index, self.scalar[i])
            listed = [t for g, t in self.lists if g == i]
            if not listed:  # the common case: no list column reads this group
                uniq, inv = np.unique(fused, return_inverse=True)
                ids.unique[group.name] = uniq
                ids.inverse[group.name] = inv.reshape(fused.shape).astype(np.int32)
                continue
            ragged = [lists[self.list_index[t.column]] for t in listed]
            parts = [fused.ravel()] + [
                group.fused_values(t, r.values) for t, r in zip(listed, ragged, strict=True)
            ]
            uniq, inv = np.unique(np.concatenate(parts), return_inverse=True)
            inv = inv.astype(np.int32)
            ids.unique[group.name] = uniq
            ids.inverse[group.name] = inv[: fused.size].reshape(fused.shape)
            at = fused.size
            for table, r in zip(listed, ragged, strict=True):
                ids.list_ids[table.name] = inv[at : at + r.values.size]
                ids.segments[table.name] = np.repeat(
                    np.arange(len(r), dtype=np.int32), np.diff(r.row_splits)
                )
                at += r.values.size
        return ids

    def element(self, batch: Batch) -> Element:
        """A batch and its ids: one element of the input pipeline."""
        ids = self.batch_ids(batch.categorical, batch.lists)
        weight = batch.weight if batch.weight is not None else np.ones(len(batch), np.float32)
        element = {"dense": batch.dense, "label": batch.label, "weight": weight}
        for g in self.groups:
            element[f"unique/{g.name}"] = ids.unique[g.name]
            element[f"inverse/{g.name}"] = ids.inverse[g.name]
        for _, t in self.lists:
            element[f"list/{t.name}"] = ids.list_ids[t.name]
            element[f"segments/{t.name}"] = ids.segments[t.name]
        return element
