"""The "Elastic job" button on a training task instance: a link to its job page in the UI
plugin. The job id follows from the task instance alone, so the link works on every try and
before the job has written anything."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import BaseOperatorLink

from airflow_rover.operators.job_identity import job_id_for

UI_PREFIX = "/rover"  # where the api-server mounts the plugin's app


def job_page_path(dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> str:
    """The job page's path on the api-server (below ``[api] base_url``'s path)."""
    from airflow.configuration import conf

    base = urlsplit(conf.get("api", "base_url", fallback="") or "").path.rstrip("/")
    return f"{base}{UI_PREFIX}/jobs/{job_id_for(dag_id, task_id, run_id, map_index)}"


class ElasticJobLink(BaseOperatorLink):
    """Opens the job page of the task instance's elastic training job."""

    name = "Elastic job"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        index = ti_key.map_index if ti_key.map_index is not None else -1
        return job_page_path(ti_key.dag_id, ti_key.task_id, ti_key.run_id, index)

    @classmethod
    def persist(cls, ti: Any) -> None:
        """Push the link now: Airflow pushes an operator's links when its task process ends,
        and the button is wanted while the task is deferred and its job runs."""
        link = cls()
        ti.xcom_push(key=link.xcom_key, value=link.get_link(ti.task, ti_key=ti))
