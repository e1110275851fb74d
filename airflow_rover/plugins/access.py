"""Who may see and act on a job: the api-server's auth manager decides, per the job's DAG.

Airflow does not protect a plugin's FastAPI app: every route here takes the user from the
request (the UI's ``_token`` cookie or an ``Authorization: Bearer`` JWT; none: 401) and asks
the auth manager about the DAG the job belongs to (read: GET on its task instances; stop,
approve, decline: PUT). The DAG is the one recorded for the job, never one the request names.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from airflow.api_fastapi.auth.managers.models.resource_details import (
    DagAccessEntity,
    DagDetails,
)
from airflow.api_fastapi.core_api.security import get_user
from airflow.models.dag import DagModel
from fastapi import Depends, HTTPException, Request, status

Method = Literal["GET", "PUT"]
UserDep = Annotated[BaseUser, Depends(get_user)]


def _allowed(user: BaseUser, method: Method, dag_id: str) -> bool:
    details = DagDetails(id=dag_id, team_name=DagModel.get_team_name(dag_id))
    return get_auth_manager().is_authorized_dag(
        method=method,
        access_entity=DagAccessEntity.TASK_INSTANCE,
        details=details,
        user=user,
    )


async def require_dag_access(user: BaseUser, method: Method, dag_id: str | None) -> None:
    """403 unless ``user`` may ``method`` the task instances of ``dag_id`` (a job without a
    DAG is an admin's only: it is checked as the DAG ``~``, which no DAG rule names)."""
    allowed = await asyncio.to_thread(_allowed, user, method, dag_id or "~")
    if not allowed:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "Forbidden")


async def readable_dag_ids(user: BaseUser) -> set[str]:
    """The DAGs whose jobs ``user`` may see."""
    manager = get_auth_manager()
    return await asyncio.to_thread(manager.get_authorized_dag_ids, user=user, method="GET")


def require_json(request: Request) -> None:
    """Actions take JSON only: a cross-site form (which carries the cookie) cannot send it
    without the browser asking first, so a page elsewhere cannot act as the user."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise HTTPException(
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, "actions take a JSON body (application/json)"
        )
