"""Embedding layout: tables of one dim fused into a group, fused id = table offset + row id."""

from __future__ import annotations

import numpy as np
import pytest

from airflow_rover.core.embedding_placement import EmbeddingGroup, EmbeddingPlacement, TableSlice
from airflow_rover.core.spec import FeatureConfig, TableConfig

FEATURES = FeatureConfig(
    num_dense=3,
    tables=(
        TableConfig(name="a", column="C1", vocab_size=100, dim=16),
        TableConfig(name="b", column="C2", vocab_size=50, dim=8),
        TableConfig(name="c", column="C3", vocab_size=30, dim=16),
        TableConfig(name="C1_wide", column="C1", vocab_size=100, dim=1),
        TableConfig(name="d", column="C4", vocab_size=7, dim=16),
        TableConfig(name="b_again", column="C2", vocab_size=50, dim=8),  # same column and dim
        TableConfig(name="C2_wide", column="C2", vocab_size=50, dim=1),
    ),
)
LAYOUT = EmbeddingPlacement.from_features(FEATURES)
COLUMN_VOCAB = {"C1": 100, "C2": 50, "C3": 30, "C4": 7}
# The dataset's column order differs from the tables' order on purpose.
COLUMNS = ["C3", "C1", "C4", "C2"]
COLUMN_INDEX = {c: i for i, c in enumerate(COLUMNS)}


def _batch(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, COLUMN_VOCAB[c], size=n) for c in COLUMNS], axis=1).astype(
        np.int32
    )


def test_tables_are_grouped_by_dim_in_config_order_with_stacked_offsets() -> None:
    """Each dim gets one group ``dim<d>``; its tables keep config order, offsets stack vocabs."""
    assert {g.name: g.dim for g in LAYOUT.groups} == {"dim1": 1, "dim8": 8, "dim16": 16}
    assert LAYOUT.group("dim16").tables == (
        TableSlice("a", "C1", 0, 100, "a"),
        TableSlice("c", "C3", 100, 30, "c"),
        TableSlice("d", "C4", 130, 7, "d"),
    )
    assert LAYOUT.group("dim8").tables == (
        TableSlice("b", "C2", 0, 50, "b"),
        TableSlice("b_again", "C2", 50, 50, "b_again"),
    )
    assert LAYOUT.group("dim1").tables == (
        TableSlice("C1_wide", "C1", 0, 100, "C1_wide"),
        TableSlice("C2_wide", "C2", 100, 50, "C2_wide"),
    )
    # Every table lands in exactly one group.
    names = [t.name for g in LAYOUT.groups for t in g.tables]
    assert sorted(names) == sorted(t.name for t in FEATURES.tables)


def test_entries_sharing_a_table_read_its_offset_and_later_tables_stack_after_it() -> None:
    """Two columns reading table ``geo`` take one offset; the table after it is not moved by
    the second reader; ``split`` names the first entry of the shared table."""
    features = FeatureConfig(
        num_dense=0,
        tables=(
            TableConfig(name="city", column="C1", vocab_size=100, dim=4, table="geo"),
            TableConfig(name="ad", column="C2", vocab_size=50, dim=4),
            TableConfig(name="home", column="C3", vocab_size=100, dim=4, table="geo"),
        ),
    )
    group = EmbeddingPlacement.from_features(features).group("dim4")
    assert [(t.name, t.offset, t.table) for t in group.tables] == [
        ("city", 0, "geo"),
        ("ad", 100, "ad"),
        ("home", 0, "geo"),
    ]
    assert group.vocab_size == 150
    index, ids = group.split(np.array([5, 120, 99]))
    assert index.tolist() == [0, 1, 0] and ids.tolist() == [5, 20, 99]


def test_group_order_is_deterministic_and_sorted_by_dim() -> None:
    """Worker and PS build the layout independently: the same features give the same layout."""
    assert [g.name for g in LAYOUT.groups] == ["dim1", "dim8", "dim16"]
    assert EmbeddingPlacement.from_features(FEATURES) == LAYOUT


def test_group_vocab_size_is_the_sum_of_its_tables() -> None:
    assert LAYOUT.group("dim16").vocab_size == 137
    assert LAYOUT.group("dim8").vocab_size == 100
    assert LAYOUT.group("dim1").vocab_size == 150


def test_single_table_group() -> None:
    """One table of its dim: offset 0 and the table's own vocabulary."""
    layout = EmbeddingPlacement.from_features(
        FeatureConfig(
            num_dense=1, tables=(TableConfig(name="x", column="C1", vocab_size=9, dim=4),)
        )
    )
    (group,) = layout.groups
    assert group == EmbeddingGroup("dim4", 4, (TableSlice("x", "C1", 0, 9, "x"),))
    assert group.vocab_size == 9
    cat = np.array([[3], [8], [0]], np.int64)
    np.testing.assert_array_equal(group.fused_ids(cat, {"C1": 0}), cat)


@pytest.mark.parametrize("name", ["dim16", "dim8", "dim1"])
def test_fused_ids_are_categorical_plus_offsets(name: str) -> None:
    """(batch, tables) int64: each column is the table's categorical column plus its offset."""
    group = LAYOUT.group(name)
    cat = _batch(64)
    fused = group.fused_ids(cat, COLUMN_INDEX)
    assert fused.shape == (64, len(group.tables))
    assert fused.dtype == np.int64
    for j, table in enumerate(group.tables):
        np.testing.assert_array_equal(
            fused[:, j], cat[:, COLUMN_INDEX[table.column]].astype(np.int64) + table.offset
        )
    assert fused.min() >= 0 and fused.max() < group.vocab_size


@pytest.mark.parametrize("name", ["dim16", "dim8", "dim1"])
def test_split_inverts_fused_ids_for_a_batch(name: str) -> None:
    """split(fused) gives back each entry's table index and the original categorical id."""
    group = LAYOUT.group(name)
    cat = _batch(64, seed=1)
    fused = group.fused_ids(cat, COLUMN_INDEX)
    table, ids = group.split(fused)
    np.testing.assert_array_equal(table, np.broadcast_to(np.arange(len(group.tables)), fused.shape))
    expected = np.stack([cat[:, COLUMN_INDEX[t.column]] for t in group.tables], axis=1)
    np.testing.assert_array_equal(ids, expected)


@pytest.mark.parametrize("name", ["dim16", "dim8", "dim1"])
def test_fused_ids_are_a_bijection_onto_the_group_id_space(name: str) -> None:
    """Every (table, id) maps to its own fused id, and together they cover [0, vocab) exactly."""
    group = LAYOUT.group(name)
    fused = np.concatenate(
        [t.offset + np.arange(t.vocab_size, dtype=np.int64) for t in group.tables]
    )
    np.testing.assert_array_equal(np.sort(fused), np.arange(group.vocab_size))
    table, ids = group.split(fused)
    np.testing.assert_array_equal(
        table, np.repeat(np.arange(len(group.tables)), [t.vocab_size for t in group.tables])
    )
    np.testing.assert_array_equal(
        ids, np.concatenate([np.arange(t.vocab_size) for t in group.tables])
    )


def test_tables_of_one_group_never_share_a_fused_id() -> None:
    """Two tables reading the same column at the same dim still get distinct rows."""
    group = LAYOUT.group("dim8")
    cat = _batch(200, seed=2)
    fused = group.fused_ids(cat, COLUMN_INDEX)
    np.testing.assert_array_equal(fused[:, 1] - fused[:, 0], 50)  # b_again = b + 50
    assert not set(fused[:, 0].tolist()) & set(fused[:, 1].tolist())


def test_tables_sharing_a_column_at_different_dims_land_in_different_groups() -> None:
    """``C1`` at dim 16 and ``C1_wide`` at dim 1 read one column but live in two groups."""
    where = {t.name: g.name for g in LAYOUT.groups for t in g.tables}
    assert where["a"] == "dim16" and where["C1_wide"] == "dim1"
    cat = _batch(32, seed=3)
    deep = LAYOUT.group("dim16").fused_ids(cat, COLUMN_INDEX)[:, 0]
    wide = LAYOUT.group("dim1").fused_ids(cat, COLUMN_INDEX)[:, 0]
    np.testing.assert_array_equal(deep, cat[:, COLUMN_INDEX["C1"]])
    np.testing.assert_array_equal(wide, cat[:, COLUMN_INDEX["C1"]])


@pytest.mark.parametrize("name", ["dim4", "dim", "a", "C1", ""])
def test_unknown_group_name_is_a_key_error(name: str) -> None:
    with pytest.raises(KeyError, match="no embedding group"):
        LAYOUT.group(name)


def test_fused_ids_needs_every_table_column() -> None:
    """A column missing from the batch's column index is a KeyError naming it."""
    with pytest.raises(KeyError, match="C4"):
        LAYOUT.group("dim16").fused_ids(_batch(4), {"C1": 1, "C3": 0})


def test_out_of_range_id_does_not_alias_another_table() -> None:
    """Table ``c`` has vocab 30: a C3 value of 30 must not become row 0 of table ``d``."""
    group = LAYOUT.group("dim16")
    cat = _batch(2)
    cat[0, COLUMN_INDEX["C3"]] = 30
    with pytest.raises(ValueError, match=r"table 'c': column 'C3' has ids outside \[0, 30\)"):
        group.fused_ids(cat, COLUMN_INDEX)


def test_a_model_whose_tables_were_not_shared_is_not_a_layout_for_one_that_shares() -> None:
    """``init_from``'s layout check: a column moved into a shared table reads other rows."""
    from airflow_rover.core.model_layout import layout_differences, layout_of

    def features(shared: bool) -> FeatureConfig:
        table = "geo" if shared else None
        return FeatureConfig(
            num_dense=0,
            tables=(
                TableConfig(name="city", column="C1", vocab_size=100, dim=4, table=table),
                TableConfig(name="home", column="C2", vocab_size=100, dim=4, table=table),
            ),
        )

    source, job = layout_of("m", features(False)), layout_of("m", features(True))
    assert layout_differences(source, job) == [
        "table 'home': rows at dim4+100 in the source, dim4+0 here"
    ]
    assert layout_differences(job, layout_of("m", features(True))) == []
