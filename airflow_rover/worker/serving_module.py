"""The ``tf.Module`` a model is exported as: the raw columns hashed as the readers hash them,
embedding lookups in the graph (one per group, a list column's rows pooled), then the Keras
model, then the sigmoid. Only TensorFlow ops, so the SavedModel needs no Python of ours."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from airflow_rover.core.embedding_placement import TableSlice
from airflow_rover.core.spec import FeatureConfig
from airflow_rover.worker.model_folder import GroupRows
from airflow_rover.worker.models import DENSE_INPUT
from airflow_rover.worker.pooling import pool, segments_of

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _u64(value: int) -> tf.Tensor:
    return tf.constant(np.uint64(value), dtype=tf.uint64)


def splitmix64(x: tf.Tensor) -> tf.Tensor:
    """``core.hashing.splitmix64`` in TensorFlow ops (uint64 wraps as NumPy's does)."""
    z = x + _u64(_GOLDEN)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(30))) * _u64(_M1)
    z = tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(27))) * _u64(_M2)
    return tf.bitwise.bitwise_xor(z, tf.bitwise.right_shift(z, _u64(31)))


_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3


def hash_ints(ids: tf.Tensor) -> tf.Tensor:
    """splitmix64 of int64 values (negative ones as their two's complement): how the data
    readers hash an int categorical column into a table's buckets."""
    return splitmix64(tf.bitcast(tf.cast(ids, tf.int64), tf.uint64))


def hash_strings(strings: tf.Tensor) -> tf.Tensor:
    """splitmix64(FNV-1a 64(UTF-8 bytes)) of a 1-D string tensor: how the data readers hash a
    string categorical column; one pass per byte position of the longest string."""
    lengths = tf.strings.length(strings)  # bytes
    longest = tf.reduce_max(tf.concat([lengths, [1]], 0))  # decode_raw needs 1 or more
    data = tf.io.decode_raw(strings, tf.uint8, fixed_length=longest)  # zero-padded

    def step(position: tf.Tensor, hashes: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        byte = tf.cast(data[:, position], tf.uint64)
        mixed = tf.bitwise.bitwise_xor(hashes, byte) * _u64(_FNV_PRIME)
        return position + 1, tf.where(lengths > position, mixed, hashes)

    start = tf.fill(tf.shape(strings), _u64(_FNV_OFFSET))
    _, hashes = tf.while_loop(lambda p, _: p < longest, step, (tf.constant(0), start))
    return splitmix64(hashes)


def to_buckets(hashes: tf.Tensor, buckets: int) -> tf.Tensor:
    """``hash mod buckets`` as int64 ids in ``[0, buckets)`` (``core.hashing.to_buckets``)."""
    return tf.cast(tf.math.floormod(hashes, _u64(buckets)), tf.int64)


LENGTHS_SUFFIX = "_lengths"
"""A list column ``c`` is served as two inputs: ``c``, every sample's values one after the
other (1-D), and ``c_lengths``, how many values each sample holds (int64, one per sample)."""


def column_inputs(features: FeatureConfig) -> dict[str, tf.TensorSpec]:
    """The signature's inputs for the categorical columns the tables read: per column its raw
    values (int64 ids or ints, or strings), and a list column's lengths."""
    spec: dict[str, tf.TensorSpec] = {}
    for t in features.tables:
        dtype = tf.string if t.values == "strings" else tf.int64
        spec.setdefault(t.column, tf.TensorSpec([None], dtype, t.column))
        if t.multivalued:
            lengths = t.column + LENGTHS_SUFFIX
            spec.setdefault(lengths, tf.TensorSpec([None], tf.int64, lengths))
    return spec


SLOTS_PER_TRAINED_ROW = 4
"""A vocabulary group keeps an int32 slot per id while its space holds at most this many ids
per row trained (16 bytes a row, about a hash table entry's); sparser, a hash table."""


def hashed_rows(index: str, vocab_size: int, trained: int) -> bool:
    """Whether a group's trained rows are found by a hash table rather than a slot array."""
    return index == "ids" or vocab_size > SLOTS_PER_TRAINED_ROW * max(trained, 1)


class ServingModule(tf.Module):
    """Raw columns in, click probability out; the trained rows and dense weights baked in."""

    def __init__(
        self,
        model: keras.Model,
        features: FeatureConfig,
        groups: list[GroupRows],
        seed: int,
        init_scale: float,
        name_salt: Callable[[str], np.uint64],
    ) -> None:
        super().__init__(name="rover_model")
        self.model = model
        self._groups = [g.group for g in groups]
        self._salts = [int(name_salt(g.group.name)) for g in groups]
        self._seed = seed & (2**64 - 1)
        self._scale = np.float32(init_scale)
        self._entries = {t.name: t for t in features.tables}
        self.slots: list[tf.Variable] = []
        self.rows: list[tf.Variable] = []
        # Per group (by name) whose ids are sparse in their space (index 'ids', or a
        # vocabulary far larger than its rows trained): id -> position in its rows, a hash
        # table of the ids trained; other groups keep an int32 slot per id of their space.
        self.id_rows: dict[str, tf.lookup.StaticHashTable] = {}
        for g in groups:
            positions = np.arange(g.ids.size, dtype=np.int32)
            if hashed_rows(g.group.index, g.group.vocab_size, g.ids.size):
                slot = np.zeros(0, dtype=np.int32)
                keys, values = g.ids.astype(np.int64), positions.astype(np.int64)
                if not keys.size:  # a table cannot be empty: one key that reads "untrained"
                    keys, values = np.zeros(1, np.int64), np.full(1, -1, np.int64)
                self.id_rows[g.group.name] = tf.lookup.StaticHashTable(
                    tf.lookup.KeyValueTensorInitializer(tf.constant(keys), tf.constant(values)),
                    default_value=-1,
                    name=f"{g.group.name}_id_rows",
                )
            else:
                slot = np.full(g.group.vocab_size, -1, dtype=np.int32)
                slot[g.ids] = positions
            # one spare row at the end: what an untrained id gathers before being replaced
            rows = np.concatenate([g.rows, np.zeros((1, g.group.dim), np.float32)])
            self.slots.append(tf.Variable(slot, trainable=False, name=f"{g.group.name}_slot"))
            self.rows.append(tf.Variable(rows, trainable=False, name=f"{g.group.name}_rows"))
        self.inputs = column_inputs(features)
        self.columns = sorted(self.inputs)
        spec = {DENSE_INPUT: tf.TensorSpec([None, features.num_dense], tf.float32, DENSE_INPUT)}
        # Its Python loops and branches are over the model's fixed layout, never over tensors:
        # no AutoGraph (converting it took most of a trace's 2 s).
        self.serve = tf.function(self._serve, input_signature=[spec | self.inputs], autograph=False)

    def _initial_rows(self, index: int, fused: tf.Tensor) -> tf.Tensor:
        """``core.hashing.initial_rows`` of fused ids of any shape, in the graph: shape + (dim,)."""
        dim = self._groups[index].dim
        salt = _u64(self._salts[index] ^ self._seed)
        base = splitmix64(tf.bitwise.bitwise_xor(tf.cast(fused, tf.uint64), salt))
        bits = splitmix64(base[..., None] + tf.constant(np.arange(dim, dtype=np.uint64)))
        unit = tf.cast(tf.bitwise.right_shift(bits, _u64(40)), tf.float32) * np.float32(2**-24)
        return unit * (2 * self._scale) - self._scale

    @staticmethod
    def _check_ids(tables: Sequence[TableSlice], ids: tf.Tensor) -> None:
        """Every id inside its table, else an error naming the first column with one outside
        (a table of index 'ids' takes any int64 id: nothing to check)."""
        if all(t.index == "ids" for t in tables):
            return
        vocab = tf.constant([t.vocab_size for t in tables], tf.int64)
        bad = tf.reduce_any(tf.logical_or(ids < 0, ids >= vocab), axis=0)
        messages = tf.constant(
            [
                f"column {t.column!r} (table {t.name!r}) has ids outside [0, {t.vocab_size})"
                for t in tables
            ]
        )
        first = tf.argmax(tf.cast(bad, tf.int32))
        tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [tf.gather(messages, first)])

    def _rows(self, index: int, fused: tf.Tensor) -> tf.Tensor:
        """shape + (dim,) rows of fused ids: the trained rows, else the seeded initial ones
        (as the PS creates a row it has not seen, raw ids as vocabulary ids)."""
        group = self._groups[index]
        if group.name in self.id_rows:
            slot = tf.cast(self.id_rows[group.name].lookup(fused), tf.int32)
        else:
            slot = tf.gather(self.slots[index], fused)
        spare = tf.shape(self.rows[index], out_type=tf.int32)[0] - 1
        trained = tf.gather(self.rows[index], tf.where(slot < 0, spare, slot))
        return tf.where((slot < 0)[..., None], self._initial_rows(index, fused), trained)

    def _lookup(
        self, index: int, ids: tf.Tensor, tables: Sequence[TableSlice] | None = None
    ) -> tf.Tensor:
        """(batch, tables) rows of a group's (batch, tables) ids (``tables``: default all
        the group's)."""
        tables = self._groups[index].tables if tables is None else tables
        self._check_ids(tables, ids)
        return self._rows(index, self._fuse(tables, ids))

    @staticmethod
    def _fuse(tables: Sequence[TableSlice], ids: tf.Tensor) -> tf.Tensor:
        return ids + tf.constant([t.offset for t in tables], tf.int64)

    def _ids(self, table: TableSlice, raw: tf.Tensor) -> tf.Tensor:
        """A column's raw values as the readers make them ids of ``table``: hashed into its
        buckets (``data.arrow_columns``), or used as they are."""
        values = self._entries[table.name].values
        if table.index == "ids":  # raw keys: ints as they are, strings by their 64-bit hash
            if values == "strings":
                return tf.bitcast(hash_strings(raw), tf.int64)
            return raw
        if values == "strings":
            return to_buckets(hash_strings(raw), table.vocab_size)
        if values == "ints":
            return to_buckets(hash_ints(raw), table.vocab_size)
        return raw

    def _group_inputs(
        self, index: int, columns: dict[str, tf.Tensor], samples: tf.Tensor
    ) -> dict[str, tf.Tensor]:
        """The model inputs a group's entries make: its rows looked up once for all of them
        (scalar columns and lists), a list's rows pooled per sample."""
        group = self._groups[index]
        scalar = [t for t in group.tables if not self._entries[t.name].multivalued]
        listed = [t for t in group.tables if self._entries[t.name].multivalued]
        parts = []
        if scalar:
            ids = tf.stack([self._ids(t, columns[t.column]) for t in scalar], axis=1)
            self._check_ids(scalar, ids)
            parts.append(tf.reshape(self._fuse(scalar, ids), [-1]))
        for t in listed:
            ids = self._ids(t, columns[t.column])
            self._check_ids([t], ids[:, None])
            parts.append(ids + t.offset)
        rows = self._rows(index, tf.concat(parts, 0))
        out: dict[str, tf.Tensor] = {}
        at = tf.size(parts[0]) if scalar else 0
        if scalar:
            per_table = tf.reshape(rows[:at], [samples, len(scalar), group.dim])
            out |= dict(zip([t.name for t in scalar], tf.unstack(per_table, axis=1), strict=True))
        for t, part in zip(listed, parts[len(parts) - len(listed) :], strict=True):
            size = tf.size(part)
            segments = segments_of(columns[t.column + LENGTHS_SUFFIX])
            out[t.name] = pool(rows[at : at + size], segments, samples, t.pooling)
            at += size
        return out

    def _serve(self, columns: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        inputs = {DENSE_INPUT: columns[DENSE_INPUT]}
        samples = tf.shape(columns[DENSE_INPUT])[0]
        for index in range(len(self._groups)):
            inputs |= self._group_inputs(index, columns, samples)
        logit = tf.squeeze(self.model(inputs, training=False), -1)
        return {"probability": tf.sigmoid(logit), "logit": logit}
