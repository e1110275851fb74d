"""The hook: launch a job's master, read its status, stop it. Sync for operators, async for
triggers, one status policy for both (``resolve_status``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
from airflow.sdk import BaseHook

from airflow_rover.core.layout import JobLayout
from airflow_rover.core.spec import JobSpec
from airflow_rover.core.states import TERMINAL_STATES, JobState
from airflow_rover.launchers.local import LocalJobLauncher
from airflow_rover.master.protocol import API_PREFIX

ABSENT = "absent"  # no job in this directory (yet): a sensor keeps waiting
UNREACHABLE = "unreachable"  # the master runs but did not answer: transient, poll again
MASTER_START_TIMEOUT_S = 60.0


class JobLaunchError(RuntimeError):
    """The master did not come up; the message says where its log is."""


def resolve_status(
    layout: JobLayout, api_status: dict[str, Any] | None, master_alive: bool
) -> dict[str, Any]:
    """The job's status: the master's answer, else its last mirrored state, else a verdict."""
    if api_status is not None:
        return api_status
    mirrored = layout.read_json(layout.state_file)
    if mirrored and mirrored.get("state") in TERMINAL_STATES:
        return mirrored
    if master_alive:
        return {**(mirrored or {}), "state": UNREACHABLE, "message": "master did not answer"}
    if mirrored is None and layout.read_json(layout.master_file) is None:
        return {"state": ABSENT, "message": f"no job in {layout.root}"}
    return {
        **(mirrored or {}),
        "state": str(JobState.FAILED),
        "message": f"master process died before the job finished; see {layout.log_file('master')}",
    }


class ElasticJobHook(BaseHook):
    """I/O with one elastic training job, identified by its job directory."""

    hook_name = "airflow-rover elastic job"

    def __init__(self, job_dir: str | Path, request_timeout_s: float = 10.0) -> None:
        super().__init__()
        self.layout = JobLayout(Path(job_dir))
        self.launcher = LocalJobLauncher()
        self._timeout = request_timeout_s

    def get_conn(self) -> JobLayout:
        return self.layout

    # -- where the master is -----------------------------------------------------------------
    def _master(self) -> tuple[str | None, int | None]:
        info = self.layout.read_json(self.layout.master_file) or {}
        return info.get("address"), info.get("pid")

    def master_alive(self) -> bool:
        _, pid = self._master()
        return pid is not None and self.launcher.master_alive(pid)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.layout.read_token()}"}

    # -- launching and stopping --------------------------------------------------------------
    def launch(self, spec: JobSpec) -> None:
        """Start a fresh master for ``spec`` in the job dir (stopping a stale one first)."""
        self.stop_master_process()
        self.layout.root.mkdir(parents=True, exist_ok=True)
        for stale in (self.layout.master_file, self.layout.state_file):
            stale.unlink(missing_ok=True)
        self.layout.write_spec(spec)
        self.layout.ensure_token()
        pid = self.launcher.launch_master(self.layout)
        deadline = time.monotonic() + MASTER_START_TIMEOUT_S
        while self._master()[1] != pid:
            if not self.launcher.master_alive(pid) or time.monotonic() > deadline:
                raise JobLaunchError(
                    f"job master (pid {pid}) did not start; see {self.layout.log_file('master')}"
                )
            time.sleep(0.1)
        self.log.info(
            "Launched job %s: master pid %d, job dir %s", spec.job_id, pid, self.layout.root
        )

    def stop_master_process(self) -> None:
        _, pid = self._master()
        if pid is not None:
            self.launcher.stop_master(pid)

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

    async def async_stop(self, reason: str) -> None:
        address, _ = self._master()
        if address and self.master_alive():
            try:
                async with httpx.AsyncClient(timeout=self._timeout) as client:
                    await client.post(
                        f"{address}{API_PREFIX}/stop",
                        json={"reason": reason},
                        headers=self._headers(),
                    )
            except httpx.HTTPError as exc:
                self.log.warning("Stop request failed (%s); terminating the master", exc)
        await asyncio.to_thread(self.stop_master_process)

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
        return resolve_status(self.layout, api_status, self.master_alive())

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
        return resolve_status(self.layout, api_status, self.master_alive())
