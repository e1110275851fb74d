"""The autoscaler's prior from the history: what a job's autoscaler measured itself (scaling
costs, hot share) lands in the history store and comes back, with the pooled throughput samples
of the similar jobs, as the next similar job's ``autoscale.prior``; the spec carries it (strict,
round-trips, errors naming ``autoscale.prior.<field>``) and the operator's templated
``autoscale`` reads an XCom's prior. The master starting from it: ``test_master_api.py``."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException
from pydantic import ValidationError
from sqlalchemy import inspect, select, text

from airflow_rover.core.autoscale_prior import Prior, job_shape, measured_costs
from airflow_rover.core.optimizer import ScalingCosts
from airflow_rover.core.prior_config import COEFFICIENTS as COEFFICIENT_NAMES
from airflow_rover.core.prior_config import AutoscalePrior
from airflow_rover.core.spec import (
    AutoscaleConfig,
    FeatureConfig,
    JobSpec,
    ResourcePlan,
    TableConfig,
    TrainingConfig,
    describe_errors,
)
from airflow_rover.core.throughput import Coefficients, ThroughputModel
from airflow_rover.core.warm_start import JobTraits
from airflow_rover.history.records import MEASURED, record_from_status
from airflow_rover.history.store import HistoryStore, jobs
from airflow_rover.master.autoscaler import Autoscaler, NodeSample, Profiler
from airflow_rover.operators.training import ElasticTrainingOperator
from airflow_rover.operators.warm_start import WarmStartOperator

FEATURES = FeatureConfig(
    num_dense=13, tables=(TableConfig(name="a", column="C1", vocab_size=100, dim=8),)
)
QUERY = JobTraits.of("wide_deep", FEATURES, 100_000, "daily", "train")
SHAPE = job_shape(batch_size=256, embedding_dim=16)
HOT = 0.3
# The jobs' true iteration times: PS-bound, with a hot PS that keeps 30% of the PS load.
COEFFICIENTS = Coefficients(grad=1.0, upd=6.0, sync=0.1, emb=3.0, bias=0.5)
TRUE_SHAPE = replace(SHAPE, hot_share=HOT)
TRUE = ThroughputModel(COEFFICIENTS, TRUE_SHAPE)
RAN = (ResourcePlan(num_workers=2, num_ps=2), ResourcePlan(num_workers=4, num_ps=2))
LATER = (ResourcePlan(num_workers=4, num_ps=3), ResourcePlan(num_workers=6, num_ps=4))


def two_ps(hot_share: float) -> dict[str, NodeSample]:
    """Two PS whose CPU says one keeps ``hot_share`` of the load however many there are."""
    hot = (hot_share + (1 - hot_share) / 2) * 2.0
    return {"ps-0": NodeSample("ps", cpu_used=hot), "ps-1": NodeSample("ps", cpu_used=2.0 - hot)}


def profile_of_a_run(worker_start_s: float, reload_s: float, plans: tuple[ResourcePlan, ...]):
    """The status profile of a job whose real ``Autoscaler`` timed one worker start and one PS
    reload, saw its two PS's CPU and sampled the true iteration times under ``plans``."""
    config = AutoscaleConfig(sampling_s=0, min_plan_interval_s=0, enabled=True)
    scaler = Autoscaler(config, SHAPE, start=plans[0], now=0.0)
    scaler.applied(0.0)  # a plan applied at t=0 ...
    scaler.plan_changed(worker_start_s)  # ... its workers all run from here: timed
    for n, plan in enumerate(plans * 3):
        seconds = TRUE.iteration_time(plan)
        scaler.record(worker_start_s + n, plan, TRUE.throughput(plan), [1000 * seconds])
    scaler.ps_resized(reload_s)
    scaler.propose(worker_start_s + 10, plans[-1], two_ps(HOT), {}, 1e6)  # learns the share
    return scaler.report(Profiler(lambda _node: None))


def record(store: HistoryStore, job_id: str, profile: dict[str, Any], at: float) -> None:
    final = ResourcePlan(num_workers=4, num_ps=2)
    status = {
        "job_id": job_id,
        "state": "succeeded",
        "progress": {"samples_done": 100_000, "samples_total": 100_000},
        "plan": final.model_dump(),
        "nodes": [],
        "finished_at": at,
        "result": {"plan": final.model_dump()},
        "profile": profile,
    }
    spec = JobSpec(
        job_id=job_id,
        train_data="/d",
        features=FEATURES,
        plan=final,
        training=TrainingConfig(epochs=1, batch_size=256),
    )
    store.record_job(
        record_from_status(status, spec, features=FEATURES, dag_id="daily", task_id="train")
    )


def test_what_a_job_measured_comes_back_as_the_next_similar_jobs_prior(tmp_path: Path) -> None:
    """Two past jobs timed their changes (12 s and 30 s worker starts, 40 s and 60 s PS
    reloads) and ran 2 PS with a hot one: the next similar job's prior is the medians of what
    they measured and coefficients that predict their iteration times at that hot share."""
    with HistoryStore(f"sqlite:///{tmp_path / 'h.db'}") as store:
        record(store, "run-1", profile_of_a_run(12.0, 40.0, RAN), 1.0)
        record(store, "run-2", profile_of_a_run(30.0, 60.0, LATER), 2.0)
        row = store.get_job("run-1")
        decision = store.warm_start(QUERY, ResourcePlan(), k=2, shape=SHAPE)
    assert row is not None
    assert {name: row[name] for name in MEASURED} == {
        "worker_start_s": 12.0,
        "ps_start_s": 12.0,
        "ps_reload_s": 40.0,
        "hot_share": HOT,
    }
    prior = decision.prior
    assert prior is not None and decision.source == "history"
    assert set(prior.jobs) == {"run-1", "run-2"}
    assert (prior.worker_start_s, prior.ps_start_s, prior.ps_reload_s) == (21.0, 21.0, 50.0)
    assert prior.hot_share == pytest.approx(HOT)
    fitted = Prior.from_config(prior).coefficients
    assert fitted is not None
    model = ThroughputModel(fitted, TRUE_SHAPE)
    errors = [abs(model.iteration_time(p) / TRUE.iteration_time(p) - 1) for p in RAN + LATER]
    print(f"prior's relative errors on the four plans the history ran: {errors}")
    assert max(errors) < 0.05  # fitted at no hot share instead: 36% to 38% off
    xcom = decision.to_xcom()
    assert json.loads(json.dumps(xcom)) == xcom
    assert AutoscalePrior.model_validate(xcom["prior"]) == prior


def test_what_a_job_only_assumed_is_not_recorded_as_measured(tmp_path: Path) -> None:
    """A job with one PS that never changed its plan measured nothing: its status still shows
    the costs it planned with (its prior's), but the history keeps NULL, and a history of
    such jobs gives no costs and no hot share (a prior without samples either: none)."""
    warm = Prior(hot_share=0.2, costs=ScalingCosts(5.0, 6.0, 7.0), jobs=("older",))
    scaler = Autoscaler(AutoscaleConfig(), SHAPE, start=ResourcePlan(), now=0.0, prior=warm)
    profile = scaler.report(Profiler(lambda _node: None))
    assert profile["scaling_costs"] == {
        "worker_start_s": 5.0,
        "ps_start_s": 6.0,
        "ps_reload_s": 7.0,
    }
    assert profile["measured"] == {}
    with HistoryStore(f"sqlite:///{tmp_path / 'h.db'}") as store:
        record(store, "quiet", profile, 1.0)
        row = store.get_job("quiet")
        decision = store.warm_start(QUERY, ResourcePlan(), k=2, shape=SHAPE)
    assert row is not None and all(row[name] is None for name in MEASURED)
    assert decision.source == "history" and decision.prior is None
    assert decision.to_xcom()["prior"] is None


def test_a_cost_no_similar_job_timed_stays_out_of_the_prior(tmp_path: Path) -> None:
    """Jobs that timed worker starts but never resized a PS: the prior carries their worker
    start and leaves the PS reload out (the XCom and the spec show no made-up figure); the
    autoscaler plans the reload with its default."""
    with HistoryStore(f"sqlite:///{tmp_path / 'h.db'}") as store:
        record(store, "workers-only", {"measured": {"worker_start_s": 8.0, "ps_start_s": 8.0}}, 1)
        decision = store.warm_start(QUERY, ResourcePlan(), k=2, shape=SHAPE)
    prior = decision.prior
    assert prior is not None and prior.jobs == ("workers-only",)
    assert (prior.worker_start_s, prior.ps_start_s, prior.ps_reload_s) == (8.0, 8.0, None)
    assert prior.grad is None and prior.hot_share == 0.0  # no samples, one PS: nothing else
    costs = Prior.from_config(prior).costs
    assert costs == ScalingCosts(worker_start_s=8.0, ps_start_s=8.0)  # reload: the default


def test_a_store_made_before_the_measured_columns_gets_them(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with HistoryStore(url) as store:
        record(store, "before", {}, 1.0)
        with store.engine.begin() as conn:
            for name in MEASURED:
                conn.execute(text(f"ALTER TABLE rover_jobs DROP COLUMN {name}"))
    with HistoryStore(url) as store:
        record(store, "after", profile_of_a_run(10.0, 20.0, RAN), 2.0)
        columns = {c["name"] for c in inspect(store.engine).get_columns("rover_jobs")}
        with store.engine.connect() as conn:
            rows = dict(conn.execute(select(jobs.c.job_id, jobs.c.ps_reload_s)).all())
    assert set(MEASURED) <= columns
    assert rows == {"before": None, "after": 20.0}


# -- the spec --------------------------------------------------------------------------------
PRIOR = AutoscalePrior(
    grad=1.0,
    upd=6.0,
    sync=0.1,
    emb=3.0,
    bias=0.5,
    hot_share=0.3,
    worker_start_s=21.0,
    ps_reload_s=50.0,
    jobs=("run-1", "run-2"),
)


def test_the_spec_round_trips_the_prior_and_the_autoscaler_gets_it() -> None:
    spec = JobSpec(job_id="j", train_data="/d", autoscale=AutoscaleConfig(prior=PRIOR))
    again = JobSpec.model_validate_json(spec.model_dump_json())
    assert again == spec and again.autoscale.prior == PRIOR
    prior = Prior.from_config(PRIOR)
    assert prior.coefficients == Coefficients(1.0, 6.0, 0.1, 3.0, 0.5)
    assert prior.costs == ScalingCosts(worker_start_s=21.0, ps_reload_s=50.0)  # PS start: default
    assert prior.to_config() == PRIOR.model_copy(update={"ps_start_s": ScalingCosts().ps_start_s})
    assert Prior.from_config(None) == Prior() and not Prior().warm


@pytest.mark.parametrize(
    ("prior", "field"),
    [
        ({"hot_share": 1.5}, "autoscale.prior.hot_share"),
        ({"hot_share": "nan"}, "autoscale.prior.hot_share"),
        ({"worker_start_s": -1}, "autoscale.prior.worker_start_s"),
        ({"ps_reload_s": "inf"}, "autoscale.prior.ps_reload_s"),
        ({**dict.fromkeys(COEFFICIENT_NAMES, 1.0), "bias": -0.1}, "autoscale.prior.bias"),
        ({"grad": 1.0}, "autoscale.prior: coefficients ['grad'] without"),
        ({"speed": 2}, "autoscale.prior.speed"),
        ({"jobs": [""]}, "autoscale.prior.jobs.0"),
    ],
)
def test_a_bad_prior_is_refused_naming_its_field(prior: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate({"job_id": "j", "train_data": "/d", "autoscale": {"prior": prior}})
    message = describe_errors(info.value, JobSpec)
    print(message)
    assert field in message


@pytest.mark.parametrize(
    ("extra", "where", "accepted"),
    [
        ({"bogus": 1}, "bogus", "job_id, train_data"),
        ({"autoscale": {"bogus": 1}}, "autoscale.bogus", "enabled, interval_s"),
        ({"autoscale": {"prior": {"speed": 2}}}, "autoscale.prior.speed", "grad, upd"),
        ({"plan": {"sizes": [{"node": "ps-0", "x": 2}]}}, "plan.sizes.0.x", "node, cpu, memory_mb"),
    ],
)
def test_an_unknown_key_is_named_with_the_keys_accepted_where_it_is(
    extra: dict[str, Any], where: str, accepted: str
) -> None:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate({"job_id": "j", "train_data": "/d", **extra})
    message = describe_errors(info.value, JobSpec)
    assert f"{where}: Extra inputs are not permitted (accepted: {accepted}" in message


# -- the operators ---------------------------------------------------------------------------
def test_an_xcom_prior_templated_into_autoscale_reaches_the_spec() -> None:
    """``autoscale={"prior": "{{ ti.xcom_pull('warm_start')['prior'] }}"}`` renders (without
    native rendering) to the text of a dict, or to ``None`` after a cold start."""
    template = {"prior": "{{ ti.xcom_pull('warm_start')['prior'] }}", "max_workers": 6}
    for pushed, expected in ((PRIOR.model_dump(mode="json"), PRIOR), (None, None)):
        with DAG(dag_id="daily", schedule=None, start_date=datetime(2026, 1, 1)):
            operator = ElasticTrainingOperator(task_id="train", train_data="/d", autoscale=template)
        ti = SimpleNamespace(
            dag_id="daily",
            task_id="train",
            run_id="manual__1",
            map_index=-1,
            xcom_pull=lambda task_id, pushed=pushed: {"prior": pushed},
        )
        context: Any = {"ti": ti, "params": {}}
        operator.render_template_fields(context)
        assert isinstance(operator.autoscale["prior"], str)  # as Airflow rendered it
        spec = operator.build_spec(context)
        assert spec.autoscale.prior == expected and spec.autoscale.max_workers == 6
        assert operator.rendered_autoscale().prior == expected
    operator.autoscale = {"prior": "{'hot_share': 2}"}
    with pytest.raises(AirflowFailException, match=r"autoscale\.prior\.hot_share"):
        operator.rendered_autoscale()


def test_the_warm_start_operator_refuses_a_bad_batch_size() -> None:
    with (
        DAG(dag_id="daily", schedule=None, start_date=datetime(2026, 1, 1)),
        pytest.raises(ValueError, match="batch_size=0: accepted: an integer >= 1"),
    ):
        WarmStartOperator(task_id="warm_start", batch_size=0)


def test_medians_per_cost_count_only_the_jobs_that_timed_it() -> None:
    costs = measured_costs(
        [
            {"worker_start_s": 10.0, "ps_start_s": 10.0, "ps_reload_s": None},
            {"worker_start_s": 30.0, "ps_start_s": 30.0, "ps_reload_s": 80.0},
            ScalingCosts(worker_start_s=50.0, ps_start_s=50.0, ps_reload_s=40.0),
        ]
    )
    assert costs == ScalingCosts(worker_start_s=30.0, ps_start_s=30.0, ps_reload_s=60.0)
    assert measured_costs([{"worker_start_s": None}]) is None


def test_the_warm_start_operators_xcom_carries_a_prior_fitted_for_its_batch_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``WarmStartOperator`` knows no spec: its prior's model is fitted for the
    ``batch_size`` and ``embedding_dim`` it is given (the training task's)."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    with HistoryStore(f"sqlite:///{tmp_path / 'rover' / 'history.db'}") as store:
        record(store, "run-1", profile_of_a_run(12.0, 40.0, RAN), 1.0)
    ti = SimpleNamespace(dag_id="daily", task_id="warm_start", run_id="r", map_index=-1)
    context: Any = {"ti": ti}
    priors = {}
    for batch_size in (256, 1024):
        with DAG(dag_id="daily", schedule=None, start_date=datetime(2026, 1, 1)):
            operator = WarmStartOperator(
                task_id="warm_start", features=FEATURES, for_task_id="train", batch_size=batch_size
            )
        xcom = operator.execute(context)
        assert xcom["source"] == "history" and xcom["prior"]["jobs"] == ["run-1"]
        priors[batch_size] = Prior.from_config(AutoscalePrior.model_validate(xcom["prior"]))
    fitted = priors[256].coefficients
    assert fitted is not None and priors[1024].coefficients is not None
    plan = RAN[0]  # the batch size it ran with: its own iteration time
    model = ThroughputModel(fitted, TRUE_SHAPE)
    assert model.iteration_time(plan) == pytest.approx(TRUE.iteration_time(plan), rel=0.05)
    assert priors[1024].coefficients.grad < fitted.grad  # the same seconds over 4x the batch
