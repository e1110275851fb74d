"""The SavedModel's in-graph hashing is the PS's: an id it never trained reads the same seeded
row as on the PS (``core.hashing``), bit for bit."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.hashing import INIT_SCALE, initial_rows, name_salt, splitmix64
from airflow_rover.core.spec import FeatureConfig, TableConfig
from airflow_rover.worker import serving_module
from airflow_rover.worker.model_folder import GroupRows
from airflow_rover.worker.models import wide_deep

FEATURES = FeatureConfig(
    num_dense=2,
    tables=(
        TableConfig(name="a", column="ca", vocab_size=50, dim=4),
        TableConfig(name="b", column="cb", vocab_size=70, dim=4),
        TableConfig(name="w", column="ca", vocab_size=50, dim=1),
    ),
)


def test_splitmix64_in_the_graph_is_numpys() -> None:
    rng = np.random.default_rng(1)
    random = rng.integers(0, 2**63, 1000, dtype=np.uint64) * np.uint64(2)
    x = np.concatenate([random, np.array([0, 2**64 - 1], dtype=np.uint64)])
    got = serving_module.splitmix64(tf.constant(x)).numpy()
    np.testing.assert_array_equal(got, splitmix64(x))


def _module(seed: int, trained: dict[str, tuple[np.ndarray, np.ndarray]]) -> Any:
    groups = []
    for g in EmbeddingPlacement.from_features(FEATURES).groups:
        ids, rows = trained.get(g.name, (np.zeros(0, np.int64), np.zeros((0, g.dim), np.float32)))
        groups.append(GroupRows(g, ids, rows))
    keras.utils.set_random_seed(seed)
    return serving_module.ServingModule(
        wide_deep(FEATURES, hidden=(8,)), FEATURES, groups, seed, INIT_SCALE, name_salt
    )


@pytest.mark.parametrize("seed", [0, 11, 2**32 - 1])
def test_untrained_ids_read_the_ps_seeded_rows_and_trained_ids_their_rows(seed: int) -> None:
    layout = EmbeddingPlacement.from_features(FEATURES)
    dim4 = layout.group("dim4")
    trained_ids = np.array([3, 60, 119], np.int64)  # fused: a's 3, b's 10, b's 69
    trained_rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    module = _module(seed, {"dim4": (trained_ids, trained_rows)})
    index = [g.name for g in layout.groups].index("dim4")
    ids = np.arange(70, dtype=np.int64)
    pairs = np.stack([ids % 50, ids], axis=1)  # (a's ids, b's ids)
    got = module._lookup(index, tf.constant(pairs)).numpy()[:, 1]
    fused = ids + 50
    expected = initial_rows(dim4.name, fused, 4, seed, INIT_SCALE)
    expected[10], expected[69] = trained_rows[1], trained_rows[2]
    np.testing.assert_array_equal(got, expected)


def test_an_id_outside_its_table_fails_naming_the_column() -> None:
    module = _module(0, {})
    index = [g.name for g in module._groups].index("dim4")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"column 'cb' .* outside"):
        module._lookup(index, tf.constant([[1, 2], [3, 70]], tf.int64))


def test_the_dense_input_is_named_as_the_models() -> None:
    """``export.json`` and callers name it ``DENSE_COLUMN``; the graph reads ``DENSE_INPUT``."""
    from airflow_rover.worker.export import DENSE_COLUMN
    from airflow_rover.worker.models import DENSE_INPUT

    assert DENSE_COLUMN == DENSE_INPUT


def _fnv1a64(data: bytes) -> int:
    """FNV-1a 64, the textbook definition."""
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) % 2**64
    return h


def test_string_and_int_ids_hash_into_buckets_in_the_graph() -> None:
    """Ready for string and hashed int columns (the data schema's): splitmix64(FNV-1a(UTF-8))
    and splitmix64 of the int64's bits, then mod the table's buckets."""
    strings = ["", "a", "ab", "héllo wörld", "x" * 300, "user-00042"]
    expected = splitmix64(np.array([_fnv1a64(s.encode()) for s in strings], dtype=np.uint64))
    got = serving_module.hash_strings(tf.constant(strings)).numpy()
    np.testing.assert_array_equal(got, expected)
    only_empty = serving_module.hash_strings(tf.constant([""])).numpy()
    assert only_empty[0] == expected[0]
    assert serving_module.hash_strings(tf.constant([], tf.string)).numpy().size == 0
    ints = np.array([0, 1, -1, 2**62, -(2**63)], dtype=np.int64)
    np.testing.assert_array_equal(
        serving_module.hash_ints(tf.constant(ints)).numpy(), splitmix64(ints.view(np.uint64))
    )
    buckets = serving_module.to_buckets(tf.constant(expected), 1000).numpy()
    np.testing.assert_array_equal(buckets, (expected % np.uint64(1000)).astype(np.int64))
