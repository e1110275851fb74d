"""Airflow's side of a Kubernetes job: its master pod, Services and token Secret.

The operator launches a job through the cncf-kubernetes provider's ``KubernetesHook``
(``kubernetes_conn_id``: in-cluster, a kubeconfig, or the default); the trigger checks and
cleans up through its ``AsyncKubernetesHook``. What to do is written once, as steps that yield
API operations (``Op``), and run by a sync or an async driver, so the two paths cannot drift.
The master pod itself creates and deletes the node pods (``nodes.KubernetesNodeLauncher``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal, TypeVar

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.spec import JobSpec
from airflow_rover.launchers.kubernetes import manifests as m
from airflow_rover.launchers.kubernetes.config import KubernetesJob
from airflow_rover.launchers.kubernetes.pod_status import exit_code, failure_note

log = logging.getLogger(__name__)

T = TypeVar("T")
Verb = Literal["read", "create", "delete", "log"]
_SINGULAR = {"pods": "pod", "secrets": "secret", "services": "service"}
MASTER_GRACE_S = 30  # the master stops its nodes on SIGTERM before it exits
LOG_TAIL_LINES = 500


class KubernetesPermissionError(RuntimeError):
    """The cluster refused an operation (403): the account lacks a rule of
    ``deploy/rbac-airflow.yaml``. A retry cannot fix it."""


@dataclass(frozen=True)
class Op:
    """One Kubernetes API call: read (None if absent), create (None if it exists already),
    delete (absent is fine), log (the tail of a pod's log, None if unavailable)."""

    verb: Verb
    plural: str
    name: str
    body: dict[str, Any] | None = None
    grace_s: int | None = None


Steps = Generator[Op, Any, T]


def _alive(pod: dict[str, Any] | None) -> bool:
    """The master pod runs or may still start: not deleted, its container not ended, and not
    stuck where it never starts by itself (an image that cannot be pulled)."""
    return (
        pod is not None and not pod["metadata"].get("deletionTimestamp") and exit_code(pod) is None
    )


# -- what to do (pure: each step is an Op, its answer comes back through send) ---------------
def launch_steps(
    job: KubernetesJob, names: m.JobNames, job_dir: PurePosixPath, token: str
) -> Steps[str]:
    """Create the master pod, then its Secret and Services owned by it; returns its uid.
    Repeating it creates nothing twice: an existing object of this master pod is kept, one
    left by an earlier master pod is replaced."""
    created = yield Op("create", "pods", names.master_pod, m.master_pod(job.config, names, job_dir))
    if created is None:
        created = yield Op("read", "pods", names.master_pod)
        if created is None:
            raise RuntimeError(f"pod {names.master_pod} exists and does not: retry the launch")
    uid: str = created["metadata"]["uid"]
    for plural, obj in m.master_dependents(job.config, names, token):
        body = m.owned(obj, names.master_pod, uid)
        if (yield Op("create", plural, obj["metadata"]["name"], body)) is None:
            yield from _adopt(plural, body, uid)
    return uid


def _adopt(plural: str, body: dict[str, Any], uid: str) -> Steps[None]:
    """An object of that name exists: keep it if this master pod owns it, else replace it."""
    name = body["metadata"]["name"]
    found = yield Op("read", plural, name)
    if found is not None and m.owner_uid(found) == uid:
        return
    if found is not None:
        yield Op("delete", plural, name)
    if (yield Op("create", plural, name, body)) is None:
        raise RuntimeError(f"{plural}/{name} is being deleted; launch again")


def ensure_steps(job: KubernetesJob, names: m.JobNames, token: str) -> Steps[bool]:
    """Recreate a missing Secret or Service of a running master pod (reads only when all are
    there, so a re-created trigger creates nothing); False if the master pod is not running."""
    pod = yield Op("read", "pods", names.master_pod)
    if not _alive(pod):
        return False
    uid = pod["metadata"]["uid"]
    for plural, obj in m.master_dependents(job.config, names, token):
        name = obj["metadata"]["name"]
        found = yield Op("read", plural, name)
        if found is not None and m.owner_uid(found) == uid:
            continue
        log.warning("%s/%s is missing; recreating it", plural, name)
        if found is not None:  # left by an earlier master pod: about to be collected
            yield Op("delete", plural, name)
        yield Op("create", plural, name, m.owned(obj, names.master_pod, uid))  # 409: done
    return True


def cleanup_steps(names: m.JobNames, grace_s: int = MASTER_GRACE_S) -> Steps[str | None]:
    """Delete the master pod (its node pods go with it, by owner reference) and, explicitly,
    its Secret and Services; returns the tail of the master's log."""
    tail = yield Op("log", "pods", names.master_pod)
    yield Op("delete", "pods", names.master_pod, grace_s=grace_s)
    yield Op("delete", "secrets", names.secret)
    yield Op("delete", "services", names.master_service)
    yield Op("delete", "services", names.ps_service)
    return tail


# -- running the steps -----------------------------------------------------------------------
def _check(exc: Exception, op: Op, namespace: str) -> int:
    status = int(getattr(exc, "status", 0) or 0)
    if status == 403:
        raise KubernetesPermissionError(
            f"Kubernetes refused to {op.verb} {op.plural}/{op.name} in namespace {namespace!r} "
            f"(403): grant the rules of deploy/rbac-airflow.yaml"
        ) from exc
    return status


def run_sync(steps: Steps[T], api: Any, namespace: str) -> T:
    """Run ``steps`` with a ``kubernetes.client.CoreV1Api``."""
    from kubernetes.client.rest import ApiException

    answer: Any = None
    while True:
        try:
            op = steps.send(answer)
        except StopIteration as done:
            result: T = done.value
            return result
        try:
            answer = _call_sync(api, op, namespace)
        except ApiException as exc:
            _expected(_check(exc, op, namespace), op, exc)
            answer = None


def _call_sync(api: Any, op: Op, namespace: str) -> Any:
    kind = _SINGULAR[op.plural]
    if op.verb == "log":
        return str(api.read_namespaced_pod_log(op.name, namespace, tail_lines=LOG_TAIL_LINES) or "")
    if op.verb == "delete":
        getattr(api, f"delete_namespaced_{kind}")(
            op.name, namespace, grace_period_seconds=op.grace_s, propagation_policy="Background"
        )
        return None
    if op.verb == "create":
        reply = getattr(api, f"create_namespaced_{kind}")(namespace, op.body)
    else:
        reply = getattr(api, f"read_namespaced_{kind}")(op.name, namespace)
    serialized: dict[str, Any] = api.api_client.sanitize_for_serialization(reply)
    return serialized


async def run_async(steps: Steps[T], api: Any, namespace: str) -> T:
    """Run ``steps`` with a ``kubernetes_asyncio.client.CoreV1Api``."""
    from kubernetes_asyncio.client.exceptions import ApiException

    answer: Any = None
    while True:
        try:
            op = steps.send(answer)
        except StopIteration as done:
            result: T = done.value
            return result
        try:
            answer = await _call_async(api, op, namespace)
        except ApiException as exc:
            _expected(_check(exc, op, namespace), op, exc)
            answer = None


async def _call_async(api: Any, op: Op, namespace: str) -> Any:
    kind = _SINGULAR[op.plural]
    if op.verb == "log":
        return str(
            await api.read_namespaced_pod_log(op.name, namespace, tail_lines=LOG_TAIL_LINES) or ""
        )
    if op.verb == "delete":
        await getattr(api, f"delete_namespaced_{kind}")(
            op.name, namespace, grace_period_seconds=op.grace_s, propagation_policy="Background"
        )
        return None
    if op.verb == "create":
        reply = await getattr(api, f"create_namespaced_{kind}")(namespace, op.body)
    else:
        reply = await getattr(api, f"read_namespaced_{kind}")(op.name, namespace)
    serialized: dict[str, Any] = api.api_client.sanitize_for_serialization(reply)
    return serialized


def _expected(status: int, op: Op, exc: Exception) -> None:
    """Re-raise ``exc`` unless it is an expected answer (then None): absent (404), already
    there (409 on create), or a log that cannot be read (a courtesy, never worth failing)."""
    if status == 404 and op.verb in ("read", "delete", "log"):
        return
    if status == 409 and op.verb == "create":
        return
    if op.verb == "log":
        log.warning("log of %s unavailable: %s", op.name, exc)
        return
    raise exc


# -- the launcher the hook uses --------------------------------------------------------------
class KubernetesJobLauncher:
    """Launches, checks and removes a job's master pod, through the cncf-kubernetes hooks."""

    def __init__(self, job: KubernetesJob) -> None:
        self.job = job
        self.namespace = job.config.namespace

    def names(self, layout: JobDir) -> m.JobNames:
        return m.JobNames(layout.read_spec().job_id, self.namespace)

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

    # -- operator side (sync) ----------------------------------------------------------------
    def start_job(self, layout: JobDir, spec: JobSpec, wait_s: float = 120.0) -> str:
        """Remove a stale master of an earlier try, write the job's files, create the master
        pod, Secret and Services; returns the master pod's name. The master announces itself
        in ``master.json`` once its pod runs (the trigger waits for it, not the task)."""
        names = m.JobNames(spec.job_id, self.namespace)
        previous = KubernetesJob.read(layout)
        if previous is not None and layout.spec_file.exists():  # where the last try ran
            KubernetesJobLauncher(previous).remove_stale(layout, wait_s)
        api = self.sync_api()
        layout.root.mkdir(parents=True, exist_ok=True)
        for stale in (layout.master_file, layout.state_file):
            stale.unlink(missing_ok=True)
        layout.write_spec(spec)
        token = layout.ensure_token()
        self.job.write(layout)
        run_sync(
            launch_steps(self.job, names, PurePosixPath(layout.root), token), api, self.namespace
        )
        return names.master_pod

    def remove_stale(self, layout: JobDir, wait_s: float) -> None:
        """Remove an earlier try's master pod (and what it owns) and wait until it is gone,
        so the new one can take its name."""
        api = self.sync_api()
        self._save_master_log(
            layout, run_sync(cleanup_steps(self.names(layout)), api, self.namespace)
        )
        self._wait_gone(api, self.names(layout), wait_s)

    def _wait_gone(self, api: Any, names: m.JobNames, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while run_sync(master_pod_steps(names), api, self.namespace) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"pod {names.master_pod} of an earlier try is still terminating after "
                    f"{wait_s:.0f} s"
                )
            time.sleep(1.0)

    def job_alive(self, layout: JobDir) -> bool:
        """Whether the master pod is pending or running; an unanswered check counts as alive
        (the status stays ``unreachable``), never as a dead job."""
        try:
            pod = self._run(master_pod_steps(self.names(layout)))
        except KubernetesPermissionError:
            raise
        except Exception as exc:
            log.warning("Could not read the master pod (%s); assuming it runs", exc)
            return True
        return self._judge(layout, pod)

    def stop_job_master(self, layout: JobDir) -> None:
        self._save_master_log(layout, self._run(cleanup_steps(self.names(layout))))

    # -- trigger side (async) ----------------------------------------------------------------
    async def async_job_alive(self, layout: JobDir) -> bool:
        try:
            pod = await self._arun(master_pod_steps(self.names(layout)))
        except KubernetesPermissionError:
            raise
        except Exception as exc:
            log.warning("Could not read the master pod (%s); assuming it runs", exc)
            return True
        return await asyncio.to_thread(self._judge, layout, pod)

    @staticmethod
    def _judge(layout: JobDir, pod: dict[str, Any] | None) -> bool:
        """Alive or not; a master pod that ended or cannot start says why in the master's log
        (which the failed job's message points to), once."""
        if _alive(pod) or pod is None:
            return pod is not None
        code = exit_code(pod)
        if not code:  # it ended well (the job's state says how the job ended)
            return False
        note = f"[master pod: {failure_note(pod, code)}]"
        path = layout.log_file("master")
        try:
            if note not in (path.read_text() if path.exists() else ""):
                KubernetesJobLauncher._save_master_log(layout, note)
        except OSError as exc:
            log.warning("Could not read the master's log: %s", exc)
        return False

    async def async_ensure(self, layout: JobDir) -> bool:
        return await self._arun(ensure_steps(self.job, self.names(layout), layout.read_token()))

    async def async_cleanup(self, layout: JobDir) -> None:
        tail = await self._arun(cleanup_steps(self.names(layout)))
        await asyncio.to_thread(self._save_master_log, layout, tail)

    @staticmethod
    def _save_master_log(layout: JobDir, tail: str | None) -> None:
        """The master pod's log goes where the local master's goes (``logs/master.log``)."""
        if not tail:
            return
        try:
            path = layout.log_file("master")
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as fh:
                fh.write(tail if tail.endswith("\n") else tail + "\n")
        except OSError as exc:
            log.warning("Could not save the master's log: %s", exc)


def master_pod_steps(names: m.JobNames) -> Steps[dict[str, Any] | None]:
    """Read the master pod (None if there is none)."""
    pod: dict[str, Any] | None = yield Op("read", "pods", names.master_pod)
    return pod
