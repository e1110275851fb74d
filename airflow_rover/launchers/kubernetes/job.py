"""Airflow's side of a Kubernetes job: its master pod, Services, Secret (token, TLS) and
NetworkPolicy.

The operator launches a job through the cncf-kubernetes provider's ``KubernetesHook``
(``kubernetes_conn_id``: in-cluster, a kubeconfig, or the default); the trigger checks and
cleans up through its ``AsyncKubernetesHook``. What to do is written once, as steps that yield
API operations (``Op``), and run by a sync or an async driver, so the two paths cannot drift.
The master pod itself creates and deletes the node pods (``nodes.KubernetesNodeLauncher``).
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal, TypeVar

from airflow_rover.launchers.kubernetes import manifests as m
from airflow_rover.launchers.kubernetes.config import KubernetesJob
from airflow_rover.launchers.kubernetes.pod_status import exit_code

log = logging.getLogger(__name__)

T = TypeVar("T")
Verb = Literal["read", "create", "delete", "log"]
_KINDS = {  # plural -> (API class, the kind in its method names)
    "pods": ("CoreV1Api", "pod"),
    "secrets": ("CoreV1Api", "secret"),
    "services": ("CoreV1Api", "service"),
    "networkpolicies": ("NetworkingV1Api", "network_policy"),
}
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


def pod_alive(pod: dict[str, Any] | None) -> bool:
    """The master pod runs or may still start: not deleted, its container not ended, and not
    stuck where it never starts by itself (an image that cannot be pulled)."""
    return (
        pod is not None and not pod["metadata"].get("deletionTimestamp") and exit_code(pod) is None
    )


# -- what to do (pure: each step is an Op, its answer comes back through send) ---------------
def launch_steps(
    job: KubernetesJob, names: m.JobNames, job_dir: PurePosixPath, secrets: m.JobSecrets
) -> Steps[str]:
    """Create the master pod, then its Secret, Services and NetworkPolicy owned by it; returns
    its uid. Repeating it creates nothing twice: an existing object of this master pod is kept,
    one left by an earlier master pod is replaced."""
    created = yield Op("create", "pods", names.master_pod, m.master_pod(job.config, names, job_dir))
    if created is None:
        created = yield Op("read", "pods", names.master_pod)
        if created is None:
            raise RuntimeError(f"pod {names.master_pod} exists and does not: retry the launch")
    uid: str = created["metadata"]["uid"]
    for plural, obj in m.master_dependents(job.config, names, secrets):
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


def ensure_steps(job: KubernetesJob, names: m.JobNames, secrets: m.JobSecrets) -> Steps[bool]:
    """Recreate a missing Secret or Service of a running master pod (reads only when all are
    there, so a re-created trigger creates nothing); False if the master pod is not running."""
    pod = yield Op("read", "pods", names.master_pod)
    if not pod_alive(pod):
        return False
    uid = pod["metadata"]["uid"]
    for plural, obj in m.master_dependents(job.config, names, secrets):
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
    its Secret, Services and NetworkPolicy; returns the tail of the master's log."""
    tail = yield Op("log", "pods", names.master_pod)
    yield Op("delete", "pods", names.master_pod, grace_s=grace_s)
    yield Op("delete", "secrets", names.secret)
    yield Op("delete", "services", names.master_service)
    yield Op("delete", "services", names.ps_service)
    yield Op("delete", "services", names.data_service)
    yield Op("delete", "networkpolicies", names.network_policy)
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


def _api_of(core: Any, client_module: Any, plural: str) -> tuple[Any, str]:
    """The API object that serves ``plural`` (sharing the core API's client) and its kind."""
    group, kind = _KINDS[plural]
    api = core if group == "CoreV1Api" else getattr(client_module, group)(core.api_client)
    return api, kind


def _call_sync(core: Any, op: Op, namespace: str) -> Any:
    from kubernetes import client

    api, kind = _api_of(core, client, op.plural)
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


async def _call_async(core: Any, op: Op, namespace: str) -> Any:
    from kubernetes_asyncio import client

    api, kind = _api_of(core, client, op.plural)
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


def master_pod_steps(names: m.JobNames) -> Steps[dict[str, Any] | None]:
    """Read the master pod (None if there is none)."""
    pod: dict[str, Any] | None = yield Op("read", "pods", names.master_pod)
    return pod
