"""Warm start (DLRover-RM Algorithm 1): similarity, top-k, exponential smoothing from the least
to the most similar job, rounding to a valid plan, cold start without history; and the Airflow
face: ``WarmStartOperator`` and ``ElasticTrainingOperator(warm_start=True)``."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException

from airflow_rover.core.optimizer import PlanBounds
from airflow_rover.core.spec import FeatureConfig, JobSpec, ResourcePlan, TableConfig
from airflow_rover.core.throughput import Coefficients, JobShape, ThroughputModel, features
from airflow_rover.core.warm_start import (
    WEIGHTS,
    JobTraits,
    PastJob,
    Refinement,
    WarmStart,
    refine,
    similarity,
    similarity_parts,
    smooth,
    to_plan,
    top_k_similar,
    warm_start,
)
from airflow_rover.data.features import resolve_features
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.history.records import record_from_status
from airflow_rover.history.store import HistoryStore
from airflow_rover.operators.training import ElasticTrainingOperator
from airflow_rover.operators.warm_start import WarmStartOperator, spec_traits

FEATURES = FeatureConfig(
    num_dense=13,
    tables=(
        TableConfig(name="a", column="C1", vocab_size=100, dim=8),
        TableConfig(name="b", column="C2", vocab_size=200, dim=8),
    ),
)
SMALLER = FeatureConfig(num_dense=13, tables=(FEATURES.tables[0],))
QUERY = JobTraits.of("wide_deep", FEATURES, 100_000, "daily", "train")

# Final plans of the hand-made history (num_workers, num_ps, worker_cpu, worker_memory_mb,
# ps_cpu, ps_memory_mb).
PLAN_A = ResourcePlan(
    num_workers=4, num_ps=2, worker_cpu=2.0, worker_memory_mb=4096, ps_cpu=4.0, ps_memory_mb=8192
)
PLAN_B = ResourcePlan(
    num_workers=2, num_ps=1, worker_cpu=1.0, worker_memory_mb=2048, ps_cpu=2.0, ps_memory_mb=4096
)
PLAN_C = ResourcePlan(
    num_workers=8, num_ps=4, worker_cpu=4.0, worker_memory_mb=8192, ps_cpu=8.0, ps_memory_mb=16384
)
PLAN_D = ResourcePlan(num_workers=64, num_ps=32, worker_cpu=16.0, ps_cpu=16.0)

# job id -> (traits, final plan, finished_at); similarity to QUERY, by hand:
#   a: same model, features, size, dag and task              -> 0.4 + 0.3 + 0.2 + 0.1      = 1.0
#   b: same model and features, half the data, other task     -> 0.4 + 0.3 + 0.2*0.5 + 0.1*0.5
#                                                                                          = 0.85
#   c: same model, one of the two tables (Jaccard 2/3, embedding params 800/2400 = 1/3:
#      features 0.5*2/3 + 0.5*1/3 = 0.5), twice the data, other dag
#                                                             -> 0.4 + 0.3*0.5 + 0.2*0.5   = 0.65
#   d: another model, unknown features, same size, other dag  -> 0.2 (below 0.5: ignored)
HISTORY = {
    "job-a": (JobTraits.of("wide_deep", FEATURES, 100_000, "daily", "train"), PLAN_A, 30.0),
    "job-b": (JobTraits.of("wide_deep", FEATURES, 50_000, "daily", "train_b"), PLAN_B, 20.0),
    "job-c": (JobTraits.of("wide_deep", SMALLER, 200_000, "other", "train"), PLAN_C, 10.0),
    "job-d": (JobTraits.of("deepfm", None, 100_000, "elsewhere", "fit"), PLAN_D, 40.0),
}
SCORES = {"job-a": 1.0, "job-b": 0.85, "job-c": 0.65, "job-d": 0.2}

# Algorithm 1 by hand, mu = 0.5, ranked least to most similar: C, B, A.
#   A_bar0 = C                     = (8,   4,    4.0,  8192, 8.0, 16384)
#   A_bar1 = 0.5*B + 0.5*A_bar0    = (5,   2.5,  2.5,  5120, 5.0, 10240)
#   A_bar2 = 0.5*A + 0.5*A_bar1    = (4.5, 2.25, 2.25, 4608, 4.5,  9216)
# rounded (counts half up, CPUs to tenths half up):
SMOOTHED_BY_HAND = ResourcePlan(
    num_workers=5, num_ps=2, worker_cpu=2.3, worker_memory_mb=4608, ps_cpu=4.5, ps_memory_mb=9216
)
# k = 2, mu = 0.8 (B then A): 0.8*A + 0.2*B = (3.6, 1.8, 1.8, 3686.4, 3.6, 7372.8)
SMOOTHED_K2_MU08 = ResourcePlan(
    num_workers=4, num_ps=2, worker_cpu=1.8, worker_memory_mb=3686, ps_cpu=3.6, ps_memory_mb=7373
)


def past_jobs() -> list[PastJob]:
    return [
        PastJob(job_id, traits, plan.model_dump(), finished_at)
        for job_id, (traits, plan, finished_at) in HISTORY.items()
    ]


# -- similarity ------------------------------------------------------------------------------
def test_weights_order_model_then_features_then_size_then_owner() -> None:
    assert sum(WEIGHTS.values()) == pytest.approx(1.0)
    assert WEIGHTS["model"] > WEIGHTS["features"] > WEIGHTS["dataset"] > WEIGHTS["owner"]


@pytest.mark.parametrize("job_id", sorted(SCORES))
def test_similarity_matches_the_hand_computed_scores(job_id: str) -> None:
    assert similarity(QUERY, HISTORY[job_id][0]) == pytest.approx(SCORES[job_id])


def test_similarity_parts_are_each_in_unit_range_and_symmetric() -> None:
    for traits, _, _ in HISTORY.values():
        parts = similarity_parts(QUERY, traits)
        assert set(parts) == set(WEIGHTS)
        assert all(0.0 <= v <= 1.0 for v in parts.values())
        assert similarity(QUERY, traits) == pytest.approx(similarity(traits, QUERY))
    assert similarity_parts(QUERY, HISTORY["job-c"][0])["features"] == pytest.approx(0.5)


def test_unknown_traits_score_zero_not_an_error() -> None:
    unknown = JobTraits(model="wide_deep")
    assert similarity_parts(QUERY, unknown) == {
        "model": 1.0,
        "features": 0.0,
        "dataset": 0.0,
        "owner": 0.0,
    }


def test_feature_signature_is_stable_and_order_free() -> None:
    reordered = FeatureConfig(num_dense=13, tables=tuple(reversed(FEATURES.tables)))
    assert JobTraits.of("m", FEATURES).feature_signature == (
        JobTraits.of("m", reordered).feature_signature
    )
    assert JobTraits.of("m", FEATURES).feature_signature != (
        JobTraits.of("m", SMALLER).feature_signature
    )
    assert JobTraits.of("m").feature_signature is None


def test_top_k_is_most_similar_first_above_the_floor() -> None:
    matches = top_k_similar(QUERY, past_jobs(), k=5, min_similarity=0.5)
    assert [m.job.job_id for m in matches] == ["job-a", "job-b", "job-c"]
    assert [m.score for m in matches] == pytest.approx([1.0, 0.85, 0.65])
    assert [m.job.job_id for m in top_k_similar(QUERY, past_jobs(), k=2)] == ["job-a", "job-b"]
    assert len(top_k_similar(QUERY, past_jobs(), k=5, min_similarity=0.0)) == 4


def test_equal_scores_go_to_the_most_recent_job() -> None:
    traits = HISTORY["job-a"][0]
    old, new = PastJob("old", traits, PLAN_B.model_dump(), 1.0), PastJob("new", traits, {}, 2.0)
    assert [m.job.job_id for m in top_k_similar(QUERY, [old, new], k=1)] == ["new"]


# -- smoothing -------------------------------------------------------------------------------
def test_smooth_is_algorithm_1() -> None:
    """A_bar0 = A0; A_bar_i = mu*A_i + (1-mu)*A_bar_{i-1}: the last config weighs most."""
    configs = [{"x": 8.0}, {"x": 2.0}, {"x": 4.0}]
    assert smooth(configs, 0.5) == {"x": pytest.approx(0.5 * 4 + 0.5 * (0.5 * 2 + 0.5 * 8))}
    assert smooth(configs[:1], 0.3) == {"x": 8.0}
    assert smooth(configs, 1.0) == {"x": 4.0}
    with pytest.raises(ValueError, match="mu"):
        smooth(configs, 0.0)
    with pytest.raises(ValueError, match="no configuration"):
        smooth([], 0.5)


def test_warm_start_on_a_hand_made_history_returns_the_plan_computed_by_hand() -> None:
    decision = warm_start(QUERY, past_jobs(), ResourcePlan(), k=3, mu=0.5, min_similarity=0.5)
    assert decision.source == "history"
    assert decision.plan == SMOOTHED_BY_HAND
    assert [m.job.job_id for m in decision.matches] == ["job-a", "job-b", "job-c"]
    other = warm_start(QUERY, past_jobs(), k=2, mu=0.8)
    assert other.plan == SMOOTHED_K2_MU08


def test_the_plan_is_rounded_and_clamped_to_a_valid_resource_plan() -> None:
    plan = to_plan(
        {
            "num_workers": 0.2,
            "num_ps": 999.0,
            "worker_cpu": 0.01,
            "worker_memory_mb": 10.0,
            "ps_cpu": 1000.0,
            "ps_memory_mb": 2047.5,
        }
    )
    assert plan == ResourcePlan(
        num_workers=1,
        num_ps=256,
        worker_cpu=0.1,
        worker_memory_mb=256,
        ps_cpu=256.0,
        ps_memory_mb=2048,
    )
    fallback = ResourcePlan(num_workers=3)
    assert to_plan({"num_ps": 2.5}, fallback) == ResourcePlan(num_workers=3, num_ps=3)


def test_a_recorded_plan_with_missing_or_bad_fields_uses_the_cold_start_values() -> None:
    traits = HISTORY["job-a"][0]
    partial = PastJob("partial", traits, {"num_workers": 6, "ps_cpu": "lots"}, 1.0)
    decision = warm_start(QUERY, [partial], ResourcePlan(num_ps=3, ps_cpu=2.5))
    assert decision.plan == ResourcePlan(num_workers=6, num_ps=3, ps_cpu=2.5)


def test_without_similar_history_the_cold_start_plan_is_used_and_said() -> None:
    cold = ResourcePlan(num_workers=2, num_ps=2)
    for candidates in ([], [PastJob("job-d", HISTORY["job-d"][0], PLAN_D.model_dump())]):
        decision = warm_start(QUERY, candidates, cold)
        assert (decision.source, decision.plan, decision.matches) == ("cold_start", cold, ())
        assert "no similar job" in decision.message
    assert warm_start(QUERY, []).plan == ResourcePlan()
    disabled = warm_start(QUERY, past_jobs(), cold, k=0)
    assert disabled.source == "cold_start" and "k=0" in disabled.message


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [({"k": -1}, "k="), ({"mu": 0}, "mu="), ({"mu": 1.5}, "mu="), ({"min_similarity": 2}, "min_")],
)
def test_bad_settings_are_rejected(kwargs: dict[str, Any], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        warm_start(QUERY, [], **kwargs)


def test_the_xcom_is_plain_json_with_plan_source_and_matches() -> None:
    xcom = warm_start(QUERY, past_jobs(), k=3).to_xcom()
    assert json.loads(json.dumps(xcom)) == xcom
    assert xcom["plan"] == SMOOTHED_BY_HAND.model_dump()
    assert xcom["source"] == "history"
    assert [(m["job_id"], m["score"]) for m in xcom["matches"]] == [
        ("job-a", 1.0),
        ("job-b", 0.85),
        ("job-c", 0.65),
    ]


# -- the same through the history store ------------------------------------------------------
def status_of(job_id: str, plan: ResourcePlan, finished_at: float, samples: int) -> dict[str, Any]:
    """A master status as ``JobMaster.status()`` gives it at the end of a job."""
    return {
        "job_id": job_id,
        "state": "succeeded",
        "message": f"trained {samples} samples",
        "progress": {"samples_done": samples, "samples_total": samples},
        "plan": plan.model_dump(),
        "nodes": [],
        "started_at": finished_at - 5,
        "finished_at": finished_at,
        "duration_s": 5.0,
        "result": {"samples_trained": samples, "plan": plan.model_dump()},
    }


def record_history(store: HistoryStore) -> None:
    for job_id, (traits, plan, finished_at) in HISTORY.items():
        features = FEATURES if traits.tables == QUERY.tables else SMALLER
        spec = JobSpec(
            job_id=job_id,
            train_data="/data",
            model=traits.model,
            features=features if traits.tables else None,
            plan=plan,
        )
        status = status_of(job_id, plan, finished_at, traits.dataset_samples or 0)
        store.record_job(
            record_from_status(
                status,
                spec,
                features=features if traits.tables else None,
                dag_id=traits.dag_id,
                task_id=traits.task_id,
            )
        )
    # A failed job just like the query: never a warm-start source.
    failed = {**status_of("job-x", PLAN_D, 50.0, 100_000), "state": "failed"}
    spec = JobSpec(job_id="job-x", train_data="/data", features=FEATURES, plan=PLAN_D)
    store.record_job(
        record_from_status(failed, spec, features=FEATURES, dag_id="daily", task_id="train")
    )


def test_warm_start_from_a_recorded_history_returns_the_plan_computed_by_hand(
    tmp_path: Path,
) -> None:
    with HistoryStore(f"sqlite:///{tmp_path / 'h.db'}") as store:
        record_history(store)
        decision = store.warm_start(QUERY, ResourcePlan(), k=3, mu=0.5)
        similar = store.similar_jobs(QUERY, k=10, min_similarity=0.0)
    assert decision.plan == SMOOTHED_BY_HAND
    assert [m.job.job_id for m in decision.matches] == ["job-a", "job-b", "job-c"]
    assert "job-x" not in {m.job.job_id for m in similar}  # failed jobs are not used


# -- WarmStartOperator -----------------------------------------------------------------------
def build(**kwargs: Any) -> WarmStartOperator:
    with DAG(dag_id="daily", schedule=None, start_date=datetime(2026, 1, 1)):
        return WarmStartOperator(task_id="warm_start", **kwargs)


def context() -> Any:
    ti = SimpleNamespace(dag_id="daily", task_id="warm_start", run_id="manual__1", map_index=-1)
    return {"ti": ti}


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"k": -1}, "k=-1"),
        ({"mu": 0}, "mu=0"),
        ({"min_similarity": 1.5}, "min_similarity=1.5"),
        ({"cold_start_plan": {"num_workers": 0}}, "cold_start_plan"),
        ({"cold_start_plan": {"num_gpus": 1}}, "num_gpus"),
        ({"features": {"num_dense": 1, "tables": []}}, "features"),
    ],
)
def test_bad_warm_start_parameters_fail_at_parse_time(
    kwargs: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ValueError) as info:
        build(**kwargs)
    assert "WarmStartOperator(task_id='warm_start')" in str(info.value)
    assert expected in str(info.value)


def test_templated_warm_start_settings_wait_for_rendering() -> None:
    operator = build(
        k="{{ params.k }}",
        cold_start_plan={"num_workers": "{{ params.n }}", "num_ps": 2},
        history_conn_id="{{ params.conn }}",
    )
    assert operator.k == "{{ params.k }}"
    assert {"k", "mu", "cold_start_plan", "history_conn_id"} <= set(operator.template_fields)
    operator.render_template_fields({"params": {"k": -3, "n": 2, "conn": ""}})
    assert operator.cold_start_plan == {"num_workers": "2", "num_ps": 2}
    with pytest.raises(AirflowFailException, match="k=-3"):  # retrying cannot fix it
        operator.execute(context())


def test_the_operator_cold_starts_then_warm_starts_from_the_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No history: the cold-start plan, said so. With the hand-made history in the default
    store ($AIRFLOW_HOME/rover/history.db): the plan computed by hand."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    operator = build(
        model="wide_deep",
        features=FEATURES,
        for_task_id="train",
        cold_start_plan={"num_workers": 3},
        k=3,
    )
    operator.train_data = None  # dataset size unknown here; the query's is set below
    first = operator.execute(context())
    assert first["source"] == "cold_start" and first["matches"] == []
    assert first["prior"] is None
    assert first["plan"] == ResourcePlan(num_workers=3).model_dump()
    assert "no similar job" in first["message"]

    with HistoryStore(f"sqlite:///{tmp_path / 'rover' / 'history.db'}") as store:
        record_history(store)
    monkeypatch.setattr(
        "airflow_rover.operators.warm_start.job_traits", lambda *args, **kwargs: QUERY
    )
    second = operator.execute(context())
    assert second["source"] == "history"
    assert second["plan"] == SMOOTHED_BY_HAND.model_dump()
    assert [m["job_id"] for m in second["matches"]] == ["job-a", "job-b", "job-c"]
    assert json.loads(json.dumps(second)) == second
    assert second["query"]["model"] == "wide_deep"


def test_an_unreadable_history_store_means_cold_start_not_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A history connection that cannot be opened: the task still answers, with the cold plan."""
    bad = tmp_path / "not-a-dir"
    bad.write_text("a file where a directory should be")
    url = f"sqlite:///{bad}/x/h.db"
    monkeypatch.setenv(
        "AIRFLOW_CONN_BROKEN_HISTORY",
        json.dumps({"conn_type": "rover_history", "extra": {"sqlalchemy_url": url}}),
    )
    operator = build(cold_start_plan={"num_ps": 2}, history_conn_id="broken_history")
    xcom = operator.execute(context())
    assert xcom["source"] == "cold_start"
    assert "history store unavailable" in xcom["message"]
    assert xcom["plan"] == ResourcePlan(num_ps=2).model_dump()


# -- ElasticTrainingOperator(warm_start=True) ------------------------------------------------
@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("ws-data")
    return generate_dataset(root, SyntheticConfig(num_train=2000, num_eval=500, seed=3))


def test_inline_warm_start_replaces_the_plan_and_says_so_in_xcom(
    dataset: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``warm_start=True``: the spec launched carries the smoothed plan of the past jobs like
    this one (same traits as its own history record would have) and, as ``autoscale.prior``,
    what their autoscalers measured and the model their samples fit; the decision goes to
    XCom."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    with DAG(dag_id="daily", schedule=None, start_date=datetime(2026, 1, 1)):
        operator = ElasticTrainingOperator(
            task_id="train",
            train_data=str(dataset.train_dir),
            output_dir=str(tmp_path / "job"),
            plan={"num_workers": 1, "num_ps": 1},
            warm_start=True,
        )
    pushed: dict[str, Any] = {}
    ti = SimpleNamespace(
        dag_id="daily",
        task_id="train",
        run_id="manual__2",
        map_index=-1,
        try_number=1,
        xcom_push=lambda key, value: pushed.__setitem__(key, value),
    )
    ctx: Any = {"ti": ti}
    launched: list[JobSpec] = []
    monkeypatch.setattr(
        "airflow_rover.hooks.elastic_job.ElasticJobHook.launch",
        lambda self, spec, env=None: launched.append(spec),
    )

    # no history: the given plan is the cold start
    operator.submit_job(ctx)
    assert launched[-1].plan == ResourcePlan(num_workers=1, num_ps=1)
    assert pushed["warm_start"]["source"] == "cold_start"
    assert pushed["warm_start"]["prior"] is None and launched[-1].autoscale.prior is None

    # one past run of the same task on the same data, which ended with 3 workers and 2 PS
    spec = launched[-1]
    final = ResourcePlan(num_workers=3, num_ps=2)
    status = status_of("past-run", final, 100.0, spec_traits(spec, "d", "t").dataset_samples or 0)
    status["profile"] = {
        "throughput": [
            {"at": 1.0, "plan": plan.model_dump(), "samples_per_second": 1.0, "step_time_ms": ms}
            for plan, ms in ((spec.plan, 40.0), (final, 25.0))
        ],
        "measured": {"worker_start_s": 14.0, "ps_start_s": 14.0, "ps_reload_s": 9.0},
    }
    past = record_from_status(
        status,
        spec.model_copy(update={"job_id": "past-run"}),
        features=resolve_features(spec),
        dag_id="daily",
        task_id="train",
    )
    assert past.traits == spec_traits(spec, "daily", "train")  # recorded as it is queried
    with HistoryStore(f"sqlite:///{tmp_path / 'rover' / 'history.db'}") as store:
        store.record_job(past)
    operator.submit_job(ctx)
    assert pushed["warm_start"]["source"] == "history"
    assert pushed["warm_start"]["matches"][0]["job_id"] == "past-run"
    assert pushed["warm_start"]["matches"][0]["score"] == pytest.approx(1.0)
    assert launched[-1].plan == final
    prior = launched[-1].autoscale.prior
    assert prior is not None and prior.jobs == ("past-run",)
    assert (prior.worker_start_s, prior.ps_reload_s, prior.hot_share) == (14.0, 9.0, 0.0)
    assert prior.grad is not None  # fitted on the two plans it ran
    assert pushed["warm_start"]["prior"] == prior.model_dump(mode="json")


# -- refine: the history's model moves the smoothed plan before the launch -------------------
TRUTH = ThroughputModel(
    Coefficients(grad=2.0, upd=40.0, sync=0.0, emb=2.0, bias=2.0),
    JobShape(batch_size=512, model_size=1.0, bandwidth=1000.0, embedding_dim=1),
)  # PS-bound: more PS pay off, more workers load the PS


def samples_at(*plans: ResourcePlan) -> list[tuple[ResourcePlan, float]]:
    return [(plan, TRUTH.iteration_time(plan)) for plan in plans for _ in range(3)]


def plan_of(workers: int, ps: int) -> ResourcePlan:
    return ResourcePlan(num_workers=workers, num_ps=ps, worker_cpu=4.0, ps_cpu=4.0)


REFINE = Refinement(
    TRUTH.shape,
    PlanBounds(max_workers=8, max_ps=8, worker_cpus=(4.0,), ps_cpus=(4.0,)),
    fits=lambda plan: (plan.num_workers + plan.num_ps) * 4.0 <= 40.0,
)


def decided(plan: ResourcePlan) -> WarmStart:
    return WarmStart(plan, "history", "smoothed", ())


def test_refine_moves_the_smoothed_plan_to_a_faster_one_within_the_budget() -> None:
    start = plan_of(4, 1)
    history = samples_at(plan_of(2, 1), plan_of(4, 1), plan_of(4, 2), plan_of(6, 3))
    refined = refine(decided(start), history, REFINE)
    assert refined.plan != start and REFINE.fits(refined.plan)
    assert TRUTH.throughput(refined.plan) >= 1.03 * TRUTH.throughput(start)
    assert "predicts" in refined.message and "12 throughput samples (4 plans)" in refined.message


def test_refine_leaves_the_plan_when_the_history_ran_one_plan_or_none() -> None:
    start = plan_of(4, 1)
    assert refine(decided(start), samples_at(start), REFINE).plan == start
    assert refine(decided(start), [], REFINE).plan == start
    cold = WarmStart(start, "cold_start", "no similar job", ())
    assert refine(cold, samples_at(plan_of(2, 1), plan_of(4, 2)), REFINE) is cold


def test_refine_keeps_a_plan_the_model_cannot_beat_by_the_margin() -> None:
    history = samples_at(plan_of(2, 1), plan_of(4, 2), plan_of(6, 3))
    best = refine(decided(plan_of(4, 1)), history, REFINE).plan
    assert refine(decided(best), history, REFINE).plan == best  # a fixed point


def test_the_history_store_refines_with_the_matched_jobs_throughput_samples(
    tmp_path: Path,
) -> None:
    with HistoryStore(f"sqlite:///{tmp_path / 'h.db'}") as store:
        for i, ran in enumerate(([plan_of(2, 1), plan_of(4, 1)], [plan_of(4, 2), plan_of(4, 1)])):
            job_id = f"job-{i}"
            status = status_of(job_id, ran[-1], 10.0 + i, 100_000)
            status["profile"] = {
                "throughput": [
                    {
                        "at": 1.0 + n,
                        "plan": plan.model_dump(),
                        "samples_per_second": TRUTH.throughput(plan),
                        "step_time_ms": 1000 * seconds,
                    }
                    for n, (plan, seconds) in enumerate(samples_at(*ran))
                ]
            }
            spec = JobSpec(job_id=job_id, train_data="/d", features=FEATURES, plan=ran[-1])
            store.record_job(
                record_from_status(status, spec, features=FEATURES, dag_id="daily", task_id="train")
            )
        assert len(store.observations(["job-0", "job-1"])) == 12
        smoothed = store.warm_start(QUERY, ResourcePlan(), k=2)
        refined = store.warm_start(QUERY, ResourcePlan(), k=2, refinement=REFINE)
    assert smoothed.plan == plan_of(4, 1)
    assert TRUTH.throughput(refined.plan) >= 1.03 * TRUTH.throughput(smoothed.plan)


def busy_of(plan: ResourcePlan) -> tuple[float, float]:
    """The share of an iteration TRUTH's workers compute and its busiest PS updates."""
    terms = features(plan, TRUTH.shape) * TRUTH.coefficients.as_array()
    seconds = TRUTH.iteration_time(plan)
    return float(terms[0] / seconds), float(terms[1] / seconds)


def test_one_plan_with_its_busy_shares_is_enough_to_refine(tmp_path: Path) -> None:
    """The history's only plan cannot tell the model's terms apart from its times alone; the
    busy shares its samples carry (a worker computing a tenth of an iteration, the PS
    updating most of it) can: the warm start moves to more PS. A throughput table made
    before the shares were kept gains their columns."""
    ran = plan_of(4, 1)
    worker, ps = busy_of(ran)
    assert ps > 0.5 > worker  # PS-bound
    decisions = {}
    for shares in (False, True):
        url = f"sqlite:///{tmp_path / f'h{int(shares)}.db'}"
        if shares:
            with HistoryStore(url) as store, store.engine.begin() as conn:
                conn.exec_driver_sql(  # rover_job_throughput as the previous version made it
                    "CREATE TABLE rover_job_throughput (job_id VARCHAR(200) NOT NULL, seq "
                    "INTEGER NOT NULL, at FLOAT, plan JSON, samples_per_second FLOAT, "
                    "step_time_ms FLOAT, PRIMARY KEY (job_id, seq))"
                )
        with HistoryStore(url) as store:
            status = status_of("job-0", ran, 10.0, 100_000)
            sample = {
                "plan": ran.model_dump(),
                "samples_per_second": TRUTH.throughput(ran),
                "step_time_ms": 1000 * TRUTH.iteration_time(ran),
            }
            if shares:
                sample |= {"worker_busy": worker, "ps_busy": ps}
            status["profile"] = {"throughput": [{"at": float(n), **sample} for n in range(3)]}
            spec = JobSpec(job_id="job-0", train_data="/d", features=FEATURES, plan=ran)
            store.record_job(
                record_from_status(status, spec, features=FEATURES, dag_id="d", task_id="t")
            )
            assert len(store.busy_shares(["job-0"])) == (3 if shares else 0)
            decisions[shares] = store.warm_start(QUERY, ResourcePlan(), k=1, refinement=REFINE)
    assert decisions[False].plan == ran  # one plan, times only: the smoothed plan as it is
    refined = decisions[True].plan
    assert refined.num_ps > ran.num_ps
    assert TRUTH.throughput(refined) >= 1.2 * TRUTH.throughput(ran)
