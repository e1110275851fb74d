"""Spot-check a dataset's ids against the vocabularies of the tables that read them.

An id outside a table's vocabulary fails every batch that holds it, on every worker and on every
restart, until each shard is quarantined. Reading every id of a large dataset would cost as much
as an epoch, so preflight reads a bounded sample where the job will read: the first rows of a
few shards spread evenly from the first to the last.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from airflow_rover.core.spec import FeatureConfig
from airflow_rover.data.reader import Batch, SampleReader

SAMPLE_SHARDS = 8  # shards sampled, the first and the last among them
SAMPLE_ROWS = 1024  # rows read from the start of each sampled shard


@dataclass(frozen=True)
class OutOfVocab:
    """The first sampled id outside a table's vocabulary, and how common such ids are."""

    table: str
    column: str
    vocab_size: int
    id: int
    row: int  # the row of the dataset that holds ``id``
    bad_rows: int  # sampled rows with an id outside this table's vocabulary
    sampled_rows: int


def sample_ranges(
    num_samples: int, shard_size: int, shards: int = SAMPLE_SHARDS, rows: int = SAMPLE_ROWS
) -> list[tuple[int, int]]:
    """``[start, stop)`` row ranges: the first ``rows`` rows of up to ``shards`` shards of
    ``shard_size`` rows, spread evenly from the first shard to the last."""
    num_shards = -(-num_samples // shard_size)
    if num_shards == 0:
        return []
    if num_shards == 1 or shards == 1:
        picks = [0]
    else:
        picks = sorted({round(i * (num_shards - 1) / (shards - 1)) for i in range(shards)})
    ranges = []
    for shard in picks:
        start = shard * shard_size
        ranges.append((start, min(start + rows, start + shard_size, num_samples)))
    return ranges


def first_id_outside_vocab(
    reader: SampleReader, features: FeatureConfig, shard_size: int
) -> OutOfVocab | None:
    """The first sampled id of any table's column outside ``[0, vocab_size)``; None if all fit
    (a table of index 'ids' takes any int64 id, so is not checked).

    Costs at most ``SAMPLE_SHARDS * SAMPLE_ROWS`` rows read, whatever the dataset's size."""
    ranges = sample_ranges(reader.num_samples, shard_size)
    if not ranges:
        return None
    rows = np.concatenate([np.arange(start, stop) for start, stop in ranges])
    batches = [reader.read(start, stop) for start, stop in ranges]
    ids = np.concatenate([b.categorical for b in batches])
    index = {column.name: i for i, column in enumerate(reader.schema.categorical)}
    lists = {column.name: j for j, column in enumerate(reader.schema.lists)}
    for table in features.tables:
        if table.index == "ids":
            continue
        if table.column in lists:
            column, holder = _list_ids(batches, lists[table.column])
        else:
            column = ids[:, index[table.column]]
            holder = np.arange(len(column))
        bad = (column < 0) | (column >= table.vocab_size)
        if bad.any():
            first = int(np.argmax(bad))
            return OutOfVocab(
                table=table.name,
                column=table.column,
                vocab_size=table.vocab_size,
                id=int(column[first]),
                row=int(rows[holder[first]]),
                bad_rows=int(np.unique(holder[bad]).size),
                sampled_rows=len(rows),
            )
    return None


def _list_ids(batches: list[Batch], j: int) -> tuple[np.ndarray, np.ndarray]:
    """A list column's sampled ids, and the index (among the sampled rows) of the row holding
    each."""
    values, holders, base = [], [], 0
    for batch in batches:
        ragged = batch.lists[j]
        values.append(ragged.values)
        holders.append(base + np.repeat(np.arange(len(ragged)), np.diff(ragged.row_splits)))
        base += len(ragged)
    return np.concatenate(values), np.concatenate(holders)
