"""The hook: launch a job's master, read its status, stop it. Sync for operators, async for
triggers, one status policy for both (``resolve_status``).

Where the job runs is the job directory's to say: one with ``kubernetes.json`` runs on
Kubernetes (its master is a pod, reached through the cncf-kubernetes hooks), any other runs as
local processes. So the trigger, the sensor and the CLI need nothing but the directory.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
from airflow.sdk import BaseHook

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.job_status import ABSENT, UNREACHABLE, resolve_status
from airflow_rover.core.plans import PlanRecord
from airflow_rover.core.spec import JobSpec
from airflow_rover.launchers.kubernetes.config import KubernetesJob
from airflow_rover.launchers.kubernetes.job import KubernetesJobLauncher
from airflow_rover.launchers.local import JobLaunchError, LocalJobLauncher
from airflow_rover.rpc.master_api import API_PREFIX

__all__ = ["ABSENT", "UNREACHABLE", "ElasticJobHook", "JobLaunchError", "resolve_status"]


class ElasticJobHook(BaseHook):
    """I/O with one elastic training job, identified by its job directory.

    :param job_dir: the job directory.
    :param request_timeout_s: timeout of each call to the job's master.
    :param kubernetes: launch the job on Kubernetes with these settings (a job already
        launched says where it runs in its directory).
    """

    hook_name = "airflow-rover elastic job"

    def __init__(
        self,
        job_dir: str | Path,
        request_timeout_s: float = 10.0,
        kubernetes: KubernetesJob | None = None,
    ) -> None:
        super().__init__()
        self.layout = JobDir(Path(job_dir))
        self.launcher = LocalJobLauncher()
        self._kubernetes = kubernetes
        self._timeout = request_timeout_s

    def get_conn(self) -> JobDir:
        return self.layout

    @property
    def kubernetes(self) -> KubernetesJobLauncher | None:
        """The Kubernetes launcher of this job; None for a local job."""
        job = self._kubernetes or KubernetesJob.read(self.layout)
        return KubernetesJobLauncher(job) if job is not None else None

    # -- where the master is -----------------------------------------------------------------
    def _master(self) -> tuple[str | None, int | None]:
        info = self.layout.master_info()
        return info.get("address"), info.get("pid")

    def master_alive(self) -> bool:
        """The master runs, or its keeper does (about to relaunch it); on Kubernetes: its pod
        is pending or running."""
        k8s = self.kubernetes
        if k8s is not None:
            return k8s.job_alive(self.layout)
        return self.launcher.job_alive(self.layout)

    async def async_master_alive(self) -> bool:
        k8s = self.kubernetes
        if k8s is not None:
            return await k8s.async_job_alive(self.layout)
        return self.master_alive()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.layout.read_token()}"}

    # -- launching and stopping --------------------------------------------------------------
    def launch(self, spec: JobSpec, env: dict[str, str] | None = None) -> None:
        """Start a fresh master for ``spec`` in the job dir (stopping a stale one first);
        ``env``: secrets for the master's environment (local launcher only)."""
        k8s = self.kubernetes
        if k8s is not None:
            if env:
                raise ValueError("extra environment for the master: local launcher only")
            pod = k8s.start_job(self.layout, spec)
            self.log.info(
                "Launched job %s: master pod %s in namespace %s, dir %s",
                spec.job_id,
                pod,
                k8s.namespace,
                self.layout.root,
            )
            return
        pid = self.launcher.start_job(self.layout, spec, env)
        self.log.info("Launched job %s: master pid %d, dir %s", spec.job_id, pid, self.layout.root)

    def stop_master_process(self) -> None:
        """Make sure the master is gone: its process, or its pod with everything it owns."""
        k8s = self.kubernetes
        if k8s is not None:
            k8s.stop_job_master(self.layout)
        else:
            self.launcher.stop_job_master(self.layout)

    def stop(self, reason: str) -> None:
        """Ask the master to stop the job, then make sure its process is gone."""
        address, _ = self._master()
        if address and self.master_alive():
            try:
                httpx.post(
                    f"{address}{API_PREFIX}/stop",
                    json={"reason": reason},
                    headers=self._headers(),
                    timeout=self._timeout,
                )
            except httpx.HTTPError as exc:
                self.log.warning("Stop request failed (%s); terminating the master", exc)
        self.stop_master_process()

    def request_plan(
        self, num_workers: int | None = None, num_ps: int | None = None, reason: str = "requested"
    ) -> PlanRecord:
        """Ask the running job for other worker/PS counts: the master proposes the plan and the
        job's trigger applies it (PS counts change by live migration). Returns its record."""
        address, _ = self._master()
        if not address:
            raise RuntimeError(f"no master is running for {self.layout.root}")
        body = {"num_workers": num_workers, "num_ps": num_ps, "reason": reason}
        reply = httpx.post(
            f"{address}{API_PREFIX}/plans",
            json=body,
            headers=self._headers(),
            timeout=self._timeout,
        )
        reply.raise_for_status()
        return PlanRecord.model_validate(reply.json())

    async def async_stop(self, reason: str) -> None:
        address, _ = self._master()
        if address and await self.async_master_alive():
            try:
                async with httpx.AsyncClient(timeout=self._timeout) as client:
                    await client.post(
                        f"{address}{API_PREFIX}/stop",
                        json={"reason": reason},
                        headers=self._headers(),
                    )
            except httpx.HTTPError as exc:
                self.log.warning("Stop request failed (%s); terminating the master", exc)
        k8s = self.kubernetes
        if k8s is not None:
            await k8s.async_cleanup(self.layout)
        else:
            await asyncio.to_thread(self.stop_master_process)

    async def async_ensure(self) -> None:
        """On Kubernetes, recreate a missing Service or Secret of the running master pod (only
        reads when nothing is missing); nothing to do for a local job."""
        k8s = self.kubernetes
        if k8s is not None and self.layout.token_file.exists():
            await k8s.async_ensure(self.layout)

    async def async_cleanup(self) -> None:
        """The job ended: on Kubernetes delete its master pod, Services and Secret (node pods
        go with the master pod), keeping the master's log in the job dir. Local processes
        exit by themselves."""
        k8s = self.kubernetes
        if k8s is not None:
            await k8s.async_cleanup(self.layout)

    async def async_apply_plan(self, plan_id: int) -> PlanRecord:
        """Ask the master to apply its proposed plan ``plan_id``; returns the plan's record."""
        address, _ = self._master()
        async with httpx.AsyncClient(timeout=self._timeout) as client:
            reply = await client.post(
                f"{address}{API_PREFIX}/plans/{plan_id}/apply", headers=self._headers()
            )
            reply.raise_for_status()
            return PlanRecord.model_validate(reply.json())

    # -- status ------------------------------------------------------------------------------
    def get_status(self) -> dict[str, Any]:
        address, _ = self._master()
        api_status = None
        if address:
            try:
                reply = httpx.get(
                    f"{address}{API_PREFIX}/status", headers=self._headers(), timeout=self._timeout
                )
                reply.raise_for_status()
                api_status = reply.json()
            except httpx.HTTPError:
                api_status = None
        alive = api_status is not None or self.master_alive()  # asked only when needed
        return resolve_status(self.layout, api_status, alive)

    async def async_get_status(self) -> dict[str, Any]:
        address, _ = self._master()
        api_status = None
        if address:
            try:
                async with httpx.AsyncClient(timeout=self._timeout) as client:
                    reply = await client.get(
                        f"{address}{API_PREFIX}/status", headers=self._headers()
                    )
                    reply.raise_for_status()
                    api_status = reply.json()
            except httpx.HTTPError:
                api_status = None
        alive = api_status is not None or await self.async_master_alive()
        return resolve_status(self.layout, api_status, alive)
