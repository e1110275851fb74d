"""Continuing from a previous model (``init_from``): finding the last successful run in the
history store, a PS loading rows, dense weights and optimizer state of a model saved by another
PS count, eviction by last-seen day, and a retry preferring the job's own checkpoint."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from airflow.sdk import DAG
from moto_server import commit_checkpoint

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.hashing import owner_of, partition_of
from airflow_rover.core.incremental import InitSource, day_number
from airflow_rover.core.job_dir import JobDir, atomic_write_json
from airflow_rover.core.model_layout import layout_differences, layout_of
from airflow_rover.core.spec import FeatureConfig, JobSpec, TableConfig
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.data.fingerprint import training_fingerprint
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.history.records import JobRecord
from airflow_rover.hooks.history_store import HistoryStoreHook
from airflow_rover.master.resume import starting_point
from airflow_rover.operators import incremental
from airflow_rover.operators.training import ElasticTrainingOperator
from airflow_rover.ps.__main__ import restore
from airflow_rover.ps.initial import load_initial
from airflow_rover.ps.server import ParameterServer

FEATURES = FeatureConfig(
    num_dense=1, tables=(TableConfig(name="a", column="C1", vocab_size=5000, dim=8),)
)
LAYOUT = EmbeddingPlacement.from_features(FEATURES)
GROUP = LAYOUT.groups[0].name
SEED = 5


def new_ps(index: int, num_ps: int, day: int = -1) -> ParameterServer:
    ps = ParameterServer(index, num_ps, LAYOUT, Optimizer("adagrad", 0.1), SEED)
    for table in ps.tables.values():
        table.day = day
    return ps


def push(ps: ParameterServer, ids: np.ndarray, scale: float, key: int) -> None:
    """One keyed push of the rows among ``ids`` this PS owns, and of its dense variable."""
    mine = ids[partition_of(GROUP, ids, ps.num_ps) == ps.index]
    req = {"key": np.array([key]), f"ids/{GROUP}": mine}
    req[f"grad/{GROUP}"] = np.full((mine.size, 8), scale, dtype=np.float32)
    if owner_of("w", ps.num_ps) == ps.index:
        req["dgrad/w"] = np.full(6, scale, dtype=np.float32)
    ps.push(req)


def trained_model(folder: Path, num_ps: int, day: int = -1) -> list[ParameterServer]:
    """A model saved as a finished job saves one (``ps-<i>.npz`` of each PS, ``model.json``):
    rows 0..499 trained by ``num_ps`` PS, each row on its owner."""
    pss = [new_ps(i, num_ps, day) for i in range(num_ps)]
    ids = np.arange(500, dtype=np.int64)
    for ps in pss:
        if owner_of("w", num_ps) == ps.index:
            ps.init_dense({"dense/w": np.linspace(0, 1, 6, dtype=np.float32)})
        for key in range(3):
            push(ps, ids[key * 100 : key * 100 + 300], 0.01 * (key + 1), key)
        path = folder / f"ps-{ps.index}.npz"
        ps.save({"path": np.frombuffer(str(path).encode(), dtype=np.uint8)})
    card = {"model": "wide_deep", "features": FEATURES.model_dump(), "num_ps": num_ps}
    atomic_write_json(folder / "model.json", card)
    return pss


def rows_of(pss: list[ParameterServer]) -> dict[int, tuple[int, np.ndarray, np.ndarray]]:
    """id -> (the PS holding it, row, Adagrad accumulator); an id on two PS fails."""
    out: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}
    for ps in pss:
        snap = ps.tables[GROUP].snapshot()
        for i, row_id in enumerate(snap["ids"].tolist()):
            assert row_id not in out, f"id {row_id} on two PS"
            out[row_id] = (ps.index, snap["rows"][i], snap["state/accum"][i])
    return out


# -- finding the previous run ---------------------------------------------------------------
def record(job_id: str, run_id: str, outcome: str, finished_at: float, **kwargs: Any) -> JobRecord:
    plan = {"num_workers": 1, "num_ps": 1}
    fields: dict[str, Any] = {"dag_id": "daily", "task_id": "train", **kwargs}
    return JobRecord(
        job_id=job_id,
        model="wide_deep",
        outcome=outcome,
        initial_plan=plan,
        final_plan=plan,
        run_id=run_id,
        finished_at=finished_at,
        **fields,
    )


def test_previous_is_the_last_successful_run_of_the_task_other_than_this_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    hook = HistoryStoreHook()
    ti = SimpleNamespace(dag_id="daily", task_id="train", run_id="day3", map_index=None)
    assert incremental.resolve("previous", 7, hook, ti) is None  # no history: from scratch
    with hook.get_conn() as store:
        for rec in (
            record("j0", "day0", "succeeded", 50.0, result={"model_folder": "/m/0"}),
            record("j1", "day1", "succeeded", 100.0, result={"model_folder": "/m/1"}),
            record("j2", "day2", "failed", 200.0),
            record("jx", "day2", "succeeded", 300.0, task_id="other", result={"model_folder": "/"}),
            record("j3", "day3", "succeeded", 400.0, result={"model_folder": "/m/3"}),
        ):
            store.record_job(rec)
        before_day3 = store.last_success("daily", "train", -1, other_than_run="day3")
        newest = store.last_success("daily", "train", -1)
        assert (before_day3 or {}).get("job_id") == "j1"
        assert (newest or {}).get("job_id") == "j3"
        assert store.last_success("daily", "train", 2) is None  # another map index
    source = incremental.resolve("previous", 7, hook, ti)
    assert source is not None
    assert (source.location, source.evict_after_days) == ("/m/1", 7)
    assert "run 'day1' of daily.train (job j1)" in source.origin
    with hook.get_conn() as store:  # a run recorded without its model: said, not guessed
        store.record_job(record("j4", "day4", "succeeded", 500.0))
    with pytest.raises(incremental.NoModelToStartFrom, match=r"run 'day4'.*no model folder"):
        incremental.resolve("previous", None, hook, ti)


# -- loading a previous model into a PS -----------------------------------------------------
@pytest.mark.parametrize(("saved_by", "loaded_by"), [(2, 3), (3, 1), (2, 2)])
def test_a_ps_starts_from_the_rows_dense_weights_and_optimizer_state_of_a_model(
    tmp_path: Path, saved_by: int, loaded_by: int
) -> None:
    """Every row of the model lands once, on its owner at the new PS count, with its row and
    Adagrad state; the dense weight and its state on its new owner; no ledger carried over."""
    source = trained_model(tmp_path, saved_by)
    loaded = [new_ps(i, loaded_by) for i in range(loaded_by)]
    for ps in loaded:
        load_initial(ps, InitSource(location=str(tmp_path)), day=None)
    before, after = rows_of(source), rows_of(loaded)
    assert sorted(after) == sorted(before) == list(range(500))
    for row_id, (index, row, accum) in after.items():
        assert index == int(partition_of(GROUP, np.array([row_id]), loaded_by)[0])
        np.testing.assert_array_equal(row, before[row_id][1])
        np.testing.assert_array_equal(accum, before[row_id][2])
        assert not np.allclose(accum, 0.1)  # trained state, not a fresh accumulator
    old = source[owner_of("w", saved_by)].dense
    new = loaded[owner_of("w", loaded_by)].dense
    np.testing.assert_array_equal(new.values["w"], old.values["w"])
    np.testing.assert_array_equal(new.state["w"]["accum"], old.state["w"]["accum"])
    assert all(not ps.ledger.applied for ps in loaded)  # the model's batches are not this job's
    unseen = np.array([4000], dtype=np.int64)  # an id the model never had: a fresh row
    owner = loaded[int(partition_of(GROUP, unseen, loaded_by)[0])]
    fresh = new_ps(0, 1).tables[GROUP].lookup(unseen)
    np.testing.assert_array_equal(owner.tables[GROUP].lookup(unseen), fresh)


def test_rows_not_seen_for_n_days_are_evicted_at_load(tmp_path: Path) -> None:
    """Rows record the day they were last trained on; loading on day 20 with
    evict_after_days=5 drops those last seen before day 15, keeps the rest with their day."""
    ps = new_ps(0, 1, day=10)
    ps.tables[GROUP].lookup(np.arange(100, dtype=np.int64))  # seen on day 10
    ps.tables[GROUP].day = 18
    ps.tables[GROUP].lookup(np.arange(90, 200, dtype=np.int64))  # 90..199 seen on day 18
    path = tmp_path / "ps-0.npz"
    ps.save({"path": np.frombuffer(str(path).encode(), dtype=np.uint8)})
    kept = new_ps(0, 1, day=20)
    loaded = load_initial(kept, InitSource(location=str(tmp_path), evict_after_days=5), day=20)
    snap = kept.tables[GROUP].snapshot()
    assert (loaded.rows, loaded.evicted) == (110, 90)
    assert sorted(snap["ids"].tolist()) == list(range(90, 200))
    assert set(snap["seen"].tolist()) == {18}
    kept.tables[GROUP].lookup(np.array([95], dtype=np.int64))  # trained today: day 20
    assert kept.tables[GROUP].snapshot()["seen"][snap["ids"].tolist().index(95)] == 20
    everything = new_ps(0, 1, day=20)
    assert load_initial(everything, InitSource(location=str(tmp_path)), day=20).rows == 200


def test_rows_of_a_model_saved_without_days_count_as_seen_today(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    source = trained_model(tmp_path / "m", 1)
    arrays = source[0].snapshot()
    arrays = {k: v for k, v in arrays.items() if not k.endswith("/seen")}  # an older model
    (tmp_path / "old").mkdir()
    np.savez(tmp_path / "old" / "ps-0.npz", **arrays)  # type: ignore[arg-type]
    ps = new_ps(0, 1, day=30)
    loaded = load_initial(ps, InitSource(location=str(tmp_path / "old"), evict_after_days=0), 30)
    assert (loaded.rows, loaded.evicted) == (500, 0)
    assert set(ps.tables[GROUP].snapshot()["seen"].tolist()) == {30}


# -- a retry resumes its own checkpoint, never the source again -----------------------------
def test_a_restarting_ps_prefers_the_jobs_own_checkpoint_to_the_source(tmp_path: Path) -> None:
    """The job's first checkpoint holds the loaded rows and what it trained since: a retry
    (or a relaunched PS) restores that, and the source is loaded only without one."""
    trained_model(tmp_path / "yesterday", 1)
    source = InitSource(location=str(tmp_path / "yesterday"))
    own = new_ps(0, 1)
    load_initial(own, source, None)
    push(own, np.arange(0, 50, dtype=np.int64), 1.0, key=99)  # today's training
    job = JobDir(tmp_path / "job")
    commit_checkpoint(job, 1, 2, [own], job_id="job-1")

    def start(ps: ParameterServer) -> None:
        load_initial(ps, source, None)

    def fresh() -> ParameterServer:
        return new_ps(0, 1)

    retried = restore(fresh, job, "ps-0", 0, None, start)
    np.testing.assert_array_equal(
        retried.tables[GROUP].lookup(np.arange(50)), own.tables[GROUP].lookup(np.arange(50))
    )
    assert retried.ledger.applied == {99}
    first = restore(fresh, JobDir(tmp_path / "new-job"), "ps-0", 0, None, start)
    assert not first.ledger.applied
    yesterday = new_ps(0, 1)
    load_initial(yesterday, source, None)
    np.testing.assert_array_equal(
        first.tables[GROUP].lookup(np.arange(50)), yesterday.tables[GROUP].lookup(np.arange(50))
    )


def test_the_master_starts_from_its_own_checkpoint_before_the_source(tmp_path: Path) -> None:
    data = generate_dataset(tmp_path / "data", SyntheticConfig(num_train=500, num_eval=100))
    source = InitSource(location="/models/yesterday", origin="run 'day1'")
    spec = JobSpec(job_id="job-1", train_data=str(data.train_dir), features=FEATURES, init=source)
    job = JobDir(tmp_path / "job")
    assert starting_point(job, spec, None).started_from == (
        "init_from /models/yesterday (run 'day1')"
    )
    commit_checkpoint(job, 1, 2, [new_ps(0, 1)], job_id="job-1")
    start = starting_point(job, spec, None)
    assert start.started_from == f"checkpoint {job.checkpoint_dir(1)}"
    assert start.resumed_from == str(job.checkpoint_dir(1))


# -- the operator's side: options, layout, fingerprint --------------------------------------
def build(**kwargs: Any) -> ElasticTrainingOperator:
    with DAG(dag_id="incr_test", schedule=None, start_date=datetime(2026, 1, 1)):
        return ElasticTrainingOperator(task_id="train", train_data="/data/train", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"init_from": "yesterday"}, ["init_from='yesterday'", "'previous'", "absolute path"]),
        ({"init_from": 3}, ["init_from=3", "'previous'"]),
        ({"evict_after_days": -1}, ["evict_after_days=-1", ">= 0"]),
        ({"evict_after_days": 2.5}, ["evict_after_days=2.5", "whole number"]),
        ({"init_from": "previous", "checkpoint_policy": "ecrm"}, ["init_from", "ecrm", "full"]),
    ],
)
def test_bad_init_options_fail_at_parse_time(kwargs: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        build(**kwargs)
    assert "ElasticTrainingOperator(task_id='train')" in str(info.value)
    for word in words:
        assert word in str(info.value)


def test_init_options_are_templated() -> None:
    operator = build(init_from="{{ params.init }}", evict_after_days="{{ params.days }}")
    assert {"init_from", "evict_after_days"} <= set(operator.template_fields)
    assert build(init_from="previous", evict_after_days=30).init_from == "previous"
    assert build(init_from="file:///models/m").init_from == "file:///models/m"
    for none in (None, "", " None "):  # what a template choosing no source renders to
        assert incremental.rendered_source(none) is None
    assert incremental.rendered_days("t", "None") is None
    assert incremental.rendered_days("t", " 30") == 30
    with pytest.raises(ValueError, match="evict_after_days='soon'"):
        incremental.rendered_days("t", "soon")


def test_an_incompatible_source_is_refused_naming_what_differs(tmp_path: Path) -> None:
    trained_model(tmp_path, 1)
    other = FeatureConfig(
        num_dense=2,
        tables=(
            TableConfig(name="a", column="C1", vocab_size=5000, dim=16),
            TableConfig(name="b", column="C2", vocab_size=10, dim=8),
        ),
    )
    spec = JobSpec(job_id="job-2", train_data="/data", model="deepfm", features=other)
    source = InitSource(location=str(tmp_path), origin="run 'day1'")
    with pytest.raises(incremental.NoModelToStartFrom) as info:
        incremental.check_compatible(source, spec, other)
    message = str(info.value)
    for words in (
        "model 'wide_deep' (source) != 'deepfm'",
        "num_dense 1 (source) != 2",
        "table 'a': dim 8 (source) != 16",
        "table 'b' is in this job, not in the source",
        "init_from=None",
    ):
        assert words in message
    same = JobSpec(job_id="job-2", train_data="/data", features=FEATURES)
    incremental.check_compatible(source, same, FEATURES)  # the same layout passes
    with pytest.raises(incremental.NoModelToStartFrom, match="does not exist"):
        incremental.check_compatible(InitSource(location="/nope"), same, FEATURES)


def test_a_table_moved_inside_its_group_is_a_difference() -> None:
    first = TableConfig(name="a", column="C1", vocab_size=100, dim=8)
    second = TableConfig(name="b", column="C2", vocab_size=50, dim=8)
    old = layout_of("wide_deep", FeatureConfig(num_dense=1, tables=(first, second)))
    new = layout_of("wide_deep", FeatureConfig(num_dense=1, tables=(second, first)))
    assert layout_differences(old, new) == [
        "table 'a': rows at dim8+0 in the source, dim8+50 here",
        "table 'b': rows at dim8+100 in the source, dim8+0 here",
    ]


def test_the_fingerprint_covers_the_model_started_from(tmp_path: Path) -> None:
    data = generate_dataset(tmp_path / "data", SyntheticConfig(num_train=300, num_eval=100))
    plain = JobSpec(job_id="j", train_data=str(data.train_dir))
    day1 = plain.model_copy(update={"init": InitSource(location="/m/day1")})
    day1_again = plain.model_copy(update={"init": InitSource(location="/m/day1"), "day": 5})
    day0 = plain.model_copy(update={"init": InitSource(location="/m/day0")})
    evicting = plain.model_copy(update={"init": InitSource(location="/m/day1", evict_after_days=3)})
    prints = [training_fingerprint(s) for s in (plain, day1, day0, evicting)]
    assert len(set(prints)) == 4
    assert training_fingerprint(day1_again) == prints[1]


def test_the_job_day_is_the_runs_data_interval() -> None:
    start = datetime.fromisoformat("2026-03-02T00:00:00+00:00")
    assert incremental.job_day({"data_interval_start": start}) == day_number(start)
    assert day_number(start) == 20514
