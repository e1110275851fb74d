"""The Airflow plugin: the jobs pages mounted in the api-server, their entries in the UI's
navigation and on a DAG's page, and the "Elastic job" link on training task instances.

Registered through the ``airflow.plugins`` entry point; ``plugins/airflow_rover_ui.py`` at the
top of the repository is the same plugin for a deployment's plugins folder. Plugins are loaded
by every Airflow component: the app (and the api-server modules it needs) is built on its
first request, in the api-server only.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk.plugins_manager import AirflowPlugin

from airflow_rover.operators.job_link import UI_PREFIX, ElasticJobLink


class LazyApp:
    """An ASGI app that builds the jobs app on its first call."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from airflow_rover.plugins.ui_app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class RoverPlugin(AirflowPlugin):
    name = "airflow_rover"
    fastapi_apps = [{"app": LazyApp(), "url_prefix": UI_PREFIX, "name": "airflow-rover jobs"}]
    external_views = [
        {
            "name": "Elastic jobs",
            "href": f"{UI_PREFIX}/jobs",
            "destination": "nav",
            "url_route": "elastic-jobs",
            "category": "browse",
        },
        {
            "name": "Elastic jobs",
            "href": f"{UI_PREFIX}/jobs?dag_id={{DAG_ID}}",
            "destination": "dag",
            "url_route": "elastic-jobs-of-dag",
        },
    ]
    operator_extra_links = [ElasticJobLink()]
