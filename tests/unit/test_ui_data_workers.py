"""The job page's data-workers panel: drawn from the status's ``data_workers`` section (or an
ended job's record of it), its decisions as a timeline, free text escaped, and the JSON API
carrying the section as the master wrote it."""

from __future__ import annotations

import dataclasses
from typing import Any

from test_ui_views import launch, running_status

from airflow_rover.plugins.chart import throughput_chart
from airflow_rover.plugins.data_worker_views import data_workers_panel
from airflow_rover.plugins.job_views import job_page
from airflow_rover.plugins.ui_app import _html

HOSTILE = '<script>alert("x")</script> & <img src=x onerror=alert(1)>'


def section(**changes: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "mode": "auto",
        "target": 3,
        "running": 2,
        "min": 1,
        "max": 4,
        "input_wait": 0.3125,
        "ready_fill": 0.7,
        "samples_per_s": 12345.0,
        "decisions": [
            {"at": 1000.0, "count": 2, "previous": 1, "rule": "input-wait", "reason": "waited 31%"},
            {"at": 1060.0, "count": 3, "previous": 2, "rule": "input-wait", "reason": HOSTILE},
        ],
    }
    values.update(changes)
    return values


def rendered(page: Any) -> str:
    return str(
        _html("job_panel.html", page=page, chart=throughput_chart(page.throughput)).body.decode()
    )


def test_the_panel_shows_counts_figures_and_decisions_newest_first() -> None:
    page = job_page(launch(), None, running_status(data_workers=section()))
    panel = page.data_workers_panel
    assert panel is not None
    assert (panel.mode, panel.target, panel.running, panel.min, panel.max) == ("auto", 3, 2, 1, 4)
    assert [(d.previous, d.count) for d in panel.decisions] == [(2, 3), (1, 2)]
    html = rendered(page)
    assert 'id="data-workers" data-mode="auto"' in html
    assert "3 / 2" in html  # target / running
    assert "31.2 %" in html and "70 %" in html and "12,345.0" in html
    assert "1970-01-01 00:17:40" in html and "2 → 3" in html and "1 → 2" in html
    assert html.index("2 → 3") < html.index("1 → 2")


def test_a_reason_is_text_never_markup() -> None:
    html = rendered(job_page(launch(), None, running_status(data_workers=section())))
    assert "<script>" not in html and "<img" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &lt;img" in html


def test_no_panel_without_data_workers_or_with_them_off() -> None:
    for status in (running_status(), running_status(data_workers={"mode": "off"})):
        page = job_page(launch(), None, status)
        assert page.data_workers_panel is None
        assert "Data workers" not in rendered(page)


def test_the_json_api_carries_the_section_as_is() -> None:
    dw = section()
    data = dataclasses.asdict(job_page(launch(), None, running_status(data_workers=dw)))
    assert data["data_workers"] == dw


def test_an_ended_job_shows_its_recorded_decisions_and_data_nodes() -> None:
    ended = {
        "job_id": "j",
        "outcome": "succeeded",
        "data_workers": section(decisions=section()["decisions"][:1]),
        "nodes": [{"node_id": "data-0", "role": "data", "steps": 40, "samples": 5120}],
    }
    page = job_page(launch(), ended, None)
    html = rendered(page)
    assert "1 → 2" in html and "waited 31%" in html
    assert 'data-node="data-0" data-role="data"' in html
    assert "batches served" in html


def test_values_not_as_the_master_writes_them_read_as_missing() -> None:
    panel = data_workers_panel(
        {
            "mode": "fixed",
            "target": "two",
            "running": True,
            "input_wait": None,
            "decisions": ["not a decision", {"count": 2, "reason": 7}],
        }
    )
    assert panel is not None
    assert (panel.target, panel.running, panel.input_wait, panel.min) == (None, None, None, None)
    assert [(d.previous, d.count, d.rule, d.reason) for d in panel.decisions] == [
        (None, 2, "", "7")
    ]
    assert data_workers_panel("auto") is None and data_workers_panel(None) is None
