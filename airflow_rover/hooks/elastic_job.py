"""The hook: launch a job's master, read its status, apply or decline its plans, stop it.
Sync for operators, async for triggers, one status policy for both (``resolve_status``).

Where the job runs is its backend's to say (``launchers.backends``): the job directory names it,
so the trigger, the sensor and the CLI need nothing but the directory.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import httpx
from airflow.sdk import BaseHook
from pydantic import ValidationError

from airflow_rover.core.deadline import JobDeadline
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.job_status import ABSENT, UNREACHABLE, resolve_status
from airflow_rover.core.plans import PlanRecord
from airflow_rover.core.spec import JobSpec
from airflow_rover.launchers.backends import backend_for
from airflow_rover.launchers.base import JobBackend, JobLaunchError
from airflow_rover.rpc.master_api import API_PREFIX
from airflow_rover.rpc.tls import http_verify

__all__ = ["ABSENT", "UNREACHABLE", "ElasticJobHook", "JobLaunchError", "resolve_status"]


class ElasticJobHook(BaseHook):
    """I/O with one elastic training job, identified by its job directory.

    :param job_dir: the job directory.
    :param request_timeout_s: timeout of each call to the job's master.
    :param backend: launch the job there (``launchers.backends.backend_named``); a job
        already launched says where it runs in its directory.
    """

    hook_name = "airflow-rover elastic job"

    def __init__(
        self,
        job_dir: str | Path,
        request_timeout_s: float = 10.0,
        backend: JobBackend | None = None,
    ) -> None:
        super().__init__()
        self.job_dir = JobDir(Path(job_dir))
        self._backend = backend
        self._timeout = request_timeout_s

    def get_conn(self) -> JobDir:
        return self.job_dir

    @property
    def backend(self) -> JobBackend:
        """Where the job runs: the one it is launched with, else its directory's."""
        return self._backend or backend_for(self.job_dir)

    def _address(self) -> str | None:
        address: str | None = self.job_dir.master_info().get("address")
        return address

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.job_dir.read_token()}"}

    def _verify(self) -> ssl.SSLContext | bool:
        """The job's certificate (in its directory where the master serves HTTPS): the only
        one trusted."""
        return http_verify(self.job_dir.tls())

    def _async_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self._timeout, verify=self._verify())

    def _url(self, path: str) -> str:
        address = self._address()
        if not address:
            raise RuntimeError(f"no master is running for {self.job_dir.root}")
        return f"{address}{API_PREFIX}{path}"

    # -- launching and stopping --------------------------------------------------------------
    def launch(self, spec: JobSpec, env: dict[str, str] | None = None) -> None:
        """Start a fresh master for ``spec`` in the job dir (stopping a stale one of an ended
        try first; the local backend refuses, ``JobLaunchError``, while the job still runs);
        ``env``: secrets for the master's environment (where the backend can pass them)."""
        where = self.backend.launch(self.job_dir, spec, env)
        self.log.info("Launched job %s: %s, dir %s", spec.job_id, where, self.job_dir.root)

    def master_alive(self) -> bool:
        """The master runs, or is about to (its keeper relaunches it, its pod is pending)."""
        return self.backend.job_alive(self.job_dir)

    async def async_master_alive(self) -> bool:
        return await self.backend.async_job_alive(self.job_dir)

    def stop_master_process(self) -> None:
        """Make sure the master is gone, and with it everything it runs."""
        self.backend.stop_master(self.job_dir)

    def stop(self, reason: str, final: bool = False) -> None:
        """Ask the master to stop the job, then make sure its process is gone."""
        if self._address() and self.master_alive():
            try:
                httpx.post(
                    self._url("/stop"),
                    json={"reason": reason, "final": final},
                    headers=self._headers(),
                    timeout=self._timeout,
                    verify=self._verify(),
                )
            except httpx.HTTPError as exc:
                self.log.warning("Stop request failed (%s); terminating the master", exc)
        self.stop_master_process()

    async def async_stop(self, reason: str, final: bool = False) -> None:
        if self._address() and await self.async_master_alive():
            try:
                async with self._async_client() as client:
                    await client.post(
                        self._url("/stop"),
                        json={"reason": reason, "final": final},
                        headers=self._headers(),
                    )
            except httpx.HTTPError as exc:
                self.log.warning("Stop request failed (%s); terminating the master", exc)
        await self.backend.async_stop_master(self.job_dir)

    async def async_ensure(self) -> None:
        """Recreate what the running job's master misses from its cluster (a Kubernetes
        Service or Secret; nothing locally)."""
        await self.backend.async_ensure(self.job_dir)

    async def async_cleanup(self) -> None:
        """The job ended: remove what its backend created for it (on Kubernetes the master
        pod, Services, Secret and NetworkPolicy, keeping the master's log in the job dir).
        Local processes exit by themselves."""
        await self.backend.async_cleanup(self.job_dir)

    # -- plans -------------------------------------------------------------------------------
    def request_plan(
        self, num_workers: int | None = None, num_ps: int | None = None, reason: str = "requested"
    ) -> PlanRecord:
        """Ask the running job for other worker/PS counts: the master proposes the plan and the
        job's trigger applies it (PS counts change by live migration). Returns its record."""
        body = {"num_workers": num_workers, "num_ps": num_ps, "reason": reason}
        return self._plan_call("/plans", body)

    def apply_plan(self, plan_id: int) -> PlanRecord:
        """Ask the master to apply its proposed plan ``plan_id`` (a person approved it);
        returns the plan's record: applied, applying (a PS resize), or declined with the
        reason the job cannot run it. Applying twice is a no-op."""
        return self._plan_call(f"/plans/{plan_id}/apply")

    def decline_plan(self, plan_id: int, reason: str) -> PlanRecord:
        """Decline the proposed plan ``plan_id``: it is never applied, its note says
        ``declined: <reason>``. ``httpx.HTTPStatusError``: 404 for an unknown plan, 409 for a
        plan no longer proposed (the message says its state)."""
        return self._plan_call(f"/plans/{plan_id}/decline", {"reason": reason})

    async def async_apply_plan(self, plan_id: int) -> PlanRecord:
        """Ask the master to apply its proposed plan ``plan_id``; returns the plan's record."""
        return await self._async_plan_call(f"/plans/{plan_id}/apply")

    async def async_decline_plan(self, plan_id: int, reason: str) -> PlanRecord:
        """``decline_plan``, for async callers."""
        return await self._async_plan_call(f"/plans/{plan_id}/decline", {"reason": reason})

    def _plan_call(self, path: str, body: dict[str, Any] | None = None) -> PlanRecord:
        reply = httpx.post(
            self._url(path),
            json=body,
            headers=self._headers(),
            timeout=self._timeout,
            verify=self._verify(),
        )
        return _plan_record(reply)

    async def _async_plan_call(self, path: str, body: dict[str, Any] | None = None) -> PlanRecord:
        async with self._async_client() as client:
            reply = await client.post(self._url(path), json=body, headers=self._headers())
            return _plan_record(reply)

    async def async_cap_data_workers(self, cap: int | None) -> None:
        """Tell the job how many data workers its cluster budget leaves room for."""
        async with self._async_client() as client:
            reply = await client.post(
                self._url("/data-workers/cap"), json={"cap": cap}, headers=self._headers()
            )
            reply.raise_for_status()

    # -- status ------------------------------------------------------------------------------
    def get_status(self) -> dict[str, Any]:
        api_status = None
        if self._address():
            try:
                reply = httpx.get(
                    self._url("/status"),
                    headers=self._headers(),
                    timeout=self._timeout,
                    verify=self._verify(),
                )
                reply.raise_for_status()
                api_status = reply.json()
            except httpx.HTTPError:
                api_status = None
        alive = api_status is not None or self.master_alive()  # asked only when needed
        return resolve_status(self.job_dir, api_status, alive)

    def get_deadline(self) -> JobDeadline | None:
        """The deadline in the job's spec; None when it has none or no readable spec."""
        try:
            return self.job_dir.read_spec().deadline
        except (OSError, ValidationError):
            return None

    async def async_get_status(self) -> dict[str, Any]:
        api_status = None
        if self._address():
            try:
                async with self._async_client() as client:
                    reply = await client.get(self._url("/status"), headers=self._headers())
                    reply.raise_for_status()
                    api_status = reply.json()
            except httpx.HTTPError:
                api_status = None
        alive = api_status is not None or await self.async_master_alive()
        return resolve_status(self.job_dir, api_status, alive)


def _plan_record(reply: httpx.Response) -> PlanRecord:
    """The plan record a plan call answers; ``httpx.HTTPStatusError`` with the master's reason
    for a refusal (an unknown plan, one no longer proposed, a bad request)."""
    if reply.is_error:
        try:
            answer = reply.json()
        except ValueError:
            answer = reply.text
        detail = answer.get("detail", answer) if isinstance(answer, dict) else answer
        raise httpx.HTTPStatusError(
            f"{reply.status_code} from the job master: {detail}",
            request=reply.request,
            response=reply,
        )
    return PlanRecord.model_validate(reply.json())
