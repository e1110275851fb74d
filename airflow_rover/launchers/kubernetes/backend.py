"""The Kubernetes backend: Airflow creates, checks and removes a job's master pod, Services
and Secret (through the cncf-kubernetes hooks, ``job``); the master, in its pod, creates
and deletes its node pods (``nodes.KubernetesNodeLauncher``). The job's processes talk TLS with
a certificate made for the job when it is launched (``core.job_tls``).

A job directory holding ``kubernetes.json`` runs here (``launchers.backends.backend_for``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from airflow_rover.core.job_dir import ENV_TOKEN_FILE, JobDir
from airflow_rover.core.job_tls import JobTLS
from airflow_rover.core.spec import JobSpec
from airflow_rover.launchers.base import JobBackend, check_job_dir, write_job
from airflow_rover.launchers.kubernetes import manifests as m
from airflow_rover.launchers.kubernetes.config import (
    ENV_MASTER_ADVERTISE,
    ENV_MASTER_HOST,
    ENV_MASTER_PORT,
    ENV_NAMESPACE,
    ENV_POD_NAME,
    ENV_POD_UID,
    KubernetesJob,
)
from airflow_rover.launchers.kubernetes.job import (
    KubernetesPermissionError,
    Steps,
    cleanup_steps,
    ensure_steps,
    launch_steps,
    master_pod_steps,
    pod_alive,
    run_async,
    run_sync,
)
from airflow_rover.launchers.kubernetes.pod_status import exit_code, failure_note
from airflow_rover.master.node_launcher import NodeLauncher
from airflow_rover.master.serve import MasterEndpoint
from airflow_rover.rpc.tls import make_certificate

log = logging.getLogger(__name__)

T = TypeVar("T")


class KubernetesBackend(JobBackend):
    """A job's master and nodes as pods of the cluster that ``job`` names."""

    name = "kubernetes"

    def __init__(self, job: KubernetesJob) -> None:
        self.job = job
        self.namespace = job.config.namespace

    @classmethod
    def with_settings(cls, settings: Any) -> KubernetesBackend:
        if not isinstance(settings, KubernetesJob):
            raise ValueError("launcher='kubernetes' needs its settings (KubernetesJob)")
        return cls(settings)

    @classmethod
    def of_job(cls, job_dir: JobDir) -> KubernetesBackend | None:
        """A job directory with ``kubernetes.json`` (written at launch) runs here."""
        job = KubernetesJob.read(job_dir)
        return cls(job) if job is not None else None

    def names(self, job_dir: JobDir) -> m.JobNames:
        return m.JobNames(job_dir.read_spec().job_id, self.namespace)

    def _hook_kwargs(self) -> dict[str, Any]:
        conn = self.job.kubernetes_conn_id
        return {"conn_id": conn} if conn else {}

    def sync_api(self) -> Any:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        return KubernetesHook(**self._hook_kwargs()).core_v1_client

    def _run(self, steps: Steps[T]) -> T:
        return run_sync(steps, self.sync_api(), self.namespace)

    async def _arun(self, steps: Steps[T]) -> T:
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook
        from kubernetes_asyncio import client as async_client

        hook = AsyncKubernetesHook(**self._hook_kwargs())
        async with hook.get_conn() as api_client:
            return await run_async(steps, async_client.CoreV1Api(api_client), self.namespace)

    # -- the operator's side (sync) ----------------------------------------------------------
    def launch(self, job_dir: JobDir, spec: JobSpec, env: dict[str, str] | None = None) -> str:
        """Remove a stale master of an earlier try, write the job's files (and its TLS
        certificate), create the master pod, its Secret, Services and NetworkPolicy. The master
        announces itself in ``master.json`` once its pod runs (the trigger waits for it, not
        the task)."""
        if env:
            raise ValueError("extra environment for the master: local launcher only")
        pod = self.start_job(job_dir, spec)
        return f"master pod {pod} in namespace {self.namespace}"

    def start_job(self, job_dir: JobDir, spec: JobSpec, wait_s: float = 120.0) -> str:
        """``launch``; returns the master pod's name."""
        check_job_dir(job_dir, spec)
        names = m.JobNames(spec.job_id, self.namespace)
        previous = KubernetesJob.read(job_dir)
        if previous is not None and job_dir.spec_file.exists():  # where the last try ran
            KubernetesBackend(previous).remove_stale(job_dir, wait_s)
        api = self.sync_api()
        write_job(job_dir, spec)
        cert, key = make_certificate(names.tls_hosts())  # kept for a Secret made again
        job_dir.write_tls(cert, key)
        self.job.write(job_dir)
        secrets = m.JobSecrets(job_dir.read_token(), cert, key)
        run_sync(
            launch_steps(self.job, names, PurePosixPath(job_dir.root), secrets),
            api,
            self.namespace,
        )
        return names.master_pod

    def remove_stale(self, job_dir: JobDir, wait_s: float) -> None:
        """Remove an earlier try's master pod (and what it owns) and wait until it is gone,
        so the new one can take its name."""
        api = self.sync_api()
        self._save_master_log(
            job_dir, run_sync(cleanup_steps(self.names(job_dir)), api, self.namespace)
        )
        self._wait_gone(api, self.names(job_dir), wait_s)

    def _wait_gone(self, api: Any, names: m.JobNames, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while run_sync(master_pod_steps(names), api, self.namespace) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"pod {names.master_pod} of an earlier try is still terminating after "
                    f"{wait_s:.0f} s"
                )
            time.sleep(1.0)

    def job_alive(self, job_dir: JobDir) -> bool:
        """Whether the master pod is pending or running; an unanswered check counts as alive
        (the status stays ``unreachable``), never as a dead job."""
        try:
            pod = self._run(master_pod_steps(self.names(job_dir)))
        except KubernetesPermissionError:
            raise
        except Exception as exc:
            log.warning("Could not read the master pod (%s); assuming it runs", exc)
            return True
        return self._judge(job_dir, pod)

    def stop_master(self, job_dir: JobDir) -> None:
        """Delete the master pod with everything it owns, keeping its log."""
        self._save_master_log(job_dir, self._run(cleanup_steps(self.names(job_dir))))

    # -- the trigger's side (async) ----------------------------------------------------------
    async def async_job_alive(self, job_dir: JobDir) -> bool:
        try:
            pod = await self._arun(master_pod_steps(self.names(job_dir)))
        except KubernetesPermissionError:
            raise
        except Exception as exc:
            log.warning("Could not read the master pod (%s); assuming it runs", exc)
            return True
        return await asyncio.to_thread(self._judge, job_dir, pod)

    @staticmethod
    def _judge(job_dir: JobDir, pod: dict[str, Any] | None) -> bool:
        """Alive or not; a master pod that ended or cannot start says why in the master's log
        (which the failed job's message points to), once."""
        if pod_alive(pod) or pod is None:
            return pod is not None
        code = exit_code(pod)
        if not code:  # it ended well (the job's state says how the job ended)
            return False
        note = f"[master pod: {failure_note(pod, code)}]"
        path = job_dir.log_file("master")
        try:
            if note not in (path.read_text() if path.exists() else ""):
                KubernetesBackend._save_master_log(job_dir, note)
        except OSError as exc:
            log.warning("Could not read the master's log: %s", exc)
        return False

    async def async_ensure(self, job_dir: JobDir) -> None:
        """Recreate a missing Service or Secret of the running master pod (only reads when
        nothing is missing)."""
        secrets = job_secrets(job_dir)
        if secrets is not None:
            await self._arun(ensure_steps(self.job, self.names(job_dir), secrets))

    async def async_cleanup(self, job_dir: JobDir) -> None:
        """Delete the master pod and what it owns (node pods, Services, Secret, NetworkPolicy),
        keeping the master's log in the job dir."""
        tail = await self._arun(cleanup_steps(self.names(job_dir)))
        await asyncio.to_thread(self._save_master_log, job_dir, tail)

    async def async_stop_master(self, job_dir: JobDir) -> None:
        await self.async_cleanup(job_dir)

    @staticmethod
    def _save_master_log(job_dir: JobDir, tail: str | None) -> None:
        """The master pod's log goes where the local master's goes (``logs/master.log``)."""
        if not tail:
            return
        try:
            path = job_dir.log_file("master")
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as fh:
                fh.write(tail if tail.endswith("\n") else tail + "\n")
        except OSError as exc:
            log.warning("Could not save the master's log: %s", exc)

    # -- the master pod's side -----------------------------------------------------------------
    def master_endpoint(self, job_dir: JobDir, host: str) -> MasterEndpoint:
        """The pod's address (all interfaces, its port, reached through its Service), the
        token and the TLS certificate and key from the mounted Secret."""
        token_file = os.environ.get(ENV_TOKEN_FILE)
        token = Path(token_file).read_text().strip() if token_file else job_dir.read_token()
        return MasterEndpoint(
            host=os.environ.get(ENV_MASTER_HOST, host),
            token=token,
            port=int(os.environ.get(ENV_MASTER_PORT, "0")),
            advertise=os.environ.get(ENV_MASTER_ADVERTISE),
            announce={"pod": os.environ.get(ENV_POD_NAME)},
            tls=JobTLS.from_env(),
        )

    def node_launcher(
        self, job_dir: JobDir, master_address: str, restarts: int, exited: threading.Event
    ) -> NodeLauncher:
        return kubernetes_node_launcher(job_dir, restarts)


def job_secrets(job_dir: JobDir) -> m.JobSecrets | None:
    """The job's Secret as its directory keeps it (None before its launch wrote it)."""
    tls = job_dir.tls()
    if not job_dir.token_file.exists() or tls is None:
        return None
    return m.JobSecrets(job_dir.read_token(), tls.cert(), tls.key())


def kubernetes_node_launcher(job_dir: JobDir, restarts: int) -> NodeLauncher:
    """The node launcher of a master running in its pod: in-cluster credentials (the master's
    service account), the job's settings from ``kubernetes.json``, its own pod as the owner of
    the node pods, and its restart count as the incarnation."""
    from kubernetes import client, config

    from airflow_rover.launchers.kubernetes.nodes import KubernetesNodeLauncher

    job = KubernetesJob.read(job_dir)
    if job is None:
        raise SystemExit(f"a Kubernetes master, but {job_dir.root} has no kubernetes.json")
    missing = [v for v in (ENV_POD_NAME, ENV_POD_UID, ENV_NAMESPACE) if not os.environ.get(v)]
    if missing:
        raise SystemExit(f"the master pod's environment lacks {missing}")
    config.load_incluster_config()
    names = m.JobNames(job_dir.read_spec().job_id, os.environ[ENV_NAMESPACE])
    if names.master_pod != os.environ[ENV_POD_NAME]:
        raise SystemExit(f"pod {os.environ[ENV_POD_NAME]} is not {names.master_pod}")
    return KubernetesNodeLauncher(
        client.CoreV1Api(), job.config, names, job_dir, os.environ[ENV_POD_UID], restarts
    )
