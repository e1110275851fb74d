"""The master's HTTP control API (FastAPI). Every request needs the job's bearer token, checked
(with the body's size) before its body is read (``http_guard``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from airflow_rover.master.http_guard import MAX_BODY_BYTES, TokenAndSizeGuard
from airflow_rover.master.job import JobMaster
from airflow_rover.master.ps_set import MAX_WAIT_S
from airflow_rover.rpc import master_api

P = master_api.API_PREFIX
T = TypeVar("T")


def create_app(master: JobMaster, token: str, max_body: int = MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI(title="airflow-rover job master", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.include_router(_node_routes(master), prefix=P)
    app.include_router(_job_routes(master), prefix=P)
    app.add_middleware(TokenAndSizeGuard, token=token, max_body=max_body)
    return app


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """422 naming what is wrong; a value JSON cannot carry back (NaN, a number too large for
    a float) is quoted as text instead of failing the answer with a 500."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    safe = [{**e, "input": _json_safe(e["input"])} if "input" in e else e for e in errors]
    return JSONResponse(status_code=422, content={"detail": jsonable_encoder(safe)})


def _json_safe(value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _known(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``; an unknown node or plan (KeyError) is a 404."""
    try:
        return fn(*args)
    except KeyError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc


def _node_routes(master: JobMaster) -> APIRouter:
    """What the job's nodes call: the PS set, readiness, progress, shards, the evaluation."""
    router = APIRouter()

    @router.get("/cluster")
    def get_cluster(
        after: Annotated[int | None, Query(ge=0)] = None,
        wait_s: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
    ) -> master_api.ClusterInfo:
        """With ``after``: waits up to ``wait_s`` for a PS set past that version."""
        try:
            return master.cluster(after, wait_s)
        except LookupError as exc:
            raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc

    @router.post("/nodes/{node_id}/ready")
    def node_ready(node_id: str, body: master_api.NodeReady) -> dict[str, bool]:
        _known(master.node_ready, node_id, body)
        return {"ok": True}

    @router.post("/nodes/{node_id}/crash")
    def node_crash(node_id: str, body: master_api.NodeCrash) -> dict[str, bool]:
        _known(master.node_crashed, node_id, body)
        return {"ok": True}

    @router.post("/nodes/{node_id}/heartbeat")
    def heartbeat(node_id: str, body: master_api.Heartbeat) -> dict[str, bool]:
        return {"stop": _known(master.heartbeat, node_id, body)}

    @router.post("/shards/lease")
    def lease(body: master_api.LeaseRequest) -> master_api.LeaseReply:
        return _known(master.lease, body.node_id, body.ps_set_version)

    @router.post("/shards/{shard_id}/done")
    def shard_done(shard_id: int, body: master_api.ShardDone) -> master_api.ShardDoneReply:
        return master_api.ShardDoneReply(accepted=master.shard_done(shard_id, body))

    @router.post("/nodes/{node_id}/release")
    def release(node_id: str) -> dict[str, int]:
        return {"released": _known(master.release_shards, node_id)}

    @router.post("/nodes/{node_id}/evaluate")
    def claim_evaluation(node_id: str) -> dict[str, bool]:
        """A worker done training asks whether it scores the held-out split."""
        return {"evaluate": _known(master.claim_evaluation, node_id)}

    @router.post("/evaluation")
    def evaluation(body: master_api.EvalReport) -> dict[str, bool]:
        try:
            _known(master.report_evaluation, body)
        except PermissionError as exc:
            raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
        return {"ok": True}

    return router


def _job_routes(master: JobMaster) -> APIRouter:
    """What Airflow and people call: the status, plans (propose, apply, decline), stop."""
    router = APIRouter()

    @router.get("/status")
    def get_status() -> dict[str, Any]:
        return master.status()

    @router.get("/plans")
    def get_plans() -> list[dict[str, Any]]:
        plans: list[dict[str, Any]] = master.status()["plans"]
        return plans

    @router.post("/plans")
    def request_plan(body: master_api.PlanRequest) -> dict[str, Any]:
        try:
            return master.request_plan(body).to_json()
        except ValueError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None

    @router.post("/plans/{plan_id}/apply")
    def apply_plan(plan_id: int) -> dict[str, Any]:
        return _known(master.apply_plan, plan_id).to_json()

    @router.post("/plans/{plan_id}/decline")
    def decline_plan(plan_id: int, body: master_api.DeclineRequest) -> dict[str, Any]:
        """409 for a plan no longer proposed (applied, declined, superseded)."""
        try:
            return _known(master.decline_plan, plan_id, body.reason).to_json()
        except ValueError as exc:
            raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None

    @router.post("/data-workers/cap")
    def cap_data_workers(body: master_api.DataWorkerCap) -> dict[str, Any]:
        return master.cap_data_workers(body.cap)

    @router.post("/stop")
    def stop(body: master_api.StopRequest) -> dict[str, str]:
        master.request_stop(body.reason, body.final)
        return {"state": master.status()["state"]}

    return router
