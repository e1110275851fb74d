"""The data workers as ``rover status`` prints them (a short block; ``--full``: every
decision), as a trigger's event carries them (the last few decisions), and as the operator
records them once the job ended (every decision, from the job's ``state.json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_history_store import event as task_event
from test_history_store import final_status, operator_and_context
from test_triggers import first_event, job_state, make_job

from airflow_rover.cli import STATUS_DECISIONS, main
from airflow_rover.core.job_dir import JobDir, atomic_write_json
from airflow_rover.core.job_status import (
    EVENT_DECISIONS,
    data_workers_lines,
    with_decisions_from,
    without_history,
)
from airflow_rover.history.store import HistoryStore
from airflow_rover.hooks.history_store import default_history_url
from airflow_rover.triggers.elastic_job import ElasticJobTrigger

DECISIONS = [
    {"at": 1_764_200_000.0 + 60 * i, "count": 1 + (i + 1) % 2, "previous": 1 + i % 2,
     "rule": "input-wait" if i % 2 == 0 else "revert", "reason": f"decision {i}"}
    for i in range(12)
]  # fmt: skip


def section(decisions: list[dict[str, Any]] = DECISIONS) -> dict[str, Any]:
    return {
        "mode": "auto",
        "target": 2,
        "running": 1,
        "min": 0,
        "max": 4,
        "input_wait": 0.3125,
        "ready_fill": 0.7,
        "samples_per_s": 12345.0,
        "decisions": decisions,
    }


def test_the_block_says_mode_counts_figures_and_the_last_decisions() -> None:
    lines = data_workers_lines({"data_workers": section()}, last=3)
    assert lines[0] == (
        "data workers: auto 0-4, target 2, running 1; input wait 31.2%, ready queue 70% full, "
        "trainers 12,345.0 samples/s"
    )
    assert lines[1] == "  (9 earlier decisions: --full shows them)"
    assert lines[3] == "  2025-11-26 23:43:20  1 -> 2  input-wait: decision 10"
    assert [line.rsplit(" ", 1)[1] for line in lines[2:]] == ["9", "10", "11"]
    assert len(data_workers_lines({"data_workers": section()}, last=None)) == 1 + 12
    fixed = data_workers_lines({"data_workers": {"mode": "fixed", "target": 2, "running": 2}})
    assert fixed == ["data workers: fixed, target 2, running 2"]
    assert data_workers_lines({"data_workers": {"mode": "off"}}) == []
    assert data_workers_lines({"state": "running"}) == []


def test_rover_status_prints_the_block_on_stderr_and_all_decisions_with_full(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_job(tmp_path, state=job_state("succeeded", 10_000, data_workers=section()))
    assert main(["status", "--job-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert len(json.loads(out)["data_workers"]["decisions"]) == EVENT_DECISIONS
    assert err.splitlines()[0].startswith("data workers: auto 0-4, target 2, running 1;")
    assert err.count("  2025-") == STATUS_DECISIONS and "decision 11" in err
    assert main(["status", "--job-dir", str(tmp_path), "--full"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["data_workers"]["decisions"] == DECISIONS
    assert err.count("  2025-") == 12 and "earlier" not in err


def test_rover_status_of_a_job_without_data_workers_prints_no_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_job(tmp_path, state=job_state("succeeded", 10_000))
    assert main(["status", "--job-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().err == ""


def test_an_event_carries_the_last_decisions_and_state_json_all(tmp_path: Path) -> None:
    layout = make_job(tmp_path, state=job_state("succeeded", 10_000, data_workers=section()))
    payload = first_event(ElasticJobTrigger(str(tmp_path), poll_interval=0.1))
    carried = payload["job"]["data_workers"]
    assert carried["decisions"] == DECISIONS[-EVENT_DECISIONS:]
    assert {k: v for k, v in carried.items() if k != "decisions"} == {
        k: v for k, v in section().items() if k != "decisions"
    }
    assert json.loads(layout.state_file.read_text())["data_workers"]["decisions"] == DECISIONS


def test_decisions_come_back_only_from_the_same_jobs_state_json() -> None:
    full = {"job_id": "a", "data_workers": section()}
    slim = without_history(full)
    assert with_decisions_from(slim, full) == full
    assert with_decisions_from(slim, {**full, "job_id": "b"}) == slim
    assert with_decisions_from(slim, None) == slim
    assert with_decisions_from({"job_id": "a"}, full) == {"job_id": "a"}


def test_the_ended_jobs_record_keeps_every_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    operator, context = operator_and_context(tmp_path)
    status = final_status(data_workers=section())
    atomic_write_json(JobDir(tmp_path / "job").state_file, status)
    operator.execute_complete(context, task_event("success", without_history(status)))
    with HistoryStore(default_history_url()) as history:
        job = history.get_job(status["job_id"])
    assert job is not None and job["data_workers"] == section()
