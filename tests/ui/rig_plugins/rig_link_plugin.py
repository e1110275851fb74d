"""A plugin for the UI rig's own tests: an extra link on every task instance, to find where
Airflow's task instance page renders extra links and how."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import BaseOperatorLink


class RigLink(BaseOperatorLink):
    name = "Rig link"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return f"/rig/{quote(ti_key.dag_id)}/{quote(ti_key.run_id)}/{quote(ti_key.task_id)}"


class RigLinkPlugin(AirflowPlugin):
    name = "rig_link"
    global_operator_extra_links = [RigLink()]
