"""The plugin's FastAPI app, mounted by the api-server at ``/rover``: the jobs page, the job page
(and the panel of it that refreshes while the job runs), their JSON, and the actions.

Every route authenticates the caller and checks the job's DAG with the auth manager
(``access``); the pages use relative links only (the api-server may sit behind a prefix).
"""

import dataclasses
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response, status
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from pydantic import BaseModel, Field

from airflow_rover.core.plans import PlanRecord, plan_records
from airflow_rover.history.launches import Launch
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.plugins.access import (
    UserDep,
    readable_dag_ids,
    require_dag_access,
    require_json,
)
from airflow_rover.plugins.chart import throughput_chart
from airflow_rover.plugins.job_source import JobSource
from airflow_rover.plugins.job_views import JobPage, JobRow

REFRESH_S = 5
PAGE_HEADERS = {
    "Content-Security-Policy": "frame-ancestors 'self'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
JobIdPath = Annotated[str, PathParam(pattern=r"^[a-z0-9][a-z0-9.-]{0,199}$")]

_templates = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(["html"]),
)
_templates.filters["when"] = lambda t: (
    time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) if t else ""
)
_templates.filters["secs"] = lambda s: f"{s:.0f} s" if isinstance(s, int | float) else ""
_templates.filters["num"] = lambda v, d=1: (  # a missing figure (or an odd one) shows empty
    f"{v:,.{d}f}" if isinstance(v, int | float) else ""
)


class StopBody(BaseModel):
    reason: str = Field(default="", max_length=500)


class DeclineBody(BaseModel):
    reason: str = Field(default="", max_length=500)


def _html(name: str, **values: Any) -> HTMLResponse:
    return HTMLResponse(_templates.get_template(name).render(**values))


def create_app(source: JobSource | None = None) -> FastAPI:
    """The app; ``source`` reads the jobs (default: the history store of ``[rover]
    history_conn_id`` in Airflow's configuration, else the operator's default)."""
    app = FastAPI(title="airflow-rover elastic jobs", docs_url=None, redoc_url=None)
    jobs = source or JobSource(_configured_history_conn_id())

    @app.middleware("http")
    async def page_headers(request: Request, call_next: Any) -> Response:
        """Framed by Airflow's own UI only; never cached (a job's figures change)."""
        response: Response = await call_next(request)
        response.headers.update(PAGE_HEADERS)
        return response

    async def readable_page(job_id: JobIdPath, user: UserDep) -> JobPage:
        launch, ended = await jobs.launch(job_id)
        dag_id = launch.dag_id if launch else (ended or {}).get("dag_id")
        if dag_id is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no job {job_id!r}")
        await require_dag_access(user, "GET", dag_id)
        return await jobs.page(launch, ended)

    ReadablePage = Annotated[JobPage, Depends(readable_page)]

    async def job_rows(
        user: UserDep,
        dag_id: Annotated[str | None, Query(max_length=250)] = None,
        state: Annotated[str | None, Query(max_length=30)] = None,
    ) -> list[JobRow]:
        readable = await readable_dag_ids(user)
        return await jobs.rows(readable, dag_id or None, state or None)

    Rows = Annotated[list[JobRow], Depends(job_rows)]

    @app.get("/jobs", response_class=HTMLResponse)
    async def jobs_page(rows: Rows, dag_id: str | None = None, state: str | None = None) -> Any:
        dags = sorted({r.dag_id for r in rows if r.dag_id})
        states = sorted({r.state for r in rows})
        return _html(
            "jobs.html", rows=rows, dag_id=dag_id or "", state=state or "", dags=dags, states=states
        )

    @app.get("/jobs/{job_id}", response_class=HTMLResponse)
    async def job_html(page: ReadablePage) -> Any:
        return _html(
            "job.html", page=page, chart=throughput_chart(page.throughput), refresh=REFRESH_S
        )

    @app.get("/jobs/{job_id}/panel", response_class=HTMLResponse)
    async def job_panel(page: ReadablePage) -> Any:
        return _html("job_panel.html", page=page, chart=throughput_chart(page.throughput))

    @app.get("/api/jobs")
    async def jobs_json(rows: Rows) -> list[dict[str, Any]]:
        return [dataclasses.asdict(r) for r in rows]

    @app.get("/api/jobs/{job_id}")
    async def job_json(page: ReadablePage) -> dict[str, Any]:
        data = dataclasses.asdict(page)
        data.pop("launch", None)  # where its directory is: the server's business
        return data

    async def running_launch(job_id: JobIdPath, user: UserDep) -> Launch:
        launch, _ = await jobs.launch(job_id)
        if launch is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no launched job {job_id!r}")
        await require_dag_access(user, "PUT", launch.dag_id)
        return launch

    Editable = Annotated[Launch, Depends(running_launch)]
    Json = Depends(require_json)

    @app.post("/api/jobs/{job_id}/stop", dependencies=[Json])
    async def stop(launch: Editable, body: StopBody, user: UserDep) -> dict[str, str]:
        reason = f"stopped from the Airflow UI by {user.get_name()}" + (
            f": {body.reason}" if body.reason else ""
        )
        hook = jobs.hook(launch)
        await hook.async_stop(reason, final=True)  # a person decided: no retry resumes it
        return {"state": str((await hook.async_get_status()).get("state"))}

    @app.post("/api/jobs/{job_id}/plans/{plan_id}/approve", dependencies=[Json])
    async def approve(launch: Editable, plan_id: int) -> dict[str, Any]:
        hook = jobs.hook(launch)
        await _still_proposed(hook, plan_id)
        record: PlanRecord = await _plan_call(hook.async_apply_plan(plan_id))
        return record.to_json()

    @app.post("/api/jobs/{job_id}/plans/{plan_id}/decline", dependencies=[Json])
    async def decline(
        launch: Editable, plan_id: int, body: DeclineBody, user: UserDep
    ) -> dict[str, Any]:
        reason = f"by {user.get_name()} in the Airflow UI" + (
            f": {body.reason}" if body.reason else ""
        )
        record = await _plan_call(jobs.hook(launch).async_decline_plan(plan_id, reason))
        return record.to_json()

    return app


async def _plan_call(call: Any) -> PlanRecord:
    """A plan action's record; the master's refusal (no such plan, not proposed) passed on
    with its status and reason, a master that does not answer as 503."""
    try:
        record: PlanRecord = await call
    except httpx.HTTPStatusError as exc:
        detail = _detail(exc.response)
        raise HTTPException(exc.response.status_code, detail) from None
    except RuntimeError as exc:  # the job has no master (it ended)
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
    except (httpx.HTTPError, ValueError) as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, f"the job's master did not answer: {exc}"
        ) from None
    return record


async def _still_proposed(hook: ElasticJobHook, plan_id: int) -> None:
    """409 unless plan ``plan_id`` waits to be applied (the master answers an apply of an
    ended plan with the plan as it is)."""
    job = await hook.async_get_status()
    record = next((r for r in plan_records(job.get("plans")) if r.id == plan_id), None)
    if record is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"the job has no plan {plan_id}")
    if not record.pending:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"plan {plan_id} is {record.state}: only a proposed plan can be approved",
        )


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail") or response.text)
    except ValueError:
        return response.text


def _configured_history_conn_id() -> str | None:
    from airflow.configuration import conf

    return conf.get("rover", "history_conn_id", fallback=None) or None
