"""Tables of index 'ids' in a job's spec: validated, placed in a group of their own whose ids
go to the PS as they are, a table there keyed by the raw ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from airflow_rover.core.data_schema import DataSchema
from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.hashing import hash_strings
from airflow_rover.core.policies import CheckpointPolicyConfig
from airflow_rover.core.spec import FeatureConfig, JobSpec, TableConfig
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.data.batch_ids import ElementEncoder
from airflow_rover.data.features import with_resolved_features
from airflow_rover.data.preflight import PreflightError
from airflow_rover.data.preprocessing import checked, unchanged
from airflow_rover.data.reader import open_dataset, open_split, schema_from_manifest
from airflow_rover.data.synthetic_raw_ids import RawIdConfig, write_raw_id_dataset
from airflow_rover.data.vocab_check import first_id_outside_vocab
from airflow_rover.ps.partition import Partition
from airflow_rover.worker.preflight import preflight

BIG = np.iinfo(np.int64)


def _features(**ids_table: Any) -> dict[str, Any]:
    user = {"name": "user", "column": "C1", "vocab_size": 1000, "dim": 8, "index": "ids"}
    return {
        "num_dense": 2,
        "tables": [
            user | ids_table,
            {"name": "item", "column": "C2", "vocab_size": 50, "dim": 8},
            {"name": "user_wide", "column": "C1", "vocab_size": 1000, "dim": 1, "index": "ids"},
        ],
    }


def _spec(**fields: Any) -> dict[str, Any]:
    return {"job_id": "raw-ids", "train_data": "/data", "features": _features()} | fields


def test_index_defaults_to_vocab_and_ids_tables_are_listed() -> None:
    features = FeatureConfig.model_validate(_features())
    assert TableConfig(name="a", column="C", vocab_size=3, dim=2).index == "vocab"
    assert features.id_tables == ("user", "user_wide")


def test_every_checkpoint_policy_takes_raw_id_tables() -> None:
    for policy in ("full", "cpr", "ecrm"):
        spec = JobSpec.model_validate(_spec(checkpoint={"policy": policy}))
        assert spec.checkpoint.policy == policy


def test_entries_sharing_a_table_agree_on_the_index() -> None:
    shared = {"name": "again", "column": "C3", "vocab_size": 1000, "dim": 8, "table": "user"}
    features = _features()
    features["tables"].append(shared)  # index 'vocab' on the 'ids' table
    with pytest.raises(ValidationError, match=r"agree on all three"):
        FeatureConfig.model_validate(features)


def test_an_ids_table_is_a_group_of_its_own_and_its_ids_pass_unchanged() -> None:
    """Raw ids from the whole int64 range reach the PS as they are; the vocab table next to
    it keeps its offset and its range check."""
    placement = EmbeddingPlacement.from_features(FeatureConfig.model_validate(_features()))
    names = {g.name: (g.index, g.dim) for g in placement.groups}
    assert names == {
        "dim8": ("vocab", 8),
        "ids_user": ("ids", 8),
        "ids_user_wide": ("ids", 1),
    }
    raw = np.array([[BIG.min, 3], [BIG.max, 49], [-1, 0]], dtype=np.int64)
    columns = {"C1": 0, "C2": 1}
    assert np.array_equal(placement.group("ids_user").fused_ids(raw, columns), raw[:, :1])
    assert np.array_equal(placement.group("dim8").fused_ids(raw, columns), raw[:, 1:])
    with pytest.raises(ValueError, match=r"table 'item': column 'C2' has ids outside \[0, 50\)"):
        placement.group("dim8").fused_ids(raw + np.array([0, 1]), columns)


def test_the_ps_keys_an_ids_group_by_raw_ids_one_row_each() -> None:
    """Ids that a 1,000-row vocabulary would fold onto few rows each get a row of their own."""
    placement = EmbeddingPlacement.from_features(FeatureConfig.model_validate(_features()))
    part = Partition(0, 1, placement, Optimizer("adagrad", 0.1), seed=1)
    table = part.tables["ids_user"]
    assert table.index_kind == "ids" and part.tables["dim8"].index_kind == "vocab"
    ids = np.arange(5000, dtype=np.int64) * 1000 + BIG.max // 2  # all == the same mod 1000
    rows = table.lookup(ids)
    assert table.size == ids.size
    assert np.unique(rows, axis=0).shape[0] == ids.size


def test_a_raw_manifest_column_gets_ids_tables_and_passes_the_range_checks(
    tmp_path: Path,
) -> None:
    """A column the manifest marks raw: default tables of index 'ids', its ids from the whole
    int64 range pass the preprocess check and preflight's id sample; ECRM takes them too."""
    data = write_raw_id_dataset(tmp_path, RawIdConfig(num_train=600, num_eval=100, num_ids=50))
    spec = JobSpec.model_validate(
        {"job_id": "raw", "train_data": str(data.train_dir), "plan": {"num_ps": 1}}
    )
    features = with_resolved_features(spec).resolved_features
    assert {t.name: t.index for t in features.tables} == {
        "user": "ids",
        "item": "vocab",
        "user_wide": "ids",
        "item_wide": "vocab",
    }
    reader = open_dataset(data.train_dir)
    batch = reader.read(0, 600)
    assert (batch.categorical[:, 0] < 0).any() and (batch.categorical[:, 0] >= 2**40).any()
    assert checked(unchanged, batch, reader.schema) is batch
    assert first_id_outside_vocab(reader, features, 256) is None
    ecrm = spec.model_copy(update={"checkpoint": CheckpointPolicyConfig(policy="ecrm")})
    assert with_resolved_features(ecrm).features == features


def test_a_manifest_raw_flag_must_be_a_bool(tmp_path: Path) -> None:
    manifest = {"num_dense": 0, "categorical": [{"name": "c", "vocab_size": 5, "raw": "yes"}]}
    with pytest.raises(ValueError, match=r"raw of c must be true or false, got 'yes'"):
        schema_from_manifest(manifest, tmp_path)


def test_a_vocab_table_dumps_as_before_and_an_ids_table_round_trips() -> None:
    """Without 'index' in a vocab table's dump, fingerprints of existing jobs are unchanged."""
    features = FeatureConfig.model_validate(_features())
    dumped = features.model_dump(mode="json")
    assert [("index" in t) for t in dumped["tables"]] == [True, False, True]
    assert FeatureConfig.model_validate(dumped) == features


def _raw_parquet(path: Path) -> tuple[np.ndarray, list[str]]:
    rng = np.random.default_rng(2)
    users = rng.integers(BIG.min, BIG.max, 200, dtype=np.int64)
    shops = [f"shop-{i}" for i in rng.integers(0, 10**9, 200)]
    table = pa.table(
        {"label": rng.random(200) < 0.3, "price": rng.random(200), "user": users, "shop": shops}
    )
    path.mkdir(parents=True)
    pq.write_table(table, path / "part-0.parquet")
    return users, shops


def test_raw_parquet_columns_reach_ids_tables_unfolded(tmp_path: Path) -> None:
    """Ints as they are, strings by their 64-bit hash, as the served model computes them;
    preflight builds the model on them. The same columns without raw are refused for an
    'ids' table that reads ints or strings."""
    users, shops = _raw_parquet(tmp_path / "data")
    schema = {
        "dense": [{"name": "price"}],
        "categorical": [
            {"name": "user", "raw": True, "buckets": 1000},
            {"name": "shop", "raw": True},
        ],
    }
    spec = JobSpec.model_validate(
        {"job_id": "raw-parquet", "train_data": str(tmp_path / "data"), "data_schema": schema}
    )
    features = preflight(spec)
    entries = {t.name: (t.index, t.values) for t in features.tables if t.dim != 1}
    assert entries == {"user": ("ids", "ints"), "shop": ("ids", "strings")}
    batch = open_split(spec, spec.train_data).read(0, 200)
    np.testing.assert_array_equal(batch.categorical[:, 0], users)
    np.testing.assert_array_equal(batch.categorical[:, 1], hash_strings(shops).view(np.int64))
    folded = {**schema, "categorical": [{"name": "user"}, {"name": "shop"}]}
    tables = [t.model_dump() for t in features.tables]
    with pytest.raises(PreflightError, match=r"index='ids' reads ints of column 'user'"):
        preflight(
            spec.model_copy(
                update={
                    "data_schema": DataSchema.model_validate(folded),
                    "features": FeatureConfig.model_validate({"num_dense": 1, "tables": tables}),
                }
            )
        )


def test_raw_list_columns_reach_ids_tables_unfolded(tmp_path: Path) -> None:
    """A list column with raw=true: each sample's ints as they are, strings by their 64-bit
    hash (a null list or value as the readers read it), its default tables of index 'ids';
    the batch's ids for the PS hold them unchanged, scalar and list columns of the table
    merged into one unique set."""
    rng = np.random.default_rng(5)
    clicks = [list(rng.integers(BIG.min, BIG.max, rng.integers(0, 4))) for _ in range(40)]
    clicks[3] = None
    tags = [[f"tag-{i}" for i in rng.integers(0, 10**9, rng.integers(0, 3))] for _ in range(40)]
    table = pa.table(
        {
            "label": rng.random(40) < 0.3,
            "price": rng.random(40),
            "clicks": pa.array(clicks, pa.list_(pa.int64())),
            "tags": pa.array(tags, pa.list_(pa.string())),
        }
    )
    (tmp_path / "data").mkdir()
    pq.write_table(table, tmp_path / "data" / "part-0.parquet")
    schema = {
        "dense": [{"name": "price"}],
        "categorical": [
            {"name": "clicks", "raw": True, "combiner": "mean"},
            {"name": "tags", "raw": True},
        ],
    }
    spec = JobSpec.model_validate(
        {"job_id": "raw-lists", "train_data": str(tmp_path / "data"), "data_schema": schema}
    )
    features = preflight(spec)
    entries = {t.name: (t.index, t.values, t.pooling) for t in features.tables if t.dim != 1}
    assert entries == {"clicks": ("ids", "ints", "mean"), "tags": ("ids", "strings", "sum")}
    batch = open_split(spec, spec.train_data).read(0, 40)
    got_clicks, got_tags = batch.lists
    np.testing.assert_array_equal(
        got_clicks.values, np.array([v for c in clicks for v in (c or [])], dtype=np.int64)
    )
    assert np.diff(got_clicks.row_splits).tolist() == [len(c or []) for c in clicks]
    flat_tags = [t for row in tags for t in row]
    np.testing.assert_array_equal(got_tags.values, hash_strings(flat_tags).view(np.int64))
    encoder = ElementEncoder(features, [], ["clicks", "tags"])
    ids = encoder.batch_ids(batch.categorical, batch.lists)
    np.testing.assert_array_equal(ids.unique["ids_clicks"], np.unique(got_clicks.values))
    np.testing.assert_array_equal(ids.unique["ids_tags"], np.unique(got_tags.values))
    looked_up = ids.unique["ids_clicks"][ids.list_ids["clicks"]]
    np.testing.assert_array_equal(looked_up, got_clicks.values)
