"""The UI rig on Airflow's own pages and API: per-DAG access through teams, the login page in
headless Chromium, and 401 without a login."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from airflow_server import TEAM_A, TEAM_B, AirflowUi
from browser_login import COOKIE, login
from headless_chromium import ensure_chromium
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.ui]

RIG_PLUGINS = Path(__file__).with_name("rig_plugins")


def test_unauthenticated_api_request_gets_401(airflow_ui: AirflowUi) -> None:
    response = httpx.get(f"{airflow_ui.base_url}/api/v2/dags", timeout=30)
    assert response.status_code == 401, response.text


def test_each_bundle_belongs_to_its_team(airflow_ui: AirflowUi) -> None:
    assert airflow_ui.dag_teams == {"rig_team_a": TEAM_A, "rig_team_b": TEAM_B}


# (user, method, expected status) on team_a's DAG: its team reads (viewer) or reads and edits
# (user role); another team's user may do neither; an admin may do both.
TEAM_A_ACCESS = [
    ("admin", "GET", 200),
    ("admin", "PATCH", 200),
    ("ops", "GET", 200),
    ("ops", "PATCH", 200),
    ("viewer", "GET", 200),
    ("viewer", "PATCH", 403),
    ("outsider", "GET", 403),
    ("outsider", "PATCH", 403),
]


@pytest.mark.parametrize(("user", "method", "expected"), TEAM_A_ACCESS)
def test_team_a_dag_access_follows_the_users_team_and_role(
    airflow_ui: AirflowUi, user: str, method: str, expected: int
) -> None:
    response = httpx.request(
        method,
        f"{airflow_ui.base_url}/api/v2/dags/rig_team_a",
        headers={"Authorization": f"Bearer {airflow_ui.token(user)}"},
        json={"is_paused": False} if method == "PATCH" else None,
        timeout=30,
    )
    assert response.status_code == expected, response.text


def test_dag_list_shows_only_the_users_team(airflow_ui: AirflowUi) -> None:
    response = httpx.get(
        f"{airflow_ui.base_url}/api/v2/dags",
        headers={"Authorization": f"Bearer {airflow_ui.token('outsider')}"},
        timeout=30,
    )
    assert [dag["dag_id"] for dag in response.json()["dags"]] == ["rig_team_b"]


def test_viewer_logs_in_and_sees_the_dag_list(
    airflow_ui: AirflowUi, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    viewer = airflow_ui.users["viewer"]
    started = time.monotonic()
    login(browser, airflow_ui.base_url, viewer.name, viewer.password, next_path="/dags")
    logged_in = time.monotonic()
    dag_ids = WebDriverWait(browser, 30).until(
        lambda d: [e.text for e in d.find_elements(By.CSS_SELECTOR, "[data-testid=dag-id]")]
    )
    shown = time.monotonic()
    screenshot = tmp_path / "dag-list-viewer.png"
    assert browser.save_screenshot(str(screenshot))
    print(
        f"\nlogin {logged_in - started:.1f} s, DAG list shown {shown - logged_in:.1f} s later; "
        f"screenshot {screenshot}"
    )
    assert browser.get_cookie(COOKIE)
    assert browser.title == "Dags - Airflow"
    assert browser.find_element(By.CSS_SELECTOR, "[data-testid=nav-sidebar]").is_displayed()
    assert dag_ids == ["rig_team_a"]  # team_b's DAG is not listed for team_a's viewer


def test_without_a_browser_and_not_root_the_test_skips_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium chromium-driver"):
        ensure_chromium()


@pytest.fixture(scope="module")
def ui_plugins_folder() -> Path:
    """The rig's own plugin: an extra link on every task instance (``rig_link_plugin.py``)."""
    return RIG_PLUGINS


def test_task_instance_page_shows_the_extra_link_and_outsiders_get_403(
    airflow_ui: AirflowUi, browser: webdriver.Chrome, ui_run_dag: Callable[..., dict[str, Any]]
) -> None:
    outcome = ui_run_dag("rig_team_a", "2026-01-01")
    assert outcome["state"] == "success", outcome
    run_id = outcome["run_id"]
    links_api = f"/api/v2/dags/rig_team_a/dagRuns/{run_id}/taskInstances/noop/links"
    answers = {
        user: httpx.get(
            f"{airflow_ui.base_url}{links_api}",
            headers={"Authorization": f"Bearer {airflow_ui.token(user)}"},
            timeout=30,
        )
        for user in ("viewer", "outsider")
    }
    assert answers["outsider"].status_code == 403, answers["outsider"].text
    expected = f"/rig/rig_team_a/{quote(run_id)}/noop"
    assert answers["viewer"].json()["extra_links"] == {"Rig link": expected}

    viewer = airflow_ui.users["viewer"]
    # Extra links are on the task instance's Details tab, under "Extra Links", as <a> buttons.
    page = f"/dags/rig_team_a/runs/{run_id}/tasks/noop/details"
    login(browser, airflow_ui.base_url, viewer.name, viewer.password, next_path=page)
    link = WebDriverWait(browser, 30).until(lambda d: d.find_element(By.LINK_TEXT, "Rig link"))
    print(f"\ntask instance page {browser.current_url}")
    assert link.get_attribute("href") == f"{airflow_ui.base_url}{expected}"
    assert link.get_attribute("target") == "_self"  # same origin: opens in the same tab
