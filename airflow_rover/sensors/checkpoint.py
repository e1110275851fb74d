"""``CheckpointSensor``: wait until a job has a durable checkpoint at or past N trained samples,
so an evaluation or export task can start from it while training goes on.

.. seealso:: ``docs/checkpoint-storage.md``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowSensorTimeout, AirflowSkipException

from airflow_rover.hooks.checkpoint_store import CheckpointStoreHook
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.operators._validation import has_template
from airflow_rover.storage.base import parse_checkpoint_uri
from airflow_rover.triggers.checkpoint import (
    CheckpointTrigger,
    check_checkpoint,
    checkpoint_store_uri,
)


def checkpoint_result(event: dict[str, Any]) -> dict[str, Any]:
    """What the sensor pushes to XCom, on every path: the checkpoint's ``name``, ``uri``,
    ``samples``, ``samples_total``, ``checksums`` (part -> SHA-256), ``manifest_sha256``,
    ``bytes``, ``number`` and the ``job_id`` (None when only a URI is watched)."""
    return {**(event.get("checkpoint") or {}), "job_id": event.get("job_id")}


class CheckpointSensor(BaseSensorOperator):
    """Wait until a published checkpoint of a job holds at least ``min_samples`` trained
    samples, and return where it is and its checksums.

    The checkpoints are the job's own (``job_dir``), or the durable copies at
    ``checkpoint_uri`` (``s3://bucket/prefix`` read with ``aws_conn_id``, or ``file:///path``).
    Give ``job_dir`` too with a URI so that a job that ends without reaching ``min_samples``
    fails the sensor at once instead of at its timeout.

    :param min_samples: trained samples the checkpoint must hold (>= 0). (templated)
    :param job_dir: the job directory (the training task's ``output_dir``). (templated)
    :param checkpoint_uri: where the job's checkpoints are stored durably. (templated)
    :param aws_conn_id: Airflow connection for ``s3://`` (login/password = key pair, extra
        ``endpoint_url``, ``region_name``); None: boto3's default chain. (templated)
    :param deferrable: wait in the triggerer instead of occupying a worker slot.
    """

    template_fields: Sequence[str] = ("min_samples", "job_dir", "checkpoint_uri", "aws_conn_id")
    ui_color = "#e6f2d9"

    def __init__(
        self,
        *,
        min_samples: int | str,
        job_dir: str | None = None,
        checkpoint_uri: str | None = None,
        aws_conn_id: str | None = None,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        for param, value in (
            ("job_dir", job_dir),
            ("checkpoint_uri", checkpoint_uri),
            ("aws_conn_id", aws_conn_id),
        ):
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{self._owner}: {param}={value!r}: accepted: a non-empty string")
        if not job_dir and not checkpoint_uri:
            raise ValueError(
                f"{self._owner}: give job_dir (the job's own checkpoints) or checkpoint_uri "
                "(file:///path, s3://bucket/prefix)"
            )
        self.min_samples = min_samples
        self.job_dir = job_dir
        self.checkpoint_uri = checkpoint_uri
        self.aws_conn_id = aws_conn_id
        self.deferrable = deferrable
        if not has_template(min_samples):
            self._min_samples()  # validate now, at DAG parse time
        if checkpoint_uri is not None and not has_template(checkpoint_uri):
            self._store_uri()

    @property
    def _owner(self) -> str:
        return f"{type(self).__name__}(task_id={self.task_id!r})"

    def _min_samples(self) -> int:
        """``min_samples`` as rendered, cast to an int >= 0."""
        value = self.min_samples
        if isinstance(value, str) and value.strip().isdigit():
            return int(value.strip())
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise ValueError(f"{self._owner}: min_samples={value!r}: accepted: an integer >= 0")

    def _store_uri(self) -> str:
        """The store to watch (``checkpoint_uri`` checked, else the job's checkpoints)."""
        if self.checkpoint_uri:
            try:
                parse_checkpoint_uri(self.checkpoint_uri)
            except ValueError as exc:
                raise ValueError(f"{self._owner}: {exc}") from None
        return checkpoint_store_uri(self.job_dir, self.checkpoint_uri)

    def _check(self) -> dict[str, Any] | None:
        """Look once (the same decision as the trigger): an event, or None to keep waiting."""
        store = CheckpointStoreHook(self.aws_conn_id).get_store(self._store_uri())
        job = ElasticJobHook(self.job_dir).get_status() if self.job_dir else None
        return check_checkpoint(store, self._min_samples(), job)

    def poke(self, context: Context) -> PokeReturnValue | bool:
        event = self._check()
        if event is None:
            return False
        return PokeReturnValue(is_done=True, xcom_value=self._result(event))

    def execute(self, context: Context) -> Any:
        min_samples = self._min_samples()
        self._store_uri()  # a bad rendered URI fails here, naming the parameter
        if not self.deferrable:
            return super().execute(context)
        event = self._check()
        if event is not None:
            return self._result(event)
        timeout = float(self.timeout)
        self.defer(
            trigger=CheckpointTrigger(
                min_samples=min_samples,
                job_dir=self.job_dir,
                checkpoint_uri=self.checkpoint_uri,
                aws_conn_id=self.aws_conn_id,
                poll_interval=float(self.poke_interval),
                deadline=time.time() + timeout,
            ),
            method_name="execute_complete",
            # The trigger reports its own timeout with a message; Airflow's is the backstop.
            timeout=timedelta(seconds=timeout + float(self.poke_interval) + 60),
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        if not event or "status" not in event:
            raise AirflowException(f"Trigger for sensor {self.task_id} returned no event")
        return self._result(event)

    def _result(self, event: dict[str, Any]) -> dict[str, Any]:
        """The XCom of a success event; any other event raises with its message."""
        status = event["status"]
        if status == "success":
            return checkpoint_result(event)
        message = f"{self._owner}: {event.get('message')}"
        if status == "timeout":
            if self.soft_fail:
                raise AirflowSkipException(message)
            raise AirflowSensorTimeout(message)
        raise AirflowException(message)
