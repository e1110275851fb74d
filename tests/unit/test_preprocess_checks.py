"""The job's preprocessing before launch and at evaluation: preflight runs it on the first rows
as a worker does, so one that cannot be imported, raises, or breaks the rows, the columns or
the vocabularies fails the task before any process starts, naming ``preprocess``; the
evaluator scores the held-out split on the same preprocessed features the trainers train on."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
from airflow.sdk.exceptions import AirflowFailException
from test_operator_params import FakeJobHook, build, task_context

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.spec import DataWorkersConfig, JobSpec
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.data.features import resolve_features
from airflow_rover.data.fingerprint import training_fingerprint
from airflow_rover.data.preflight import PreflightError, check_data
from airflow_rover.data.preprocessing import PreprocessError, load_preprocess
from airflow_rover.data.reader import open_split
from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.master.wrap_up import model_card
from airflow_rover.operators.serving_export import ensure_saved_model
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc.ps_client import PSClient
from airflow_rover.worker.evaluation import evaluate
from airflow_rover.worker.export import preprocess_note
from airflow_rover.worker.models import load_factory
from airflow_rover.worker.preflight import CHECK_ROWS, check_model, preflight
from airflow_rover.worker.ps_model import PSModel

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WHERE = f"(on {CHECK_ROWS} rows of train_data, as a worker runs it)"
TOKEN = "preprocess-checks"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return generate_dataset(
        tmp_path_factory.mktemp("data"), SyntheticConfig(num_train=300, num_eval=200, seed=3)
    )


@pytest.fixture(autouse=True)
def fixture_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))


def spec(data: Any, preprocess: str | None) -> JobSpec:
    return JobSpec(
        job_id="prep",
        train_data=str(data.train_dir),
        eval_data=str(data.eval_dir),
        preprocess=preprocess,
    )


BAD = [
    ("user_preprocess:raising", "preprocess='user_preprocess:raising' raised KeyError: 'C27'"),
    (
        "no_such_module_for_rover:fn",
        "preprocess='no_such_module_for_rover:fn' cannot be imported: No module named "
        "'no_such_module_for_rover'",
    ),
    ("user_preprocess:missing", "preprocess='user_preprocess:missing' cannot be imported: "),
    ("user_preprocess:NOT_CALLABLE", "preprocess='user_preprocess:NOT_CALLABLE' is not callable"),
    (
        "user_preprocess:dropped_dense",
        "preprocess='user_preprocess:dropped_dense' returned 12 dense columns, the schema has 13",
    ),
    (
        "user_preprocess:out_of_vocab",
        "preprocess='user_preprocess:out_of_vocab': column 'C6' holds ids outside [0, 20)",
    ),
    (
        "user_preprocess:fewer_rows",
        f"preprocess='user_preprocess:fewer_rows' returned {CHECK_ROWS - 1} rows for {CHECK_ROWS}",
    ),
    (
        "user_preprocess:not_a_batch",
        "preprocess='user_preprocess:not_a_batch' must return a Batch, got ndarray",
    ),
]


@pytest.mark.parametrize(("ref", "expected"), BAD, ids=[r.split(":")[1] for r, _ in BAD])
def test_preflight_refuses_each_bad_preprocess_by_name(data: Any, ref: str, expected: str) -> None:
    with pytest.raises(PreflightError) as info:
        preflight(spec(data, ref))
    message = str(info.value)
    assert message.startswith(expected), message
    assert message.endswith(WHERE), message


def test_the_task_fails_before_launch_naming_preprocess(
    data: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the operator: no retry (it cannot help), nothing launched."""
    operator = build(
        train_data=str(data.train_dir),
        preprocess="user_preprocess:out_of_vocab",
        output_dir=str(tmp_path),
    )
    hook = FakeJobHook("absent", job_dir=tmp_path)
    monkeypatch.setattr(operator, "hook_for", lambda *_: hook)
    with pytest.raises(AirflowFailException) as info:
        operator.submit_job(task_context())
    assert str(info.value).startswith(
        "train: preprocess='user_preprocess:out_of_vocab': column 'C6' holds ids outside [0, 20)"
    ), str(info.value)
    assert hook.launched == []


def test_a_bucketing_and_a_crossing_preprocess_pass(data: Any) -> None:
    """The docs' two examples: a dense column bucketised into a column's ids, two id columns
    crossed into a larger column's ids; the model is built and called on their output."""
    for ref in ("user_preprocess:bucketed", "user_preprocess:crossed"):
        job = spec(data, ref)
        check_model(job, check_data(job))


# -- the evaluator ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ps_model(data: Any) -> Iterator[PSModel]:
    """The job's model on one real PS holding its initial rows (nothing trained)."""
    job = spec(data, None)
    features = resolve_features(job)
    ps = ParameterServer(
        0, 1, EmbeddingPlacement.from_features(features), Optimizer("adagrad", 0.1), 0
    )
    server, port = start_server(ps, TOKEN, threads=2)
    client = PSClient([f"127.0.0.1:{port}"], TOKEN)
    schema = open_split(job, job.train_data).schema
    keras.utils.set_random_seed(0)
    model = PSModel(
        load_factory(job.model)(features),
        features,
        [c.name for c in schema.categorical],
        client,
        [c.name for c in schema.lists],
    )
    model.offer_initial_weights()
    yield model
    client.close()
    server.stop(0)


def test_the_evaluator_scores_the_preprocessed_features(data: Any, ps_model: PSModel) -> None:
    """Every id and dense value zeroed by the preprocessing: every row scores the same (AUC
    0.5 exactly), the log loss is that of the preprocessed rows, in batches as in one piece;
    the raw rows score otherwise."""
    reader = open_split(spec(data, None), str(data.eval_dir))
    ref = "user_preprocess:zeroed_ids"
    zeroed = load_preprocess(ref)
    report = evaluate(ps_model, reader, zeroed, ref, batch_size=64)
    rows = reader.read(0, reader.num_samples)
    p = np.clip(ps_model.predict(zeroed(rows)).astype(np.float64), 1e-7, 1 - 1e-7)
    y = rows.label
    expected = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    assert report.samples == 200 and report.auc == 0.5
    assert report.logloss == pytest.approx(expected, rel=1e-6)
    raw = evaluate(ps_model, reader, batch_size=64)
    assert raw.auc != 0.5 and raw.logloss != pytest.approx(report.logloss, rel=1e-6)


def test_the_evaluator_refuses_a_preprocess_that_breaks_the_columns(
    data: Any, ps_model: PSModel
) -> None:
    reader = open_split(spec(data, None), str(data.eval_dir))
    ref = "user_preprocess:dropped_dense"
    with pytest.raises(PreprocessError, match=r"^preprocess='user_preprocess:dropped_dense'"):
        evaluate(ps_model, reader, load_preprocess(ref), ref)


# -- the serving export ---------------------------------------------------------------------------
def test_a_preprocessed_models_card_and_export_say_the_savedmodel_takes_preprocessed_rows(
    data: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The SavedModel cannot run the Python preprocessing: the model card names it, the
    export's ``export.json`` says what the SavedModel takes, and the task's log warns."""
    job = spec(data, "user_preprocess:bucketed")
    job = job.model_copy(update={"features": resolve_features(job)})
    card = model_card(job)
    assert card["preprocess"] == "user_preprocess:bucketed"
    assert "preprocess" not in model_card(job.model_copy(update={"preprocess": None}))
    note = preprocess_note(card)
    assert note["preprocess"] == "user_preprocess:bucketed"
    assert "SavedModel does not run" in note["note"] and "already preprocessed" in note["note"]
    assert preprocess_note({"model": "wide_deep"}) == {}

    exported = tmp_path / "model" / "saved_model"
    exported.mkdir(parents=True)
    (exported / "export.json").write_text(json.dumps({"trained_rows": 7} | note))
    with caplog.at_level(logging.WARNING, logger="export-test"):
        info = ensure_saved_model(tmp_path / "model", logging.getLogger("export-test"))
    assert info["preprocess"] == "user_preprocess:bucketed"
    assert [r.getMessage() for r in caplog.records] == [
        f"SavedModel of {(tmp_path / 'model').resolve()}: {note['note']}"
    ]


def test_the_single_process_yardstick_trains_and_scores_preprocessed_rows(data: Any) -> None:
    """The AUC-parity yardstick reads the job's features as its workers do: its preprocessing
    runs on the training and the held-out rows (a broken one is refused by name)."""
    from airflow_rover.worker.single_process import train_single_process

    with pytest.raises(PreprocessError, match=r"^preprocess='user_preprocess:dropped_dense' "):
        train_single_process(spec(data, "user_preprocess:dropped_dense"))


def test_preprocess_is_part_of_the_training_and_data_workers_are_not(data: Any) -> None:
    """Another function trains another model (a re-run retrains); more or fewer data workers
    prepare the same batches (a re-run returns the finished job)."""
    plain = spec(data, None)
    digests = {
        training_fingerprint(plain.model_copy(update={"data_workers": dw}))
        for dw in (DataWorkersConfig(), DataWorkersConfig(mode="fixed", count=2))
    }
    assert len(digests) == 1
    bucketed = training_fingerprint(spec(data, "user_preprocess:bucketed"))
    crossed = training_fingerprint(spec(data, "user_preprocess:crossed"))
    assert len(digests | {bucketed, crossed}) == 3
