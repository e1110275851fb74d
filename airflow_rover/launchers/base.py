"""A backend runs jobs somewhere: it launches a job's master (the hook's side) and gives that
master the launcher of its nodes (the master process's side).

``launchers.backends`` picks the backend of a job directory; the hook, the CLI and the master's
process entry (``launchers.master_process``) all go through it.
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.spec import JobSpec
from airflow_rover.data.features import with_resolved_features
from airflow_rover.master.node_launcher import NodeLauncher, Role
from airflow_rover.master.serve import MasterEndpoint

ROLE_MODULES: dict[Role, str] = {
    "ps": "airflow_rover.ps",
    "worker": "airflow_rover.worker",
    "evaluator": "airflow_rover.worker",
    "data": "airflow_rover.dataworker",
}
"""The module a node of each role runs (``python -m MODULE --role ROLE``)."""
KEEPER_MODULE = "airflow_rover.launchers.keeper"
"""What a job's master runs as: its keeper, which runs and relaunches the master process."""


class JobLaunchError(RuntimeError):
    """The master did not come up; the message says where its log is."""


class JobDirInUse(ValueError):
    """The job directory is another job's: a run that reused it would resume that job's
    checkpoint (or overwrite its model). A retry cannot fix it."""


def check_job_dir(job_dir: JobDir, spec: JobSpec) -> None:
    """Raise ``JobDirInUse`` if ``job_dir`` holds another job (its ``job.json``): checked
    before anything of an earlier try is stopped or written."""
    owner = (job_dir.read_json(job_dir.spec_file) or {}).get("job_id")
    if owner is not None and owner != spec.job_id:
        raise JobDirInUse(
            f"{job_dir.root} is the directory of job {owner!r}, not of {spec.job_id!r}: a job "
            "resumes only its own checkpoints; give each run its own output_dir (e.g. "
            "'/models/ctr/{{ ds }}')"
        )


def write_job(job_dir: JobDir, spec: JobSpec) -> JobSpec:
    """Make ``job_dir`` the home of ``spec``'s job: the spec with its features resolved from
    the dataset (every process reads them from here, so they agree), the job's token, and no
    master or state file of an earlier try. Returns the spec as written."""
    check_job_dir(job_dir, spec)
    job_dir.root.mkdir(parents=True, exist_ok=True)
    for stale in (job_dir.master_file, job_dir.state_file):
        stale.unlink(missing_ok=True)
    written = with_resolved_features(spec)
    job_dir.write_spec(written)
    job_dir.ensure_token()
    return written


class JobBackend(ABC):
    """Where a job's master and nodes run. One instance serves one job directory's backend
    settings; its methods take the job directory."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def with_settings(cls, settings: Any) -> JobBackend:
        """The backend with the settings the operator gives (``kubernetes=``; None: none)."""

    @classmethod
    def of_job(cls, job_dir: JobDir) -> JobBackend | None:
        """The backend of ``job_dir`` if its job runs here (the settings it was launched
        with), else None (the default backend runs whatever no other claims)."""
        return None

    # -- the Airflow task's and the CLI's side ------------------------------------------------
    @abstractmethod
    def launch(self, job_dir: JobDir, spec: JobSpec, env: dict[str, str] | None = None) -> str:
        """Start a fresh master for ``spec`` in ``job_dir`` (removing a stale one of an
        earlier try first); ``env``: secrets for the master's environment, where the backend
        can pass them. Returns what runs the master (for the log)."""

    @abstractmethod
    def stop_master(self, job_dir: JobDir) -> None:
        """Make sure the job's master is gone, and with it its nodes."""

    @abstractmethod
    def job_alive(self, job_dir: JobDir) -> bool:
        """Whether the job's master runs, or is about to (its keeper relaunches it, its pod is
        pending)."""

    async def async_job_alive(self, job_dir: JobDir) -> bool:
        return await asyncio.to_thread(self.job_alive, job_dir)

    async def async_stop_master(self, job_dir: JobDir) -> None:
        await asyncio.to_thread(self.stop_master, job_dir)

    async def async_ensure(self, job_dir: JobDir) -> None:  # noqa: B027 (optional hook)
        """Recreate what the running job's master needs from the cluster (nothing by default)."""

    async def async_cleanup(self, job_dir: JobDir) -> None:  # noqa: B027 (optional hook)
        """The job ended: remove what the backend created for it (nothing by default)."""

    # -- the master process's side ------------------------------------------------------------
    @abstractmethod
    def master_endpoint(self, job_dir: JobDir, host: str) -> MasterEndpoint:
        """Where the master of ``job_dir`` listens and its token (``host``: the default)."""

    @abstractmethod
    def node_launcher(
        self, job_dir: JobDir, master_address: str, restarts: int, exited: threading.Event
    ) -> NodeLauncher:
        """The launcher of the job's nodes for its master at ``master_address``; ``restarts``:
        masters that died before this one; ``exited``: a ``threading.Event`` set whenever a
        node process ends (where the backend can tell)."""
