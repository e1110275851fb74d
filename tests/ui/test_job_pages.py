"""The elastic jobs pages in a real api-server (simple auth manager, teams), loaded through the
plugin's entry point, for jobs that really ran: a short CPR job run with ``dag.test()``, then a
long job whose proposals wait for a person, acted on from the browser while it runs.

Set ``ROVER_UI_SCREENSHOTS=docs/img`` to write the screenshots the docs show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from airflow_server import AirflowUi
from browser_login import login
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from airflow_rover.data.synthetic import SyntheticConfig, generate_dataset
from airflow_rover.history.launches import LaunchIndex
from airflow_rover.history.store import HistoryStore
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.operators.job_identity import job_id_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.ui]
JOBS_DAGS = Path(__file__).with_name("jobs_dags")
RUN_DAG = Path(__file__).parents[1] / "integration" / "run_dag.py"
DAILY, APPROVAL = "rover_ui_daily", "rover_ui_approval"
WAIT_S = 120


@pytest.fixture(scope="module")
def ui_dags_folder() -> Path:
    return JOBS_DAGS


def _screenshot(browser: webdriver.Chrome, name: str, tmp: Path) -> Path:
    folder = Path(os.environ.get("ROVER_UI_SCREENSHOTS") or tmp)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    browser.set_window_size(1400, max(1000, _page_height(browser)))
    assert browser.save_screenshot(str(path))
    return path


def _page_height(browser: webdriver.Chrome) -> int:
    return int(browser.execute_script("return document.body.scrollHeight") or 0)


def _get(ui: AirflowUi, user: str | None, path: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {ui.token(user)}"} if user else {}
    return httpx.get(f"{ui.base_url}{path}", headers=headers, timeout=30)


def _post(ui: AirflowUi, user: str | None, path: str, body: Any = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {ui.token(user)}"} if user else {}
    return httpx.post(f"{ui.base_url}{path}", headers=headers, json=body or {}, timeout=60)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Any:
    config = SyntheticConfig(num_train=20_000, num_eval=2_000, seed=25)
    return generate_dataset(tmp_path_factory.mktemp("ui_data"), config)


@pytest.fixture(scope="module")
def daily(ui_run_dag: Callable[..., dict[str, Any]], data: Any) -> dict[str, Any]:
    """The short job's DAG run, ended: its outcome and its job id."""
    conf = {"train_data": str(data.train_dir), "eval_data": str(data.eval_dir)}
    outcome = ui_run_dag(DAILY, "2026-11-25", conf)
    assert outcome["state"] == "success", outcome
    return {**outcome, "job_id": job_id_for(DAILY, "train", outcome["run_id"])}


def test_unauthenticated_requests_get_401(airflow_ui: AirflowUi, daily: dict[str, Any]) -> None:
    job = daily["job_id"]
    for path in (
        "/rover/jobs",
        f"/rover/jobs/{job}",
        f"/rover/jobs/{job}/panel",
        "/rover/api/jobs",
        f"/rover/api/jobs/{job}",
    ):
        assert _get(airflow_ui, None, path).status_code == 401, path
    assert _post(airflow_ui, None, f"/rover/api/jobs/{job}/stop").status_code == 401


def test_a_user_without_access_to_the_dag_can_neither_see_nor_act(
    airflow_ui: AirflowUi, daily: dict[str, Any]
) -> None:
    job = daily["job_id"]
    assert _get(airflow_ui, "outsider", "/rover/api/jobs").json() == []
    for path in (f"/rover/jobs/{job}", f"/rover/jobs/{job}/panel", f"/rover/api/jobs/{job}"):
        assert _get(airflow_ui, "outsider", path).status_code == 403, path
    for action in ("stop", "plans/1/approve", "plans/1/decline"):
        answer = _post(airflow_ui, "outsider", f"/rover/api/jobs/{job}/{action}")
        assert answer.status_code == 403, (action, answer.text)
        answer = _post(airflow_ui, "viewer", f"/rover/api/jobs/{job}/{action}")
        assert answer.status_code == 403, (action, answer.text)  # reading is not editing
    assert [r["job_id"] for r in _get(airflow_ui, "viewer", "/rover/api/jobs").json()] == [job]
    form = httpx.post(
        f"{airflow_ui.base_url}/rover/api/jobs/{job}/stop",
        headers={"Authorization": f"Bearer {airflow_ui.token('ops')}"},
        data={"reason": "x"},
        timeout=30,
    )
    assert form.status_code == 415  # an action takes JSON only


def test_the_browser_opens_the_jobs_page_and_follows_the_tasks_link(
    airflow_ui: AirflowUi, browser: webdriver.Chrome, daily: dict[str, Any], tmp_path: Path
) -> None:
    job, run_id = daily["job_id"], daily["run_id"]
    result = daily["xcom"]["train:return_value"]
    detail = _get(airflow_ui, "viewer", f"/rover/api/jobs/{job}").json()
    viewer = airflow_ui.users["viewer"]
    nav_view = "/plugin/elastic-jobs"  # "Elastic jobs" in the navigation: the page in a frame
    login(browser, airflow_ui.base_url, viewer.name, viewer.password, next_path=nav_view)
    wait = WebDriverWait(browser, 30)
    frame = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "iframe[src*='/rover/jobs']"))
    browser.switch_to.frame(frame)
    row = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, f"tr[data-job-id='{job}']"))
    cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
    assert cells[:5] == [DAILY, run_id, "train", "succeeded", "cpr"], cells
    assert cells[7] == f"{result['auc']:.4f}"
    browser.switch_to.default_content()
    shot = _screenshot(browser, "ui-jobs.png", tmp_path)

    browser.get(f"{airflow_ui.base_url}/dags/{DAILY}/runs/{run_id}/tasks/train/details")
    wait.until(lambda d: d.find_element(By.LINK_TEXT, "Elastic job")).click()
    wait.until(lambda d: d.current_url.endswith(f"/rover/jobs/{job}"))
    chart = wait.until(lambda d: d.find_element(By.ID, "throughput-chart"))
    points = [rate for _, rate in detail["throughput"]]
    assert int(chart.get_attribute("data-points") or 0) == len(points) >= 2
    assert max(points) > 0
    assert float(chart.get_attribute("data-peak") or 0) == pytest.approx(max(points))
    shards = {
        e.get_attribute("data-shards"): int(e.text)
        for e in browser.find_elements(By.CSS_SELECTOR, "td[data-shards]")
    }
    accounting = result["accounting"]
    assert shards == {"todo": 0, "doing": 0, "done": accounting["shards"], "quarantined": 0}
    plans = browser.find_elements(By.CSS_SELECTOR, "#plans tr[data-plan-id]")
    assert plans and "1 PS x 1 CPU" in plans[-1].text and "initial" in plans[-1].text
    assert browser.find_element(By.ID, "pls").text == f"{result['recovery']['pls']:.4f}"
    assert browser.find_elements(By.CSS_SELECTOR, "#checkpoints tbody tr")
    print(f"\njobs page {shot}; job page {_screenshot(browser, 'ui-job.png', tmp_path)}")


@pytest.fixture(scope="module")
def approval_run(
    airflow_ui: AirflowUi, data: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The long job's DAG run, started in the background: its process, outcome file, job."""
    out = tmp_path_factory.mktemp("approval") / "outcome.json"
    conf = {"train_data": str(data.train_dir), "eval_data": str(data.eval_dir)}
    command = [sys.executable, str(RUN_DAG), APPROVAL, "2026-11-26", "--conf", json.dumps(conf)]
    log = (out.parent / "dag_test.log").open("w")
    proc = subprocess.Popen(
        [*command, "--out", str(out)], env=airflow_ui.env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        yield {"proc": proc, "out": out, "log": out.parent / "dag_test.log"}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log.close()


def _until(what: str, check: Callable[[], Any], log: Path) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {WAIT_S} s\n{log.read_text()[-6000:]}")


def _running_job(ui: AirflowUi, log: Path) -> dict[str, Any]:
    def started() -> dict[str, Any] | None:
        rows = [r for r in _get(ui, "ops", "/rover/api/jobs").json() if r["dag_id"] == APPROVAL]
        if not rows or rows[0]["state"] != "running":
            return None
        page = _get(ui, "ops", f"/rover/api/jobs/{rows[0]['job_id']}").json()
        return page if page["samples_done"] > 0 else None

    page: dict[str, Any] = _until("the approval job trains", started, log)
    return page


def _clicked(element: WebElement) -> bool:
    element.click()
    return True


def test_a_person_declines_approves_and_stops_a_running_job(
    airflow_ui: AirflowUi,
    browser: webdriver.Chrome,
    approval_run: dict[str, Any],
    daily: dict[str, Any],
    tmp_path: Path,
) -> None:
    log = approval_run["log"]
    page = _running_job(airflow_ui, log)
    job = page["row"]["job_id"]
    with HistoryStore(f"sqlite:///{airflow_ui.home / 'rover' / 'history.db'}") as store:
        launch = LaunchIndex(store).get(job)
    assert launch is not None and launch.plan_approval
    hook = ElasticJobHook(launch.job_dir)

    declined = hook.request_plan(num_workers=2, reason="more workers, please")
    ops = airflow_ui.users["ops"]
    login(browser, airflow_ui.base_url, ops.name, ops.password, next_path=f"/rover/jobs/{job}")
    # the panel refreshes itself every few seconds: a row read across a refresh is stale
    wait = WebDriverWait(browser, 60, ignored_exceptions=(StaleElementReferenceException,))
    row = f"#plans tr[data-plan-id='{declined.id}']"
    wait.until(lambda d: "waiting for approval" in d.find_element(By.CSS_SELECTOR, row).text)
    _screenshot(browser, "ui-job-approval.png", tmp_path)
    wait.until(lambda d: _clicked(d.find_element(By.CSS_SELECTOR, f"{row} button.decline")))
    wait.until(lambda d: "declined" in d.find_element(By.CSS_SELECTOR, row).text)

    approved = hook.request_plan(num_workers=2, reason="now, yes")
    path = f"/rover/api/jobs/{job}/plans/{approved.id}/approve"
    assert _post(airflow_ui, "viewer", path).status_code == 403
    answer = _post(airflow_ui, "ops", path)
    assert answer.status_code == 200, answer.text
    _until("two workers", lambda: hook.get_status()["plan"]["num_workers"] == 2, log)
    again = _post(airflow_ui, "ops", path)
    assert again.status_code == 409, again.text  # applied already: nothing to approve

    stop = _post(airflow_ui, "ops", f"/rover/api/jobs/{job}/stop", {"reason": "enough"})
    assert stop.status_code == 200, stop.text
    approval_run["proc"].wait(timeout=WAIT_S)
    outcome = json.loads(approval_run["out"].read_text())
    assert outcome["state"] == "failed"
    assert outcome["tasks"]["train"][1] == 1  # retries=1, yet not retried: a person stopped it
    status = hook.get_status()
    assert status["state"] == "stopped" and "by ops" in status["message"], status
