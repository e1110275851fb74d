"""``data_workers=`` and ``preprocess=`` on the training operator: every accepted form of
``data_workers`` reaches the job spec as the config it means, every bad one fails when the DAG
is parsed (or, templated, when it renders) naming ``data_workers`` and what is accepted."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException

from airflow_rover.cli import load_spec
from airflow_rover.core.spec import DataWorkersConfig, JobSpec
from airflow_rover.operators.training import ElasticTrainingOperator

OWNER = "ElasticTrainingOperator(task_id='train')"


def build(**kwargs: Any) -> ElasticTrainingOperator:
    kwargs.setdefault("train_data", "/data/train")
    with DAG(dag_id="dw_params", schedule=None, start_date=datetime(2026, 1, 1)):
        return ElasticTrainingOperator(task_id="train", **kwargs)


def run_context(**params: Any) -> Any:
    ti = SimpleNamespace(dag_id="dw_params", task_id="train", run_id="manual__1", map_index=-1)
    return {"ti": ti, "params": params}


ACCEPTED: list[tuple[Any, DataWorkersConfig]] = [
    (None, DataWorkersConfig()),
    (0, DataWorkersConfig()),
    ("off", DataWorkersConfig()),
    (3, DataWorkersConfig(mode="fixed", count=3)),
    ("auto", DataWorkersConfig(mode="auto")),
    ({"mode": "auto", "min": 1, "max": 4}, DataWorkersConfig(mode="auto", min=1, max=4)),
    ({"min": 1, "max": 6}, DataWorkersConfig(mode="auto", min=1, max=6)),
    ({"max": 2, "cpu": 0.5}, DataWorkersConfig(mode="auto", max=2, cpu=0.5)),
    ({"count": 2, "memory_mb": 512}, DataWorkersConfig(mode="fixed", count=2, memory_mb=512)),
    ({"mode": "off"}, DataWorkersConfig()),
    (DataWorkersConfig(mode="fixed", count=5), DataWorkersConfig(mode="fixed", count=5)),
]


@pytest.mark.parametrize(("value", "expected"), ACCEPTED, ids=[repr(v) for v, _ in ACCEPTED])
def test_each_accepted_form_reaches_the_spec_as_the_config_it_means(
    value: Any, expected: DataWorkersConfig
) -> None:
    spec = build(data_workers=value).build_spec(run_context())
    assert spec.data_workers == expected
    assert spec.data_workers.start == expected.start


def test_data_workers_are_off_by_default() -> None:
    spec = build().build_spec(run_context())
    assert spec.data_workers == DataWorkersConfig() and not spec.data_workers.enabled
    assert spec.preprocess is None


ACCEPTED_TEXT = "None, 0 or 'off'"
BAD: list[tuple[Any, list[str]]] = [
    (-1, ["data_workers=-1; accepted:", ACCEPTED_TEXT, "'auto'", "a count n >= 1"]),
    (True, ["data_workers=True; accepted:", ACCEPTED_TEXT]),
    (2.5, ["data_workers=2.5; accepted:", ACCEPTED_TEXT]),
    ("many", ["data_workers='many'; accepted:", ACCEPTED_TEXT]),
    ([1, 2], ["data_workers=[1, 2]; accepted:", ACCEPTED_TEXT]),
    (65, ["data_workers.count:", "less than or equal to 64"]),
    ({"mode": "fixed"}, ["data_workers: mode 'fixed' needs count >= 1"]),
    ({"mode": "sometimes"}, ["data_workers.mode:", "'off', 'fixed' or 'auto'"]),
    ({"min": 5, "max": 2}, ["data_workers.min=5 is above data_workers.max=2"]),
    ({"mode": "auto", "count": 9}, ["data_workers.count=9 is outside [min=0, max=4]"]),
    ({"cpu": 2.0}, ["data_workers={'cpu': 2.0} turns no data workers on", "mode", "min/max"]),
    ({"max": 4, "workers": 2}, ["data_workers.workers:", "accepted: mode, count, min, max"]),
    ({"max": 4, "memory_mb": 64}, ["data_workers.memory_mb:", "greater than or equal to 256"]),
]


@pytest.mark.parametrize(("value", "expected"), BAD, ids=[repr(v) for v, _ in BAD])
def test_each_bad_form_fails_at_parse_time_naming_data_workers(
    value: Any, expected: list[str]
) -> None:
    with pytest.raises(ValueError) as info:
        build(data_workers=value)
    message = str(info.value)
    assert message.startswith(f"{OWNER}: "), message
    assert "Value error" not in message, message
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


@pytest.mark.parametrize(
    ("rendered", "expected"),
    [
        ("2", DataWorkersConfig(mode="fixed", count=2)),
        ("auto", DataWorkersConfig(mode="auto")),
        ("None", DataWorkersConfig()),
        (json.dumps({"min": 1, "max": 3}), DataWorkersConfig(mode="auto", min=1, max=3)),
        (str({"mode": "fixed", "count": 4}), DataWorkersConfig(mode="fixed", count=4)),
    ],
)
def test_a_whole_template_is_judged_once_rendered(rendered: str, expected: Any) -> None:
    """One template passes at parse time; it renders to text (a count, None, a dict as JSON
    or a Python literal), which reaches the spec as the form it holds."""
    assert "data_workers" in ElasticTrainingOperator.template_fields
    operator = build(data_workers="{{ params.data_workers }}")
    operator.render_template_fields(run_context(data_workers=rendered))
    assert operator.build_spec(run_context()).data_workers == expected


def test_templated_entries_are_validated_when_rendered() -> None:
    operator = build(data_workers={"mode": "auto", "max": "{{ params.n }}"})
    operator.render_template_fields(run_context(n=6))
    assert operator.build_spec(run_context()).data_workers.max == 6

    for rendered, expected in (("many", "data_workers='many'; accepted:"), ("0", "max")):
        operator = build(
            data_workers="{{ params.dw }}" if rendered == "many" else {"max": "{{ params.dw }}"}
        )
        operator.render_template_fields(run_context(dw=rendered))
        with pytest.raises(AirflowFailException) as info:
            operator.build_spec(run_context())
        assert str(info.value).startswith(OWNER) and "data_workers" in str(info.value)
        assert expected in str(info.value), str(info.value)


def test_an_unknown_key_beside_a_template_fails_at_parse_time() -> None:
    with pytest.raises(ValueError, match=r"data_workers: unknown keys \['workers'\]"):
        build(data_workers={"max": "{{ params.n }}", "workers": 2})


# -- preprocess --------------------------------------------------------------------------------
def test_preprocess_reaches_the_spec_and_is_templated() -> None:
    assert "preprocess" in ElasticTrainingOperator.template_fields
    spec = build(preprocess="mypkg.features:bucketed").build_spec(run_context())
    assert spec.preprocess == "mypkg.features:bucketed"
    operator = build(model="{{ params.model }}", preprocess="{{ params.preprocess }}")
    operator.render_template_fields(
        run_context(model="mypkg.models:tower", preprocess="mypkg.features:crossed")
    )
    assert operator.build_spec(run_context()).preprocess == "mypkg.features:crossed"


@pytest.mark.parametrize("value", ["bucketed", "mypkg.features", "a b:c", 3, "pkg:fn()"])
def test_a_preprocess_that_is_no_import_path_fails_at_parse_time(value: Any) -> None:
    with pytest.raises(ValueError) as info:
        build(preprocess=value)
    assert str(info.value) == (
        f"{OWNER}: preprocess={value!r}: expected an import path like "
        "'mypkg.features:preprocess' (a function taking and returning a Batch), or None"
    )


def test_a_rendered_preprocess_is_validated_and_an_empty_one_is_none() -> None:
    operator = build(preprocess="{{ params.preprocess }}")
    operator.render_template_fields(run_context(preprocess="not a path"))
    with pytest.raises(AirflowFailException, match=r"preprocess='not a path': expected"):
        operator.build_spec(run_context())
    operator = build(preprocess="{{ params.preprocess }}")
    operator.render_template_fields(run_context(preprocess=""))
    assert operator.build_spec(run_context()).preprocess is None


# -- the spec round trip -----------------------------------------------------------------------
def test_the_spec_round_trips_through_job_json_and_the_cli_config(tmp_path: Path) -> None:
    """What the operator builds is what every process reads back from ``job.json``; a
    ``rover train`` config takes the same short forms."""
    spec = build(
        preprocess="mypkg.features:crossed", data_workers={"min": 1, "max": 3, "cpu": 0.5}
    ).build_spec(run_context())
    again = JobSpec.model_validate_json(spec.model_dump_json())
    assert again == spec
    assert again.data_workers == DataWorkersConfig(mode="auto", min=1, max=3, cpu=0.5)
    assert again.preprocess == "mypkg.features:crossed"

    config = tmp_path / "job.yaml"
    config.write_text(
        yaml.safe_dump(
            {"train_data": "/d", "data_workers": 2, "preprocess": "mypkg.features:crossed"}
        )
    )
    loaded = load_spec(config)
    assert loaded.data_workers == DataWorkersConfig(mode="fixed", count=2)
    assert loaded.preprocess == "mypkg.features:crossed"
    config.write_text(yaml.safe_dump({"train_data": "/d", "data_workers": "lots"}))
    with pytest.raises(SystemExit, match=r"data_workers='lots'; accepted: None, 0 or 'off'"):
        load_spec(config)
