"""An ended job's data workers in the history store: the section and its scaling decisions
round trip, a job without them records none, and a store made before the data workers' tables
existed gets them on first use with its older jobs still loading."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import inspect, text
from test_history_store import final_status, spec_for

from airflow_rover.history.records import record_from_status
from airflow_rover.history.store import HistoryStore

DECISIONS = [
    {"at": 1003.0, "count": 2, "previous": 1, "rule": "input-wait", "reason": "waited 31%"},
    {"at": 1007.0, "count": 1, "previous": 2, "rule": "revert", "reason": "no gain <b>"},
]
SECTION: dict[str, Any] = {
    "mode": "auto",
    "target": 1,
    "running": 1,
    "min": 0,
    "max": 4,
    "input_wait": 0.04,
    "ready_fill": 0.7,
    "samples_per_s": 12345.0,
    "decisions": DECISIONS,
}
DATA_NODE = {"id": "data-0", "role": "data", "state": "succeeded", "steps": 40, "samples": 5120,
             "step_time_ms": 3.5, "exit_code": 0, "restarts": 0}  # fmt: skip


def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'history.db'}"


def test_the_data_workers_and_their_decisions_round_trip(tmp_path: Path) -> None:
    status = final_status(data_workers=SECTION)
    status["nodes"] = [*status["nodes"], DATA_NODE]
    record = record_from_status(status, spec_for())
    assert record.data_worker_decisions == DECISIONS
    with HistoryStore(url(tmp_path)) as store:
        store.record_job(record)
        store.record_job(record)  # an upsert: the decisions once, not twice
        job = store.get_job(record.job_id)
    assert job is not None
    assert job["data_workers"] == SECTION
    assert {n["node_id"]: n["role"] for n in job["nodes"]}["data-0"] == "data"


def test_a_job_without_data_workers_records_none(tmp_path: Path) -> None:
    record = record_from_status(final_status(), spec_for())
    assert record.data_workers is None and record.data_worker_decisions == []
    with HistoryStore(url(tmp_path)) as store:
        store.record_job(record)
        job = store.get_job(record.job_id)
    assert job is not None and job["data_workers"] is None and job["plans"]


def test_a_store_from_before_the_data_workers_loads_its_jobs_and_records_new_ones(
    tmp_path: Path,
) -> None:
    with HistoryStore(url(tmp_path)) as old:
        old.record_job(record_from_status(final_status("old.job-1"), spec_for("old.job-1")))
        with old.engine.begin() as conn:  # the tables as an older version left them
            conn.execute(text("DROP TABLE rover_job_data_worker_decisions"))
            conn.execute(text("DROP TABLE rover_job_data_workers"))
        assert "rover_job_data_workers" not in inspect(old.engine).get_table_names()
    with HistoryStore(url(tmp_path)) as store:
        job = store.get_job("old.job-1")
        assert job is not None and job["data_workers"] is None
        status = final_status("new.job-2", data_workers=SECTION)
        store.record_job(record_from_status(status, spec_for("new.job-2")))
        new = store.get_job("new.job-2")
    assert new is not None and new["data_workers"]["decisions"] == DECISIONS


def test_values_not_as_the_master_writes_them_are_kept_as_missing() -> None:
    odd = {"mode": "auto", "target": "two", "input_wait": True,
           "decisions": ["?", {"count": 3.0, "reason": None}]}  # fmt: skip
    record = record_from_status(final_status(data_workers=odd), spec_for())
    assert record.data_workers is not None
    assert (record.data_workers["target"], record.data_workers["input_wait"]) == (None, None)
    assert record.data_worker_decisions == [
        {"at": None, "previous": None, "count": 3, "rule": "", "reason": ""}
    ]
