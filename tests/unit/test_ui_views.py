"""What the UI makes of a job: its line on the jobs page, its plan timeline, its throughput
chart and its share of a cluster budget, from the statuses and records the job really writes."""

from __future__ import annotations

from pathlib import Path

from airflow_rover.core.optimizer import Budget
from airflow_rover.core.spec import ResourcePlan
from airflow_rover.history.launches import Launch, LaunchIndex
from airflow_rover.history.store import HistoryStore
from airflow_rover.plugins.chart import HEIGHT, PAD, WIDTH, throughput_chart
from airflow_rover.plugins.job_views import (
    WAITING_FOR_APPROVAL,
    WAITING_FOR_BUDGET,
    job_page,
    job_row,
    plan_lines,
)

PLAN = {"num_ps": 1, "num_workers": 2, "ps_cpu": 1.0, "worker_cpu": 2.0}


def launch(**changes: object) -> Launch:
    values: dict[str, object] = {
        "job_id": "rover-daily.train-0123456789",
        "dag_id": "rover_daily",
        "task_id": "train",
        "run_id": "scheduled__2026-11-25",
        "job_dir": "/nowhere",
        "launcher": "local",
        "checkpoint_policy": "cpr",
        "launched_at": 100.0,
    }
    values.update(changes)
    return Launch(**values)  # type: ignore[arg-type]


def running_status(**changes: object) -> dict[str, object]:
    status: dict[str, object] = {
        "state": "running",
        "plan": ResourcePlan.model_validate(PLAN).model_dump(),
        "throughput": 812.5,
        "started_at": 101.0,
        "duration_s": 30.0,
        "progress": {
            "samples_done": 4000,
            "samples_total": 10000,
            "shards": {"todo": 3, "doing": 2, "done": 5, "quarantined": 0},
        },
        "plans": [
            {
                "id": 1,
                "at": 110.0,
                "plan": PLAN,
                "rule": "pareto",
                "reason": "faster",
                "state": "applied",
            },
            {
                "id": 2,
                "at": 120.0,
                "plan": {**PLAN, "num_workers": 4},
                "rule": "idle_ps",
                "reason": "PS idle",
                "state": "proposed",
            },
        ],
        "throughput_history": [
            {"at": 111.0, "samples_per_second": 500.0},
            {"at": 113.0, "samples_per_second": 800.0},
            {"at": 115.0, "samples_per_second": 812.5},
        ],
        "recovery": {"pls": 0.02, "lost_samples": 64, "checkpoint_history": [{"id": 1}]},
    }
    status.update(changes)
    return status


def test_a_running_jobs_row_comes_from_its_status() -> None:
    row = job_row(launch(), None, running_status())
    assert (row.state, row.policy, row.samples_per_second) == ("running", "cpr", 812.5)
    assert row.running and row.plan.startswith("1 PS x 1 CPU")


def test_an_ended_record_wins_over_the_status() -> None:
    ended = {
        "job_id": "j",
        "outcome": "succeeded",
        "auc": 0.77,
        "samples_per_second": 900.0,
        "duration_s": 41.0,
        "final_plan": PLAN,
    }
    row = job_row(launch(), ended, running_status())
    assert (row.state, row.auc, row.samples_per_second, row.duration_s) == (
        "succeeded",
        0.77,
        900.0,
        41.0,
    )
    assert not row.running


def test_a_launch_without_status_is_pending() -> None:
    row = job_row(launch(), None, None)
    assert (row.state, row.started_at) == ("pending", 100.0)


def test_a_proposal_says_what_it_waits_for() -> None:
    plans = running_status()["plans"]
    assert [line.state for line in plan_lines(plans, False, False, True)] == ["proposed", "applied"]
    budget = plan_lines(plans, True, False, True)
    assert budget[0].state == WAITING_FOR_BUDGET and not budget[0].actionable
    approval = plan_lines(plans, True, True, True)
    assert approval[0].state == WAITING_FOR_APPROVAL and approval[0].actionable
    assert not approval[1].actionable  # an applied plan has nothing left to decide
    ended = plan_lines(plans, True, True, False)  # the job ended: nothing waits any more
    assert ended[0].state == "proposed" and not ended[0].actionable


def test_the_job_page_gathers_shards_points_checkpoints_and_budget() -> None:
    budget = {"name": "shared", "cpu": 16.0}
    other = ResourcePlan.model_validate({**PLAN, "num_workers": 3})
    mine = ResourcePlan.model_validate(PLAN)
    held = {"other-job": Budget.used(other), "rover-daily.train-0123456789": Budget.used(mine)}
    page = job_page(launch(cluster_budget=budget), None, running_status(), held)
    assert page.shards == {"todo": 3, "doing": 2, "done": 5, "quarantined": 0}
    assert page.throughput == [(111.0, 500.0), (113.0, 800.0), (115.0, 812.5)]
    assert page.checkpoints == [{"id": 1}] and "checkpoint_history" not in page.recovery
    assert page.recovery["pls"] == 0.02
    assert page.budget is not None
    assert (page.budget.job_cpu, page.budget.all_cpu, page.budget.jobs) == (5.0, 12.0, 2)
    # what the registry says the job holds counts: its data workers' cores besides its plan
    held["rover-daily.train-0123456789"] = (7.0, 9216.0)
    page = job_page(launch(cluster_budget=budget), None, running_status(), held)
    assert page.budget is not None
    assert (page.budget.job_cpu, page.budget.all_cpu) == (7.0, 14.0)


def test_an_ended_job_draws_the_samples_the_history_kept() -> None:
    ended = {
        "job_id": "j",
        "outcome": "failed",
        "throughput": [
            {"at": 5.0, "samples_per_second": 10.0},
            {"at": 1.0, "samples_per_second": 20.0},
        ],
    }
    page = job_page(launch(), ended, None)
    assert page.throughput == [(1.0, 20.0), (5.0, 10.0)] and page.budget is None


def test_the_chart_spans_the_box_and_peaks_at_the_top() -> None:
    chart = throughput_chart([(10.0, 0.0), (20.0, 50.0), (30.0, 100.0)])
    assert chart is not None
    points = [tuple(map(float, p.split(","))) for p in chart.points.split()]
    assert points[0] == (PAD, HEIGHT - PAD)
    assert points[-1] == (WIDTH - PAD, PAD)
    assert (chart.peak, chart.last, chart.span_s, chart.count) == (100.0, 100.0, 20.0, 3)
    assert throughput_chart([(1.0, 5.0)]) is None


def test_the_launch_index_keeps_one_row_per_job(tmp_path: Path) -> None:
    with HistoryStore(f"sqlite:///{tmp_path / 'h.db'}") as store:
        index = LaunchIndex(store)
        index.record(launch(try_number=1, launched_at=1.0))
        index.record(launch(try_number=2, launched_at=2.0, cluster_budget={"name": "b"}))
        index.record(launch(job_id="other-1", dag_id="etl", launched_at=3.0))
        assert [(x.job_id, x.try_number) for x in index.list()] == [
            ("other-1", None),
            ("rover-daily.train-0123456789", 2),
        ]
        assert [x.job_id for x in index.list({"etl"})] == ["other-1"]
        assert index.list(set()) == []
        got = index.get("rover-daily.train-0123456789")
        assert got is not None and got.cluster_budget == {"name": "b"}
        assert index.get("nope") is None


def test_a_chart_of_zeros_reads_zero_and_lies_flat() -> None:
    chart = throughput_chart([(0.0, 0.0), (2.0, 0.0)])
    assert chart is not None and chart.peak == 0.0
    assert {p.split(",")[1] for p in chart.points.split()} == {f"{HEIGHT - PAD:.1f}"}
