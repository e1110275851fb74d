"""The master's ``NodeLauncher`` on Kubernetes: one pod per PS, worker, evaluator and
data worker.

It runs inside the master pod with the master's service account (pods only, its namespace).
Pods are named ``rover-<job>-<node id>`` and owned by the master pod. Each master process is an
*incarnation* (the keeper's restart count): a pod of an earlier incarnation or of an earlier
master pod is replaced, as the local launcher's nodes die with their master, so a relaunched
master always starts from its checkpoint with fresh nodes.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.spec import DataWorkersConfig, ResourcePlan
from airflow_rover.launchers.kubernetes import manifests as m
from airflow_rover.launchers.kubernetes.config import KubernetesConfig
from airflow_rover.launchers.kubernetes.pod_status import (
    exit_code,
    exit_reason,
    failure_note,
    unscheduled,
)
from airflow_rover.master.node_launcher import Capability, NodeLauncher, ResizeOutcome, Role

log = logging.getLogger(__name__)

EXIT_STOPPED = -15  # what the local launcher reports for a node it terminated
EXIT_VANISHED = -9  # the pod went away without the master asking (evicted, deleted)
LOG_TAIL_LINES = 200


def _json(reply: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(reply.data)
    return data


class KubernetesNodeLauncher(NodeLauncher):
    """Creates, watches and deletes one job's node pods; sizes come from the job's plan. The
    cluster's size is not the master's to know (``capacity_cpu`` None)."""

    capabilities = frozenset({Capability.RESIZE})

    def __init__(
        self,
        api: client.CoreV1Api,
        config: KubernetesConfig,
        names: m.JobNames,
        job_dir: JobDir,
        master_uid: str,
        incarnation: int,
        plan_of: Callable[[], ResourcePlan] | None = None,
        data_workers_of: Callable[[], DataWorkersConfig] | None = None,
        poll_s: float = 2.0,
        wait_s: float = 60.0,
    ) -> None:
        self.api = api
        self.config = config
        self.names = names
        self.job_dir = job_dir
        self.master_uid = master_uid
        self.incarnation = incarnation
        self._plan_of = plan_of or (lambda: job_dir.read_spec().plan)
        self._data_workers_of = data_workers_of or (lambda: job_dir.read_spec().data_workers)
        self._poll_s = poll_s
        self._wait_s = wait_s
        self._started: dict[str, Role] = {}
        self._stopped: set[str] = set()
        self._exits: dict[str, int] = {}
        self._reasons: dict[str, str] = {}  # why an exited pod's container ended
        self._created_at: dict[str, float] = {}  # when each node's pod was last created
        self._sizes: dict[str, tuple[float, int]] = {}  # replaced to resize: its next start
        self._pods: dict[str, dict[str, Any]] = {}
        self._listed_at: float | None = None

    # -- NodeLauncher ------------------------------------------------------------------------
    def start(self, node_id: str, role: Role) -> None:
        """Create the node's pod; a pod of this incarnation that still runs is left alone,
        any other pod of that name (exited, or an earlier master's) is replaced."""
        name = self.names.node_pod(node_id)
        size = self.size_of(node_id, role)
        self._sizes.pop(node_id, None)  # a replaced node starts at its new size once
        body = m.node_pod(
            self.config,
            self.names,
            node_id,
            role,
            PurePosixPath(self.job_dir.root),
            size,
            self.master_uid,
            self.incarnation,
        )
        self._started[node_id] = role
        self._stopped.discard(node_id)
        self._exits.pop(node_id, None)
        self._reasons.pop(node_id, None)
        self._created_at[node_id] = time.monotonic()
        self._listed_at = None
        try:
            self.api.create_namespaced_pod(self.config.namespace, body, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise
            existing = self._read(name)
            if existing is not None and self._mine(existing) and exit_code(existing) is None:
                return  # already running: starting twice is a no-op
            self._delete(name, grace_s=0)
            self._wait_gone(name)
            self.api.create_namespaced_pod(self.config.namespace, body, _preload_content=False)
        log.info("created pod %s (%s, %s)", name, role, body["spec"]["containers"][0]["resources"])

    def exit_codes(self) -> dict[str, int | None]:
        """Each started node's exit code from its pod (listed at most every ``poll_s``); a pod
        that is gone counts as stopped (-15) if the master stopped it, else killed (-9)."""
        self._refresh()
        codes: dict[str, int | None] = {}
        for node_id in self._started:
            if node_id in self._exits:
                codes[node_id] = self._exits[node_id]
                continue
            pod = self._pods.get(node_id)
            if pod is None:
                code: int | None = EXIT_STOPPED if node_id in self._stopped else EXIT_VANISHED
            else:
                code = exit_code(pod)
            if code is not None:
                self._exits[node_id] = code
                reason = exit_reason(pod)
                if reason is not None:
                    self._reasons[node_id] = reason
                if node_id not in self._stopped:
                    self._save_log(node_id, pod, code)
            codes[node_id] = code
        return codes

    def pending_s(self) -> dict[str, float]:
        """Seconds since each unscheduled node pod of this master was created (listed at
        most every ``poll_s``)."""
        self._refresh()
        now = time.monotonic()
        return {
            node_id: now - self._created_at[node_id]
            for node_id, pod in self._pods.items()
            if node_id in self._created_at
            and node_id not in self._stopped
            and node_id not in self._exits
            and unscheduled(pod)
        }

    def exit_reason(self, node_id: str) -> str | None:
        """The terminated reason of the node's exited container (``OOMKilled``)."""
        return self._reasons.get(node_id)

    def stop(self, node_id: str, grace_s: float = 5.0) -> None:
        """Delete the node's pod and wait (bounded) until it is gone."""
        if node_id not in self._started or node_id in self._exits:
            return
        self._stopped.add(node_id)
        name = self.names.node_pod(node_id)
        self._delete(name, grace_s=grace_s)
        self._wait_gone(name, grace_s + 10.0)
        self._listed_at = None

    def stop_all(self, grace_s: float = 5.0) -> None:
        """Delete every node pod of the job (any incarnation) and wait until they are gone."""
        self._stopped.update(self._started)
        pods = self._list(self.names.nodes_selector())
        for pod in pods:
            self._delete(pod["metadata"]["name"], grace_s=grace_s)
        deadline = time.monotonic() + grace_s + 10.0
        for pod in pods:
            self._wait_gone(pod["metadata"]["name"], max(0.0, deadline - time.monotonic()))
        self._listed_at = None

    # -- resizing ----------------------------------------------------------------------------
    def size_of(self, node_id: str, role: Role) -> tuple[float, int]:
        """The node's size under the job's plan (a data worker's from the spec's
        ``data_workers``); a node replaced to resize it starts at the size asked for."""
        if node_id in self._sizes:
            return self._sizes[node_id]
        data_workers = self._data_workers_of() if role == "data" else None
        return m.node_size(self._plan_of(), role, data_workers, node_id)

    def resize(self, node_id: str, role: Role, cpu: float, memory_mb: int) -> ResizeOutcome:
        """Give a running node a new size: in place through the pod's ``resize`` subresource
        where the cluster has it (Kubernetes >= 1.33, the process keeps running); else its pod
        is deleted and reported exited, so the master recovers it as after any death and its
        ``start`` creates it at the new size (a PS restores its checkpoint)."""
        size = (cpu, memory_mb)
        name = self.names.node_pod(node_id)
        if self.config.resize_in_place:
            try:
                self.api.patch_namespaced_pod_resize(
                    name, self.config.namespace, m.resize_patch(role, size), _preload_content=False
                )
                log.info("resized pod %s in place to %s cores, %d MB", name, cpu, memory_mb)
                return "in-place"
            except ApiException as exc:
                if exc.status not in (400, 403, 404, 405, 415, 422):
                    raise
                log.warning(
                    "pod %s cannot be resized in place (%s %s); replacing it",
                    name,
                    exc.status,
                    exc.reason,
                )
        self._sizes[node_id] = size  # its next start (the relaunch) creates it at this size
        self._delete(name, grace_s=5.0)
        self._wait_gone(name, 15.0)
        self._stopped.add(node_id)  # reported exited (-15); the master relaunches it bigger
        self._listed_at = None
        self._append_log(node_id, [f"[{node_id}: pod deleted to resize it to {size} (cores, MB)]"])
        return "replace"

    # -- API helpers -------------------------------------------------------------------------
    def _mine(self, pod: dict[str, Any]) -> bool:
        labels = pod.get("metadata", {}).get("labels") or {}
        return (
            m.owner_uid(pod) == self.master_uid
            and labels.get(m.LABEL_INCARNATION) == str(self.incarnation)
            and not pod["metadata"].get("deletionTimestamp")
        )

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            return _json(
                self.api.read_namespaced_pod(name, self.config.namespace, _preload_content=False)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _delete(self, name: str, grace_s: float) -> None:
        try:
            self.api.delete_namespaced_pod(
                name,
                self.config.namespace,
                grace_period_seconds=int(grace_s),
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _wait_gone(self, name: str, timeout_s: float | None = None) -> None:
        deadline = time.monotonic() + (self._wait_s if timeout_s is None else timeout_s)
        while self._read(name) is not None:
            if time.monotonic() > deadline:
                log.warning("pod %s still exists after %.0f s", name, timeout_s or self._wait_s)
                return
            time.sleep(0.5)

    def _list(self, selector: str) -> list[dict[str, Any]]:
        reply = self.api.list_namespaced_pod(
            self.config.namespace, label_selector=selector, _preload_content=False
        )
        items: list[dict[str, Any]] = _json(reply).get("items") or []
        return items

    def _refresh(self) -> None:
        now = time.monotonic()
        if self._listed_at is not None and now - self._listed_at < self._poll_s:
            return
        pods = self._list(self.names.nodes_selector(self.incarnation))
        self._pods = {
            p["metadata"]["labels"][m.LABEL_NODE]: p
            for p in pods
            if m.owner_uid(p) == self.master_uid  # not a pod of an earlier master pod
        }
        self._listed_at = now

    def _save_log(self, node_id: str, pod: dict[str, Any] | None, code: int) -> None:
        """Keep a dead node's last log lines in the job directory, where the master's failure
        message reads them (``logs/<node>.log``); best effort."""
        lines = [f"[{node_id}: {failure_note(pod, code)}]"]
        if pod is not None:
            try:
                text = self.api.read_namespaced_pod_log(
                    pod["metadata"]["name"],
                    self.config.namespace,
                    tail_lines=LOG_TAIL_LINES,
                    _preload_content=False,
                ).data.decode(errors="replace")
                lines.insert(0, text.rstrip("\n"))
            except ApiException as exc:
                lines.append(f"[log unavailable: {exc.status} {exc.reason}]")
        self._append_log(node_id, lines)

    def _append_log(self, node_id: str, lines: list[str]) -> None:
        path = self.job_dir.log_file(node_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as fh:
                fh.write("\n".join(lines) + "\n")
        except OSError as exc:
            log.warning("could not save the log of %s: %s", node_id, exc)
