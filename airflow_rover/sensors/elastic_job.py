"""``ElasticJobSensor``: wait until a job (started by another task or DAG) reaches a milestone.

.. seealso:: ``docs/operators.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, Context
from airflow.sdk.exceptions import AirflowException

from airflow_rover.core.milestones import Milestone
from airflow_rover.core.states import JobState
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.operators._validation import has_template, parse_param
from airflow_rover.triggers.elastic_job import ElasticJobTrigger


def milestone_summary(job: dict[str, Any]) -> dict[str, Any]:
    """What the sensor pushes to XCom: where the job stood when the milestone was reached."""
    return {
        "job_id": job.get("job_id"),
        "state": job.get("state"),
        "samples_done": (job.get("progress") or {}).get("samples_done", 0),
        "auc": (job.get("evaluation") or {}).get("auc"),
    }


class ElasticJobSensor(BaseSensorOperator):
    """Wait until the job in ``job_dir`` is in one of ``states``, has trained ``min_samples``
    or reached a held-out AUC of ``min_auc`` (whichever comes first).

    A job that does not exist yet is waited for; a job that ends without reaching the
    milestone fails the sensor with the job's message.

    :param job_dir: the job directory (the training task's ``output_dir``). (templated)
    :param states: job states that count as reached (default: ``["succeeded"]``; pass ``[]``
        to wait only on samples or AUC).
    :param min_samples: trained samples that count as reached. (templated)
    :param min_auc: held-out AUC that counts as reached. (templated)
    :param deferrable: wait in the triggerer instead of occupying a worker slot.
    """

    template_fields: Sequence[str] = ("job_dir", "min_samples", "min_auc")
    ui_color = "#e6f2d9"

    def __init__(
        self,
        *,
        job_dir: str,
        states: Sequence[str] = (JobState.SUCCEEDED,),
        min_samples: int | str | None = None,
        min_auc: float | str | None = None,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__}(task_id={self.task_id!r})"
        if not isinstance(job_dir, str) or not job_dir:
            raise ValueError(f"{owner}: job_dir must be a non-empty path, got {job_dir!r}")
        self.job_dir = job_dir
        self.states = list(states)
        self.min_samples = min_samples
        self.min_auc = min_auc
        self.deferrable = deferrable
        if not has_template([min_samples, min_auc]):
            self._milestone()  # validate now, at DAG parse time

    def _milestone(self) -> Milestone:
        return parse_param(
            f"{type(self).__name__}(task_id={self.task_id!r})",
            "milestone (states/min_samples/min_auc)",
            Milestone,
            {"states": self.states, "min_samples": self.min_samples, "min_auc": self.min_auc},
        )

    @property
    def milestone(self) -> Milestone:
        return self._milestone()

    def _check(self) -> dict[str, Any] | None:
        """The job's status if the milestone is reached; None to keep waiting; raise if missed."""
        job = ElasticJobHook(self.job_dir).get_status()
        missed = self.milestone.missed(job)
        if missed is not None:
            raise AirflowException(f"{missed}: {job.get('message')}")
        return job if self.milestone.reached(job) else None

    def poke(self, context: Context) -> bool:
        return self._check() is not None

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            super().execute(context)
            return milestone_summary(ElasticJobHook(self.job_dir).get_status())
        job = self._check()
        if job is not None:
            return milestone_summary(job)
        self.defer(
            trigger=ElasticJobTrigger(
                job_dir=self.job_dir,
                poll_interval=float(self.poke_interval),
                milestone=self.milestone.model_dump(mode="json"),
                stop_on_kill=False,  # never stop a job this task does not own
                apply_plans=False,  # nor change its resources
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=float(self.timeout)),
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        if not event or "status" not in event:
            raise AirflowException(f"Trigger for sensor {self.task_id} returned no event")
        if event["status"] != "success":
            raise AirflowException(f"Job {event.get('job_id')}: {event.get('message')}")
        return milestone_summary(event["job"])
