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


@pytest.mark.parametrize("found_by", ["slots", "hash table"])
@pytest.mark.parametrize("seed", [0, 11, 2**32 - 1])
def test_untrained_ids_read_the_ps_seeded_rows_and_trained_ids_their_rows(
    seed: int, found_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a vocabulary's trained rows by an int32 slot per id, or (sparse) by a hash table
    monkeypatch.setattr(
        serving_module, "SLOTS_PER_TRAINED_ROW", 10**9 if found_by == "slots" else 0
    )
    layout = EmbeddingPlacement.from_features(FEATURES)
    dim4 = layout.group("dim4")
    trained_ids = np.array([3, 60, 119], np.int64)  # fused: a's 3, b's 10, b's 69
    trained_rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    module = _module(seed, {"dim4": (trained_ids, trained_rows)})
    assert ("dim4" in module.id_rows) == (found_by == "hash table")
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


LIST_FEATURES = FeatureConfig(
    num_dense=2,
    tables=(
        TableConfig(
            name="city", column="city", vocab_size=64, dim=4, table="geo", values="strings"
        ),
        TableConfig(name="n", column="n", vocab_size=32, dim=4, values="ints"),
        TableConfig(
            name="visited",
            column="visited",
            vocab_size=64,
            dim=4,
            table="geo",
            pooling="mean",
            values="strings",
            multivalued=True,
        ),
        TableConfig(name="ids", column="ids", vocab_size=9, dim=4, multivalued=True),
    ),
)


def _summing(features: FeatureConfig) -> keras.Model:
    """A tower whose logit is the sum of every input: it shows what the lookup fed it."""
    from airflow_rover.worker.models import _inputs

    inputs = _inputs(features)
    both = keras.layers.Concatenate()(list(inputs.values()))
    return keras.Model(inputs, keras.layers.Lambda(lambda x: keras.ops.sum(x, 1, True))(both))


def test_the_inputs_are_raw_columns_and_a_lists_values_and_lengths() -> None:
    spec = serving_module.column_inputs(LIST_FEATURES)
    assert {k: v.dtype.name for k, v in spec.items()} == {
        "city": "string",
        "n": "int64",
        "visited": "string",
        "visited_lengths": "int64",
        "ids": "int64",
        "ids_lengths": "int64",
    }


def test_raw_values_are_hashed_shared_and_pooled_as_the_workers_inputs() -> None:
    """Strings and ints hashed in the graph as the readers hash them, the list pooled (mean,
    an empty list zeros), city and visited reading table geo: the same model inputs as a
    worker's (preflight's ``model_inputs`` of the hashed batch, untrained rows)."""
    from airflow_rover.core.hashing import hash_ints, hash_strings, to_buckets
    from airflow_rover.data.batch import Batch, RaggedIds
    from airflow_rover.worker.preflight import model_inputs

    city, n = ["a", "b", "zz"], np.array([5, -3, 2**40], np.int64)
    visited = [["a", "q"], [], ["b", "b", "c"]]
    flat = [v for x in visited for v in x]
    groups = [
        GroupRows(g, np.zeros(0, np.int64), np.zeros((0, g.dim), np.float32))
        for g in EmbeddingPlacement.from_features(LIST_FEATURES).groups
    ]
    module = serving_module.ServingModule(
        _summing(LIST_FEATURES), LIST_FEATURES, groups, 7, INIT_SCALE, name_salt
    )
    dense = np.ones((3, 2), np.float32)
    got = module.serve(
        {
            "dense_features": dense,
            "city": tf.constant(city),
            "n": n,
            "visited": tf.constant(flat, tf.string),
            "visited_lengths": np.array([2, 0, 3], np.int64),
            "ids": np.array([1, 2, 8], np.int64),
            "ids_lengths": np.array([1, 2, 0], np.int64),
        }
    )["logit"].numpy()

    def ragged(values: np.ndarray, lengths: list[int]) -> RaggedIds:
        return RaggedIds(values.astype(np.int64), np.cumsum([0, *lengths]).astype(np.int64))

    batch = Batch(
        dense,
        np.stack([to_buckets(hash_strings(city), 64), to_buckets(hash_ints(n), 32)], axis=1),
        np.zeros(3, np.float32),
        (
            ragged(to_buckets(hash_strings(flat), 64), [2, 0, 3]),
            ragged(np.array([1, 2, 8]), [1, 2, 0]),
        ),
    )
    expected = model_inputs(LIST_FEATURES, ["city", "n"], batch, 7, ["visited", "ids"])
    want = sum(np.asarray(v, np.float64).sum(axis=1) for v in expected.values())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


RAW = FeatureConfig(
    num_dense=2,
    tables=(
        TableConfig(name="u", column="cu", vocab_size=10, dim=4, index="ids"),
        TableConfig(name="a", column="ca", vocab_size=50, dim=4),
    ),
)


def test_an_ids_table_serves_its_trained_raw_ids_and_seeds_the_others(tmp_path: Any) -> None:
    """Raw ids from the whole int64 range map to their trained rows through a hash table that
    survives a save and load; any other id reads its seeded initial row, as on the PS."""
    layout = EmbeddingPlacement.from_features(RAW)
    group = layout.group("ids_u")
    trained = np.array([np.iinfo(np.int64).min, -7, 2**62 + 5], np.int64)
    trained_rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    groups = [
        GroupRows(g, trained, trained_rows)
        if g.name == group.name
        else GroupRows(g, np.zeros(0, np.int64), np.zeros((0, g.dim), np.float32))
        for g in layout.groups
    ]
    keras.utils.set_random_seed(5)
    module = serving_module.ServingModule(
        wide_deep(RAW, hidden=(8,)), RAW, groups, 5, INIT_SCALE, name_salt
    )
    asked = np.array([2**62 + 5, 123456789012345, -7, np.iinfo(np.int64).min], np.int64)
    index = [g.name for g in layout.groups].index(group.name)
    got = module._lookup(index, tf.constant(asked[:, None])).numpy()[:, 0]
    expected = initial_rows(group.name, asked, 4, 5, INIT_SCALE)
    expected[[0, 2, 3]] = trained_rows[[2, 1, 0]]
    np.testing.assert_array_equal(got, expected)
    signature = module.serve.get_concrete_function()
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": signature})
    loaded = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    columns = {
        "dense_features": tf.zeros((4, 2), tf.float32),
        "cu": tf.constant(asked),
        "ca": tf.constant([1, 2, 3, 4], tf.int64),
    }
    np.testing.assert_allclose(
        loaded(**columns)["probability"].numpy(), module.serve(columns)["probability"].numpy()
    )


def test_an_ids_table_of_strings_keys_them_by_their_64_bit_hash() -> None:
    """What a raw string column gives the PS (``data.arrow_columns``): no buckets. With no
    trained row, every id reads its seeded initial row."""
    from airflow_rover.core.hashing import hash_strings

    features = FeatureConfig(
        num_dense=2,
        tables=(
            TableConfig(name="s", column="cs", vocab_size=10, dim=4, index="ids", values="strings"),
        ),
    )
    layout = EmbeddingPlacement.from_features(features)
    groups = [
        GroupRows(g, np.zeros(0, np.int64), np.zeros((0, g.dim), np.float32)) for g in layout.groups
    ]
    module = serving_module.ServingModule(
        wide_deep(features, hidden=(8,)), features, groups, 0, INIT_SCALE, name_salt
    )
    words = ["shop-1", "", "ünï"]
    got = module._ids(layout.groups[0].tables[0], tf.constant(words)).numpy()
    np.testing.assert_array_equal(got, hash_strings(words).view(np.int64))
    rows = module._lookup(0, tf.constant(got[:, None])).numpy()[:, 0]
    np.testing.assert_array_equal(rows, initial_rows("ids_s", got, 4, 0, INIT_SCALE))


def test_a_vocabulary_far_larger_than_its_trained_rows_is_kept_as_a_hash_table() -> None:
    assert not serving_module.hashed_rows("vocab", 4_000, 1_000)  # 16 bytes a trained row
    assert serving_module.hashed_rows("vocab", 16_914_880, 86_600)  # 65 MB of slots otherwise
    assert serving_module.hashed_rows("vocab", 10, 0)
    assert serving_module.hashed_rows("ids", 10, 1_000)  # raw ids have no id space
