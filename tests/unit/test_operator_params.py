"""Operator and sensor parameters are checked when the DAG is parsed, with messages that say
which parameter is wrong and what it accepts; job ids and default paths are well-formed."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from airflow_rover.core.deadline import JobDeadline
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.spec import (
    AutoscaleConfig,
    JobSpec,
    RecoveryConfig,
    ResourcePlan,
    TrainingConfig,
)
from airflow_rover.data.fingerprint import training_fingerprint
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.history.launches import LaunchIndex
from airflow_rover.operators.job_identity import default_jobs_root, job_id_for
from airflow_rover.operators.training import ElasticTrainingOperator
from airflow_rover.sensors.elastic_job import ElasticJobSensor
from airflow_rover.triggers.elastic_job import ElasticJobTrigger

REPO = Path(__file__).resolve().parents[2]
DNS_SAFE = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
TABLE = {"name": "site", "column": "C1", "vocab_size": 100, "dim": 8}


def build(**kwargs: Any) -> ElasticTrainingOperator:
    """An operator built the way a DAG file builds it (inside a DAG context)."""
    kwargs.setdefault("train_data", "/data/train")
    with DAG(dag_id="params_test", schedule=None, start_date=datetime(2026, 1, 1)):
        return ElasticTrainingOperator(task_id="train", **kwargs)


def build_sensor(**kwargs: Any) -> ElasticJobSensor:
    """A sensor built inside a DAG context."""
    with DAG(dag_id="params_test", schedule=None, start_date=datetime(2026, 1, 1)):
        return ElasticJobSensor(task_id="wait", **kwargs)


# -- the training operator -------------------------------------------------------------------
BAD_OPERATOR_PARAMS: list[tuple[dict[str, Any], list[str]]] = [
    ({"plan": {"num_workers": 0}}, ["plan", "num_workers", "greater than or equal to 1"]),
    ({"plan": {"num_ps": "x"}}, ["plan", "num_ps", "valid integer"]),
    ({"plan": {"num_gpus": 2}}, ["plan", "num_gpus", "not permitted"]),
    ({"plan": "big"}, ["plan", "dict or ResourcePlan"]),
    ({"training": {"batch_size": 0}}, ["training", "batch_size", "greater than or equal to 1"]),
    ({"training": {"momentum": 0.9}}, ["training", "momentum", "not permitted"]),
    (
        {"recovery": {"max_node_restarts": -1}},
        ["recovery", "max_node_restarts", "greater than or equal to 0"],
    ),
    (
        {"recovery": {"checkpoint_interval_s": -5}},
        ["recovery", "checkpoint_interval_s", "greater than or equal to 0"],
    ),
    (
        {"recovery": {"max_shard_failures": 0}},
        ["recovery", "max_shard_failures", "greater than or equal to 1"],
    ),
    (
        {"recovery": {"max_master_restarts": "many"}},
        ["recovery", "max_master_restarts", "valid integer"],
    ),
    ({"recovery": {"max_retries": 3}}, ["recovery", "max_retries", "not permitted"]),
    ({"recovery": "forever"}, ["recovery", "dict or RecoveryConfig"]),
    ({"launcher": "yarn"}, ["launcher", "'yarn'", "accepted: ['local', 'kubernetes']"]),
    ({"model": "not a path"}, ["model", "'wide_deep'", "import path"]),
    ({"train_data": ""}, ["train_data", "non-empty path"]),
    ({"poll_interval": 0}, ["poll_interval", "> 0 seconds"]),
    ({"poll_interval": -1.5}, ["poll_interval", "> 0 seconds"]),
    ({"max_runtime": timedelta(minutes=-5)}, ["max_runtime", "positive timedelta"]),
    ({"max_runtime": 3600}, ["max_runtime", "positive timedelta"]),
    ({"warm_start": "yes"}, ["warm_start", "True or False"]),
    ({"autoscale": {"max_workers": 0}}, ["autoscale", "max_workers", "greater than or equal"]),
    ({"autoscale": {"weight": 0}}, ["autoscale", "weight", "greater than 0"]),
    ({"autoscale": {"max_replicas": 3}}, ["autoscale", "max_replicas", "accepted: enabled"]),
    ({"autoscale": "off"}, ["autoscale", "dict or AutoscaleConfig"]),
    (
        {"autoscale": {"min_workers": 3, "max_workers": 2}},
        ["autoscale.min_workers=3 is above autoscale.max_workers=2"],
    ),
    (
        {"autoscale": {"max_ps_cpu": 2.0}, "plan": {"ps_cpu": 4.0}},
        ["starting plan", "plan.ps_cpu=4 is above autoscale.max_ps_cpu=2"],
    ),
    (
        {"autoscale": {"min_workers": 2}},
        ["plan.num_workers=1 is below autoscale.min_workers=2"],
    ),
    (
        {"autoscale": {"plan_approval": True}, "cluster_budget": {"cpu": 8}},
        ["autoscale.plan_approval=True with cluster_budget", "give one of them"],
    ),
    ({"stream_logs": "no"}, ["stream_logs", "True or False", "'no'"]),
    (
        {"features": {"num_dense": 13, "tables": [TABLE, {**TABLE, "column": "C2"}]}},
        ["features", "duplicate table names ['site']"],
    ),
    (
        {"features": {"num_dense": 13, "tables": [{**TABLE, "dim": 0}]}},
        ["features", "tables.0.dim", "greater than 0"],
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "expected"), BAD_OPERATOR_PARAMS, ids=[next(iter(k)) for k, _ in BAD_OPERATOR_PARAMS]
)
def test_bad_operator_parameters_fail_at_parse_time(
    kwargs: dict[str, Any], expected: list[str]
) -> None:
    """Each bad value raises ValueError naming the task, the parameter and what is accepted."""
    with pytest.raises(ValueError) as info:
        build(**kwargs)
    message = str(info.value)
    assert "ElasticTrainingOperator(task_id='train')" in message
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


@pytest.mark.parametrize(
    ("param", "model"),
    [("plan", ResourcePlan), ("training", TrainingConfig), ("recovery", RecoveryConfig)],
)
def test_an_unknown_key_message_lists_the_accepted_keys(param: str, model: Any) -> None:
    """A typo in a plan/training key is answered with the keys that would have been accepted."""
    with pytest.raises(ValueError) as info:
        build(**{param: {"bogus": 1}})
    for key in model.model_fields:
        assert key in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"plan": {"num_workers": "{{ params.n }}", "num_ps": 2}},
        {"training": {"epochs": "{{ params.epochs }}", "batch_size": 512}},
        {"model": "{{ params.model }}"},
        {"train_data": "{{ ds }}/train", "output_dir": "/models/{{ ds }}"},
        {"recovery": {"max_node_restarts": "{{ params.restarts }}", "checkpoint_interval_s": 5}},
        {"recovery": {"max_node_restarts": "{{ params.restarts | int - 1 }}"}},
    ],
)
def test_templated_values_are_left_for_render_time(kwargs: dict[str, Any]) -> None:
    """A Jinja template is not validated at parse time: only its rendering can be judged."""
    operator = build(**kwargs)
    for name, value in kwargs.items():
        assert getattr(operator, name) == value


@pytest.mark.parametrize(
    ("param", "value", "bad_key"),
    [
        ("plan", {"num_workers": "{{ params.n }}", "num_gpus": 4}, "num_gpus"),
        ("plan", {"num_workers": "{{ params.n }}", "num_ps": 0}, "num_ps"),
        ("training", {"epochs": "{{ params.epochs }}", "batch_size": 0}, "batch_size"),
        (
            "recovery",
            {"max_node_restarts": "{{ params.n }}", "max_master_restarts": -1},
            "max_master_restarts",
        ),
        ("recovery", {"max_node_restarts": "{{ params.n }}", "max_restarts": 1}, "max_restarts"),
    ],
)
def test_static_values_beside_a_template_are_still_checked(
    param: str, value: dict[str, Any], bad_key: str
) -> None:
    """Only the templated entries wait for rendering; a bad literal next to them fails now."""
    with pytest.raises(ValueError, match=bad_key):
        build(**{param: value})


def test_a_valid_operator_builds_with_models_or_dicts() -> None:
    """Valid parameters build; pydantic objects and dicts end up as the same plain dicts."""
    operator = build(
        eval_data="/data/eval",
        plan=ResourcePlan(num_workers=4, num_ps=2),
        training={"batch_size": 256, "epochs": 2},
        features={"num_dense": 13, "tables": [TABLE]},
        model="mypkg.models:build_tower",
        poll_interval=1,
        max_runtime=timedelta(hours=1),
    )
    assert operator.plan == ResourcePlan(num_workers=4, num_ps=2).model_dump()
    assert operator.training == {"batch_size": 256, "epochs": 2}
    assert operator.features is not None and operator.features.tables[0].name == "site"
    assert operator.poll_interval == 1.0
    default = build()
    assert (default.plan, default.training, default.features) == ({}, {}, None)


def test_template_fields_cover_every_path_and_setting() -> None:
    """Paths, model and the plan/training dicts are templated (and rendered as JSON)."""
    fields = set(ElasticTrainingOperator.template_fields)
    assert fields >= {"train_data", "eval_data", "output_dir", "model", "plan", "training"}
    for name in fields:
        assert hasattr(build(), name)


# -- warm start and the history store -------------------------------------------------------
def test_warm_start_is_off_by_default_and_the_history_connection_is_templated() -> None:
    """``warm_start`` defaults to False; ``history_conn_id`` (default: SQLite in
    ``$AIRFLOW_HOME``) is a template field, like every connection id."""
    default = build()
    assert (default.warm_start, default.history_conn_id) == (False, None)
    assert "history_conn_id" in ElasticTrainingOperator.template_fields
    operator = build(warm_start=True, history_conn_id="{{ params.history }}")
    assert (operator.warm_start, operator.history_conn_id) == (True, "{{ params.history }}")


WARM_PLAN = {"num_workers": 3, "num_ps": 2, "worker_cpu": 1.5}
RENDERED_PLANS = [WARM_PLAN, str(WARM_PLAN), json.dumps(WARM_PLAN)]


@pytest.mark.parametrize("rendered", RENDERED_PLANS, ids=["dict", "python-repr", "json"])
def test_a_plan_template_from_xcom_is_accepted_and_reaches_the_spec(rendered: Any) -> None:
    """``plan`` may be one template (a WarmStartOperator's XCom); it renders to a dict (native
    rendering) or to its text (JSON or Python literal), and either reaches the spec."""
    operator = build(plan="{{ ti.xcom_pull(task_ids='warm_start')['plan'] }}")
    assert operator.plan == "{{ ti.xcom_pull(task_ids='warm_start')['plan'] }}"
    operator.plan = rendered  # as rendered at run time
    assert operator.build_spec(run_context()).plan == ResourcePlan(**WARM_PLAN)


def test_a_plan_template_that_renders_to_no_plan_fails_without_retries() -> None:
    operator = build(plan="{{ params.plan }}")
    operator.plan = "four workers please"
    with pytest.raises(AirflowFailException, match="plan"):
        operator.build_spec(run_context())


# -- recovery --------------------------------------------------------------------------------
def run_context(**params: Any) -> Any:
    """The parts of a task's run-time context that rendering and ``build_spec`` read."""
    ti = SimpleNamespace(dag_id="params_test", task_id="train", run_id="manual__1", map_index=-1)
    return {"ti": ti, "params": params}


def test_recovery_is_templated_and_reaches_the_job_spec() -> None:
    """``recovery`` is a templated JSON field; a RecoveryConfig or a dict builds the spec's
    recovery settings (defaults for what is not given)."""
    assert "recovery" in ElasticTrainingOperator.template_fields
    assert ElasticTrainingOperator.template_fields_renderers["recovery"] == "json"
    config = RecoveryConfig(max_node_restarts=2, checkpoint_interval_s=5)
    assert build(recovery=config).recovery == config.model_dump()
    as_dict = build(recovery={"max_node_restarts": 0, "checkpoint_interval_s": 1})
    assert as_dict.recovery == {"max_node_restarts": 0, "checkpoint_interval_s": 1}
    spec = as_dict.build_spec(run_context())
    assert spec.recovery == RecoveryConfig(max_node_restarts=0, checkpoint_interval_s=1)
    assert build().recovery == {}
    assert build().build_spec(run_context()).recovery == RecoveryConfig()


def test_a_rendered_recovery_template_is_validated_at_run_time() -> None:
    """A template passes at parse time; once rendered, a good value reaches the spec and a bad
    one fails the task without retries, naming ``recovery`` and the field."""
    operator = build(recovery={"max_node_restarts": "{{ params.restarts }}"})
    operator.render_template_fields(run_context(restarts=4))
    spec = operator.build_spec(run_context())
    assert spec.recovery.max_node_restarts == 4

    operator = build(recovery={"max_node_restarts": "{{ params.restarts }}"})
    operator.render_template_fields(run_context(restarts=-1))
    with pytest.raises(AirflowFailException) as info:
        operator.build_spec(run_context())
    message = str(info.value)
    assert "ElasticTrainingOperator(task_id='train')" in message
    for part in ["recovery", "max_node_restarts", "greater than or equal to 0"]:
        assert part in message, f"{part!r} not in {message!r}"


# -- max_runtime: the job's deadline ---------------------------------------------------------
class FakeJobHook:
    """A job as the operator sees it through its hook; records what it launches and stops."""

    def __init__(
        self, state: str = "running", deadline: JobDeadline | None = None, job_dir: Path = Path()
    ) -> None:
        self.state, self.deadline, self.job_dir = state, deadline, JobDir(job_dir)
        self.launched: list[JobSpec] = []
        self.stopped: list[str] = []

    def launch(self, spec: JobSpec, env: dict[str, str] | None = None) -> None:
        self.launched.append(spec)

    def get_status(self) -> dict[str, Any]:
        return {"state": self.state, "job_id": "params-test", "message": ""}

    def get_deadline(self) -> JobDeadline | None:
        return self.deadline

    def stop(self, reason: str) -> None:
        self.stopped.append(reason)
        self.state = "stopped"


class TaskStateStore(dict[str, Any]):
    """``context["task_state_store"]``: what every try of the task shares."""

    def set(self, key: str, value: Any) -> None:
        self[key] = value


def task_context(store: TaskStateStore | None = None) -> Any:
    """What ``submit_job`` and ``ResumableJobMixin`` read of a task's context."""
    ti = SimpleNamespace(
        dag_id="params_test",
        task_id="train",
        run_id="manual__1",
        map_index=-1,
        try_number=1,
        task=None,
        stats_tags={},
        xcom_push=lambda **_: None,
    )
    return {"ti": ti, "params": {}, "task_state_store": store}


def test_the_job_is_submitted_with_its_deadline_max_runtime_from_now(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The spec the task launches carries the deadline, ``max_runtime`` after submission, in
    the JSON that the master (and a relaunched one) reads."""
    data = generate_dataset(tmp_path / "data", SyntheticConfig(num_train=200, num_eval=100))
    operator = build(
        train_data=str(data.train_dir), max_runtime=timedelta(hours=2), output_dir=str(tmp_path)
    )
    hook = FakeJobHook("absent", job_dir=tmp_path)
    monkeypatch.setattr(operator, "hook_for", lambda *_: hook)
    monkeypatch.setattr("airflow_rover.operators.training.check_model", lambda *_: None)
    monkeypatch.setattr(operator, "_with_failure_rate", lambda _context, spec: spec)
    before = datetime.now(UTC)
    operator.submit_job(task_context())
    (spec,) = hook.launched
    assert spec.deadline is not None and spec.deadline.max_runtime_s == 7200
    assert before + timedelta(hours=2) <= spec.deadline.at <= datetime.now(UTC) + timedelta(hours=2)
    assert JobSpec.model_validate_json(spec.model_dump_json()).deadline == spec.deadline


@pytest.mark.parametrize(
    ("runtime_left", "timeout"),
    [
        (timedelta(minutes=30), timedelta(minutes=31, seconds=30)),
        (None, timedelta(hours=2)),
    ],
    ids=["deadline", "none"],
)
def test_the_task_defers_until_the_jobs_deadline_and_a_grace(
    monkeypatch: pytest.MonkeyPatch, runtime_left: timedelta | None, timeout: timedelta
) -> None:
    """Airflow's deferral timeout falls after the deadline (three polls later here), so the
    trigger reports the master's stop first; a job without a deadline waits ``max_runtime``."""
    deadline = JobDeadline.after(runtime_left) if runtime_left is not None else None
    operator = build(max_runtime=timedelta(hours=2), poll_interval=30)
    monkeypatch.setattr(operator, "hook_for", lambda *_: FakeJobHook(deadline=deadline))
    with pytest.raises(TaskDeferred) as info:
        operator.poll_until_complete("/jobs/x", task_context())
    assert info.value.timeout is not None
    assert timeout - timedelta(seconds=60) < info.value.timeout <= timeout


def retry(monkeypatch: pytest.MonkeyPatch, old: FakeJobHook) -> tuple[list[str], TaskStateStore]:
    """Run a retry of a task whose earlier try launched ``old``: what it did, and the store."""
    operator = build(max_runtime=timedelta(hours=1))
    done: list[str] = []
    monkeypatch.setattr(operator, "hook_for", lambda *_: old)
    monkeypatch.setattr(operator, "submit_job", lambda _ctx: done.append("submit") or "/jobs/new")
    monkeypatch.setattr(operator, "poll_until_complete", lambda job, _ctx: done.append(job))
    monkeypatch.setattr(operator, "get_job_result", lambda job, _ctx: {"job_dir": job})
    store = TaskStateStore({operator.external_id_key: "/jobs/old"})
    operator.execute(task_context(store))
    return done, store


@pytest.mark.parametrize("state", ["running", "unreachable"])
def test_a_retry_does_not_reattach_to_a_job_past_its_deadline(
    monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    """Past its deadline the old job is stopped, saying why, and the retry submits the job
    again (a new try with a deadline of its own); within it the retry reattaches."""
    two_hours_ago = datetime.now(UTC) - timedelta(hours=2)
    old = FakeJobHook(state, JobDeadline.after(timedelta(hours=1), now=two_hours_ago))
    done, store = retry(monkeypatch, old)
    assert done == ["submit", "/jobs/new"]
    assert store["rover_job_dir"] == "/jobs/new"
    (reason,) = old.stopped
    assert "ran past its deadline" in reason and "max_runtime=1:00:00" in reason

    running = FakeJobHook(state, JobDeadline.after(timedelta(hours=1)))
    assert retry(monkeypatch, running) == (["/jobs/old"], {"rover_job_dir": "/jobs/old"})
    assert running.stopped == []


# -- the sensor ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"job_dir": ""}, ["job_dir", "non-empty path"]),
        ({"job_dir": "/j", "min_auc": 1.5}, ["min_auc", "less than or equal to 1"]),
        ({"job_dir": "/j", "min_samples": 0}, ["min_samples", "greater than 0"]),
        ({"job_dir": "/j", "states": []}, ["give at least one of states, min_samples, min_auc"]),
        ({"job_dir": "/j", "states": ["done"]}, ["states"]),
    ],
)
def test_bad_sensor_parameters_fail_at_parse_time(
    kwargs: dict[str, Any], expected: list[str]
) -> None:
    """Each bad value raises ValueError naming the task and the field."""
    with pytest.raises(ValueError) as info:
        build_sensor(**kwargs)
    message = str(info.value)
    assert "ElasticJobSensor(task_id='wait')" in message
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


def test_valid_sensors_build() -> None:
    """Waiting on AUC alone, on samples, or on the default state all build."""
    assert build_sensor(job_dir="/j", states=[], min_auc=0.7).milestone.min_auc == 0.7
    assert build_sensor(job_dir="/j", min_samples=10).milestone.min_samples == 10
    assert build_sensor(job_dir="{{ ds }}").milestone.states == ("succeeded",)


# -- job ids and paths -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dag_id", "task_id"),
    [
        ("rover_daily_retrain", "train"),
        ("UPPER_Case.DAG", "Group.Task_1"),
        ("__dunder__", "--x--"),
        ("x" * 250, "y" * 250),
        ("___", "..."),
    ],
)
def test_job_id_is_dns_safe(dag_id: str, task_id: str) -> None:
    """Any valid dag/task id gives a lowercase DNS-style id that a JobSpec accepts."""
    job_id = job_id_for(dag_id, task_id, "scheduled__2026-11-20T00:00:00+00:00", 3)
    assert DNS_SAFE.match(job_id), job_id
    assert len(job_id) <= 63


def test_job_id_is_stable_and_unique() -> None:
    """The same run gives the same id (every try); other runs or map indexes give others."""
    args = ("dag", "train", "manual__2026-11-20T00:00:00+00:00")
    assert job_id_for(*args) == job_id_for(*args) == job_id_for(*args, -1)
    ids = {
        job_id_for("dag", "train", run_id, index)
        for run_id in ("manual__1", "manual__2", "scheduled__1", "backfill__1")
        for index in (-1, 0, 1, 2, 10)
    }
    assert len(ids) == 4 * 5
    assert job_id_for("dag", "train", "r") != job_id_for("dag", "train2", "r")
    assert job_id_for("dag", "train", "r") != job_id_for("dag2", "train", "r")


def test_default_jobs_root_follows_airflow_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Jobs live under ``$AIRFLOW_HOME/rover/jobs``, read when called (not at import)."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home-a"))
    assert default_jobs_root() == tmp_path / "home-a" / "rover" / "jobs"
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home-b"))
    assert default_jobs_root() == tmp_path / "home-b" / "rover" / "jobs"
    monkeypatch.delenv("AIRFLOW_HOME")
    assert default_jobs_root() == Path.home() / "airflow" / "rover" / "jobs"


# -- the example DAGs ------------------------------------------------------------------------
def test_every_dag_file_imports_without_errors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Airflow's own DagBag parses every file in ``dags/`` with no import errors (no DB needed)."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("ROVER_HOME", str(tmp_path / "rover"))
    bag = DagBag(dag_folder=REPO / "dags", safe_mode=False)
    assert bag.import_errors == {}
    assert "rover_daily_retrain" in bag.dag_ids
    dag = bag.dags["rover_daily_retrain"]
    daily_train = dag.get_task("train")
    assert isinstance(daily_train, ElasticTrainingOperator)
    assert daily_train.autoscale == {
        "max_ps_cpu": 4,
        "max_ps_memory_mb": 8192,
        "min_workers": 1,
        "weight": "{{ 1 if dag_run.run_type == 'backfill' else 2 }}",
        "prior": "{{ ti.xcom_pull(task_ids='warm_start')['prior'] }}",
    }
    assert daily_train.cluster_budget == "auto"
    assert isinstance(dag.get_task("quality_gate"), ElasticJobSensor)
    # The ETL example: Parquet on S3, continued daily, published only past its gate.
    etl = bag.dags["rover_etl_to_model"]
    train = etl.get_task("train")
    assert isinstance(train, ElasticTrainingOperator)
    assert train.init_from == "{{ params.init_from }}" and etl.params["init_from"] == "previous"
    assert train.data_format == "parquet" and "dt={{ ds }}" in train.train_data
    publish = etl.get_task("publish_model")
    assert publish.upstream_task_ids == {"train", "quality_gate"}
    etl_model = "x-rover-model://rover_etl_to_model/publish_model"
    assert [a.uri for a in publish.outlets] == [etl_model]
    scorer = bag.dags["rover_score_on_new_model"].timetable.asset_condition
    assert {a.uri for a in scorer.objects} == {
        etl_model,
        "x-rover-model://rover_daily_retrain/train",
    }


@pytest.mark.parametrize("plan_approval", [False, True], ids=["applied", "approved"])
def test_with_plan_approval_the_trigger_leaves_the_proposals_to_a_person(
    monkeypatch: pytest.MonkeyPatch, plan_approval: bool
) -> None:
    """``autoscale={"plan_approval": True}``: the trigger applies no proposal (``apply_plans``
    False, and so after a triggerer restart: it is serialized); by default it applies them."""
    operator = build(autoscale={"plan_approval": plan_approval})
    monkeypatch.setattr(operator, "hook_for", lambda *_: FakeJobHook())
    with pytest.raises(TaskDeferred) as info:
        operator.poll_until_complete("/jobs/x", task_context())
    trigger = info.value.trigger
    assert isinstance(trigger, ElasticJobTrigger)
    assert trigger.apply_plans is not plan_approval
    assert trigger.serialize()[1]["apply_plans"] is not plan_approval


@pytest.mark.parametrize("stream_logs", [True, False], ids=["default", "off"])
def test_stream_logs_reaches_the_trigger(
    monkeypatch: pytest.MonkeyPatch, stream_logs: bool
) -> None:
    """The job's log lines are streamed into the task's log by default (and so after a
    triggerer restart: it is serialized); ``stream_logs=False`` turns that off."""
    operator = build() if stream_logs else build(stream_logs=False)
    monkeypatch.setattr(operator, "hook_for", lambda *_: FakeJobHook())
    with pytest.raises(TaskDeferred) as info:
        operator.poll_until_complete("/jobs/x", task_context())
    trigger = info.value.trigger
    assert isinstance(trigger, ElasticJobTrigger)
    assert trigger.stream_logs is stream_logs
    assert trigger.serialize()[1].get("stream_logs", False) is stream_logs


AUTOSCALE_SETTINGS = [
    {},
    {"plan_approval": True},
    {"enabled": False},
    {"min_workers": 1, "max_workers": 2, "max_ps": 1, "max_ps_memory_mb": 4096, "weight": 3.0},
    {"min_plan_interval_s": 300, "decline_cooldown_s": 600, "sampling_s": 60},
    {"prior": {"hot_share": 0.3, "worker_start_s": 12.0, "jobs": ["daily.train-1"]}},
]


def test_autoscale_is_in_the_spec_but_not_in_the_training_fingerprint(tmp_path: Path) -> None:
    """Every autoscale setting reaches the job without changing what counts as the same
    training (how the job runs, not what it learns); a job.json written before the newer
    fields existed loads with their defaults."""
    data = generate_dataset(tmp_path / "data", SyntheticConfig(num_train=200, num_eval=100))
    specs = [
        build(train_data=str(data.train_dir), autoscale=settings).build_spec(task_context())
        for settings in AUTOSCALE_SETTINGS
    ]
    for spec, settings in zip(specs, AUTOSCALE_SETTINGS, strict=True):
        assert spec.autoscale == AutoscaleConfig(**settings)
    assert len({training_fingerprint(s) for s in specs}) == 1
    older = json.loads(specs[1].model_dump_json())
    for name in ("plan_approval", "weight", "min_workers", "max_ps_memory_mb"):
        del older["autoscale"][name]
    assert JobSpec.model_validate(older).autoscale == AutoscaleConfig()


def test_autoscale_is_templated_and_an_autoscale_config_is_accepted() -> None:
    """``autoscale`` is a templated JSON field; an ``AutoscaleConfig`` builds like its dict."""
    assert "autoscale" in ElasticTrainingOperator.template_fields
    assert ElasticTrainingOperator.template_fields_renderers["autoscale"] == "json"
    config = AutoscaleConfig(max_workers=2, weight=2.0)
    assert build(autoscale=config).autoscale == config.model_dump()
    assert build(autoscale=config).build_spec(run_context()).autoscale == config
    assert build().build_spec(run_context()).autoscale == AutoscaleConfig()


def test_a_rendered_autoscale_template_is_validated_at_run_time() -> None:
    """A template passes at parse time; rendered, a good value reaches the spec, and a bad one
    (or a starting plan outside the rendered bounds) fails the task without retries, naming
    ``autoscale.<field>``."""
    operator = build(autoscale={"max_workers": "{{ params.n }}"}, plan={"num_workers": 2})
    operator.render_template_fields(run_context(n=3))
    assert operator.build_spec(run_context()).autoscale.max_workers == 3
    assert operator.rendered_autoscale().max_workers == 3

    for n, expected in ((-1, "autoscale.max_workers"), (1, "autoscale.max_workers=1")):
        operator = build(autoscale={"max_workers": "{{ params.n }}"}, plan={"num_workers": 2})
        operator.render_template_fields(run_context(n=n))
        with pytest.raises(AirflowFailException) as info:
            operator.build_spec(run_context())
        assert "ElasticTrainingOperator(task_id='train')" in str(info.value)
        assert expected in str(info.value), str(info.value)
    operator = build(autoscale={"weight": "{{ params.w }}"})
    operator.render_template_fields(run_context(w=-2))
    with pytest.raises(AirflowFailException, match=r"autoscale\.weight"):
        operator.rendered_autoscale()


def test_a_whole_autoscale_template_is_rendered_from_its_text() -> None:
    """``autoscale`` may be one template (rendered to a dict, or to JSON text)."""
    operator = build(autoscale="{{ params.autoscale }}")
    assert operator.autoscale == "{{ params.autoscale }}"
    operator.autoscale = json.dumps({"plan_approval": True, "max_ps": 2})  # as rendered
    spec = operator.build_spec(run_context())
    assert spec.autoscale == AutoscaleConfig(plan_approval=True, max_ps=2)


def test_the_launch_index_records_approval_from_the_rendered_autoscale(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The UI lists a job as waiting for approval from its launch row: ``plan_approval`` comes
    from the rendered ``autoscale`` (a template here)."""
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    for rendered in (True, False):
        operator = build(autoscale={"plan_approval": "{{ params.approve }}"})
        context = {**task_context(), "params": {"approve": rendered}}
        operator.render_template_fields(context)
        spec = operator.build_spec(context)
        operator._index_launch(context, tmp_path / "job", spec)
        with operator.history_hook().get_conn() as store:
            launch = LaunchIndex(store).get(spec.job_id)
        assert launch is not None and launch.plan_approval is rendered
