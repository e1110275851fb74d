"""Pure builders of every Kubernetes object a job uses (plain dicts, no network).

Names are deterministic from the job id and node id, so creating an object twice is harmless
(``409 AlreadyExists`` means done) and a relaunched master or a re-created trigger finds the
objects of its job by name. Every object carries the job's labels; everything but the master pod
has an owner reference to the master pod, so deleting the master pod garbage-collects the job.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from airflow_rover.core.job_dir import (
    ENV_ADVERTISE_HOST,
    ENV_BIND_HOST,
    ENV_DATA_PORT,
    ENV_FLASH_DIR,
    ENV_JOB_DIR,
    ENV_MASTER_ADDR,
    ENV_NODE_ID,
    ENV_PS_PORT,
    ENV_TOKEN_FILE,
)
from airflow_rover.core.job_tls import ENV_TLS_CERT_FILE, ENV_TLS_KEY_FILE
from airflow_rover.core.spec import DataWorkersConfig, ResourcePlan
from airflow_rover.launchers.base import KEEPER_MODULE, ROLE_MODULES
from airflow_rover.launchers.kubernetes.config import (
    ENV_MASTER_ADVERTISE,
    ENV_MASTER_HOST,
    ENV_MASTER_PORT,
    ENV_NAMESPACE,
    ENV_POD_NAME,
    ENV_POD_UID,
    KubernetesConfig,
)
from airflow_rover.master.node_launcher import Role

APP = "airflow-rover"
LABEL_JOB = "airflow-rover/job"
LABEL_NODE = "airflow-rover/node"
LABEL_INCARNATION = "airflow-rover/incarnation"
LABEL_COMPONENT = "app.kubernetes.io/component"
ANNOTATION_JOB_ID = "airflow-rover/job-id"
LABEL_CLIENT = "airflow-rover/client"
"""The label (value ``"true"``) that lets an Airflow worker's or triggerer's pod reach the
masters of jobs (``network_policy``)."""
LABEL_NAMESPACE_NAME = "kubernetes.io/metadata.name"
TOKEN_KEY = "token"
TLS_CERT_KEY = "tls.crt"
TLS_KEY_KEY = "tls.key"
TOKEN_DIR = "/var/run/secrets/airflow-rover"
TOKEN_PATH = f"{TOKEN_DIR}/{TOKEN_KEY}"
TLS_CERT_PATH = f"{TOKEN_DIR}/{TLS_CERT_KEY}"
TLS_KEY_PATH = f"{TOKEN_DIR}/{TLS_KEY_KEY}"
FLASH_DIR = "/var/run/airflow-rover/flash"
MAX_SLUG = 44  # "rover-" + slug + "-worker-1023" stays within a 63-character DNS label
_NODE_ID = re.compile(r"^(ps|worker|data)-(\d{1,4})$|^evaluator$")
SERVING_ROLES: frozenset[str] = frozenset({"ps", "data"})
"""Node roles that serve the job's other nodes over TLS (they get the key, a stable DNS name)."""


def job_slug(job_id: str) -> str:
    """``job_id`` as a DNS label of at most ``MAX_SLUG`` characters; a hash keeps long or
    rewritten ids unique."""
    clean = re.sub(r"[^a-z0-9-]+", "-", job_id.lower()).strip("-")
    if clean == job_id and len(clean) <= MAX_SLUG:
        return clean
    digest = hashlib.sha1(job_id.encode()).hexdigest()[:10]
    return f"{clean[: MAX_SLUG - 11].rstrip('-') or 'job'}-{digest}"


@dataclass(frozen=True)
class JobNames:
    """The names of one job's objects, all derived from its id."""

    job_id: str
    namespace: str

    @property
    def slug(self) -> str:
        return job_slug(self.job_id)

    @property
    def prefix(self) -> str:
        return f"rover-{self.slug}"

    @property
    def master_pod(self) -> str:
        return f"{self.prefix}-master"

    @property
    def master_service(self) -> str:
        return f"{self.prefix}-master"

    @property
    def ps_service(self) -> str:
        return f"{self.prefix}-ps"

    @property
    def data_service(self) -> str:
        return f"{self.prefix}-data"

    @property
    def secret(self) -> str:
        return f"{self.prefix}-token"

    @property
    def network_policy(self) -> str:
        return f"{self.prefix}-network"

    def node_pod(self, node_id: str) -> str:
        check_node_id(node_id)
        return f"{self.prefix}-{node_id}"

    def master_address(self, port: int) -> str:
        return f"https://{self.master_service}.{self.namespace}.svc:{port}"

    def tls_hosts(self) -> list[str]:
        """The names the job's certificate is for: its master's Service, and every PS and data
        worker under their headless Services."""
        return [
            f"{self.master_service}.{self.namespace}.svc",
            f"*.{self.ps_host_suffix}",
            f"*.{self.data_host_suffix}",
        ]

    @property
    def ps_host_suffix(self) -> str:
        return f"{self.ps_service}.{self.namespace}.svc"

    def ps_host(self, node_id: str) -> str:
        """The stable DNS name of a PS pod (its hostname under the headless PS Service)."""
        return f"{self.node_pod(node_id)}.{self.ps_host_suffix}"

    @property
    def data_host_suffix(self) -> str:
        return f"{self.data_service}.{self.namespace}.svc"

    def data_host(self, node_id: str) -> str:
        """The stable DNS name of a data worker pod (its hostname under the headless data
        Service): the address trainers reach it at."""
        return f"{self.node_pod(node_id)}.{self.data_host_suffix}"

    def node_subdomain(self, role: Role) -> str | None:
        """The headless Service giving pods of ``role`` their DNS names (None: not reached)."""
        return {"ps": self.ps_service, "data": self.data_service}.get(role)

    def node_host(self, node_id: str, role: Role) -> str:
        """The stable DNS name a serving node of ``role`` advertises."""
        return self.ps_host(node_id) if role == "ps" else self.data_host(node_id)

    def job_selector(self) -> str:
        return f"{LABEL_JOB}={self.slug}"

    def nodes_selector(self, incarnation: int | None = None) -> str:
        """Label selector of the job's node pods (of one master incarnation if given)."""
        selector = f"{self.job_selector()},{LABEL_NODE}"
        return selector if incarnation is None else f"{selector},{LABEL_INCARNATION}={incarnation}"


@dataclass(frozen=True)
class JobSecrets:
    """What the job's Secret holds: its bearer token, and its TLS certificate and key
    (``rpc.tls.make_certificate`` for ``JobNames.tls_hosts``), both PEM."""

    token: str
    tls_cert: bytes
    tls_key: bytes


def check_node_id(node_id: str) -> str:
    if not _NODE_ID.match(node_id):
        raise ValueError(f"node id {node_id!r}: expected ps-<n>, worker-<n>, data-<n> or evaluator")
    return node_id


# -- quantities ------------------------------------------------------------------------------
def cpu_quantity(cores: float) -> str:
    """Cores as a Kubernetes quantity: whole cores as ``"2"``, others in millicores."""
    milli = max(1, math.ceil(round(cores * 1000, 6)))
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def memory_quantity(mb: int) -> str:
    return f"{int(mb)}Mi"


def resources(cpu: float, memory_mb: int) -> dict[str, Any]:
    """Requests equal to limits (Guaranteed QoS): a plan's size is what the node gets."""
    amount = {"cpu": cpu_quantity(cpu), "memory": memory_quantity(memory_mb)}
    return {"requests": dict(amount), "limits": dict(amount)}


def node_size(
    plan: ResourcePlan,
    role: Role,
    data_workers: DataWorkersConfig | None = None,
    node_id: str | None = None,
) -> tuple[float, int]:
    """(cores, MB) of a node of ``role``: from ``plan`` (``node_id``'s own size where the plan
    sizes it apart), the evaluator sized as a worker; a data worker from the spec's
    ``data_workers`` (the plan does not size them)."""
    if role == "data":
        if data_workers is None:
            raise ValueError("a data worker's size comes from the spec's data_workers: give it")
        return data_workers.cpu, data_workers.memory_mb
    if node_id is not None:
        return plan.size_of(node_id)
    return plan.role_size(role)


# -- shared pieces ---------------------------------------------------------------------------
def labels(cfg: KubernetesConfig, names: JobNames, component: str) -> dict[str, str]:
    return {
        **cfg.labels,
        "app.kubernetes.io/name": APP,
        "app.kubernetes.io/managed-by": APP,
        LABEL_COMPONENT: component,
        LABEL_JOB: names.slug,
    }


def metadata(
    cfg: KubernetesConfig, names: JobNames, name: str, component: str, **extra_labels: str
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": cfg.namespace,
        "labels": {**labels(cfg, names, component), **extra_labels},
        "annotations": {ANNOTATION_JOB_ID: names.job_id},
    }


def owner_reference(master_pod: str, uid: str) -> dict[str, Any]:
    """Makes an object a dependent of the master pod: deleting that pod collects it."""
    return {"apiVersion": "v1", "kind": "Pod", "name": master_pod, "uid": uid, "controller": True}


def owned(obj: dict[str, Any], master_pod: str, uid: str) -> dict[str, Any]:
    """A copy of ``obj`` owned by the master pod ``uid``."""
    meta = {**obj["metadata"], "ownerReferences": [owner_reference(master_pod, uid)]}
    return {**obj, "metadata": meta}


def owner_uid(obj: dict[str, Any]) -> str | None:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return next((r.get("uid") for r in refs if r.get("kind") == "Pod"), None)


def _security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
    }


def _pod_spec(
    cfg: KubernetesConfig,
    names: JobNames,
    container: dict[str, Any],
    volumes: list[dict[str, Any]],
    *,
    service_account: str | None,
    serves: bool,
    restart_policy: str = "Never",
) -> dict[str, Any]:
    """``serves``: the pod serves the job's API, a PS or batches, so it gets the TLS key too."""
    secret_keys = [TOKEN_KEY, TLS_CERT_KEY, *([TLS_KEY_KEY] if serves else [])]
    spec: dict[str, Any] = {
        "restartPolicy": restart_policy,
        "automountServiceAccountToken": service_account is not None,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsUser": cfg.run_as_user,
            "runAsGroup": cfg.run_as_group,
            "fsGroup": cfg.run_as_group,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "job", "persistentVolumeClaim": {"claimName": cfg.job_volume_claim}},
            {
                "name": "token",
                "secret": {
                    "secretName": names.secret,
                    "defaultMode": 0o440,
                    "items": [{"key": k, "path": k} for k in secret_keys],
                },
            },
            *volumes,
            *cfg.volumes,
        ],
    }
    if service_account is not None:
        spec["serviceAccountName"] = service_account
    if cfg.node_selector:
        spec["nodeSelector"] = dict(cfg.node_selector)
    if cfg.tolerations:
        spec["tolerations"] = [t.manifest() for t in cfg.tolerations]
    if cfg.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in cfg.image_pull_secrets]
    return spec


def _mounts(cfg: KubernetesConfig, *extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"name": "job", "mountPath": cfg.job_volume_mount_path},
        {"name": "token", "mountPath": TOKEN_DIR, "readOnly": True},
        *extra,
        *cfg.volume_mounts,
    ]


def _env(cfg: KubernetesConfig, values: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in {**cfg.env, **values}.items()]


def _tls_env(serves: bool) -> dict[str, str]:
    """Where a process finds the job's certificate (every one trusts it) and key (a server's)."""
    env = {ENV_TLS_CERT_FILE: TLS_CERT_PATH}
    if serves:
        env[ENV_TLS_KEY_FILE] = TLS_KEY_PATH
    return env


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


# -- the master's objects (created from Airflow) ---------------------------------------------
def master_pod(cfg: KubernetesConfig, names: JobNames, job_dir: PurePosixPath) -> dict[str, Any]:
    """The job master's pod: its keeper relaunches the master process inside it; the master
    creates and deletes the node pods with its service account."""
    container = {
        "name": "master",
        "image": cfg.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": ["python", "-m", KEEPER_MODULE, "--job-dir", str(job_dir)],
        "ports": [{"name": "api", "containerPort": cfg.master_port, "protocol": "TCP"}],
        "env": [
            *_env(
                cfg,
                {
                    ENV_MASTER_HOST: "0.0.0.0",
                    ENV_MASTER_PORT: str(cfg.master_port),
                    ENV_MASTER_ADVERTISE: names.master_address(cfg.master_port),
                    ENV_TOKEN_FILE: TOKEN_PATH,
                    **_tls_env(serves=True),
                    "PYTHONUNBUFFERED": "1",
                },
            ),
            _field_env(ENV_POD_NAME, "metadata.name"),
            _field_env(ENV_POD_UID, "metadata.uid"),
            _field_env(ENV_NAMESPACE, "metadata.namespace"),
        ],
        "resources": resources(cfg.master_cpu, cfg.master_memory_mb),
        "readinessProbe": {"tcpSocket": {"port": "api"}, "periodSeconds": 5},
        "volumeMounts": _mounts(cfg),
        "securityContext": _security_context(),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata(cfg, names, names.master_pod, "master"),
        "spec": _pod_spec(
            cfg, names, container, [], service_account=cfg.master_service_account, serves=True
        ),
    }


def token_secret(cfg: KubernetesConfig, names: JobNames, secrets: JobSecrets) -> dict[str, Any]:
    """The job's bearer token and TLS certificate and key, mounted as files by the pods (never
    an env value; the key only where a server runs)."""
    data = {
        TOKEN_KEY: secrets.token.encode(),
        TLS_CERT_KEY: secrets.tls_cert,
        TLS_KEY_KEY: secrets.tls_key,
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(cfg, names, names.secret, "token"),
        "type": "Opaque",
        "immutable": True,
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def master_service(cfg: KubernetesConfig, names: JobNames) -> dict[str, Any]:
    """The master's stable address (``JobNames.master_address``)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(cfg, names, names.master_service, "master"),
        "spec": {
            "type": "ClusterIP",
            "selector": {LABEL_JOB: names.slug, LABEL_COMPONENT: "master"},
            "ports": [
                {"name": "api", "port": cfg.master_port, "targetPort": "api", "protocol": "TCP"}
            ],
        },
    }


def ps_service(cfg: KubernetesConfig, names: JobNames) -> dict[str, Any]:
    """Headless Service giving each PS pod a stable DNS name; published before readiness so a
    relaunched PS is resolvable as soon as it runs."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(cfg, names, names.ps_service, "ps"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: names.slug, LABEL_COMPONENT: "ps"},
            "ports": [
                {"name": "grpc", "port": cfg.ps_port, "targetPort": "grpc", "protocol": "TCP"}
            ],
        },
    }


def data_service(cfg: KubernetesConfig, names: JobNames) -> dict[str, Any]:
    """Headless Service giving each data worker pod a stable DNS name (the one it advertises
    and the job's certificate names), as ``ps_service`` does for the PS."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(cfg, names, names.data_service, "data"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: names.slug, LABEL_COMPONENT: "data"},
            "ports": [
                {
                    "name": "batches",
                    "port": cfg.data_port,
                    "targetPort": "batches",
                    "protocol": "TCP",
                }
            ],
        },
    }


def network_policy(cfg: KubernetesConfig, names: JobNames) -> dict[str, Any]:
    """Who may connect to the job's pods: the job's own pods (to the master's API and the PS),
    the job's worker pods (to the data workers' port: only trainers fetch batches), and pods
    labelled ``LABEL_CLIENT`` in Airflow's namespace (to the master's API: the Airflow workers
    and triggerer). Nothing else reaches them, whatever it knows."""
    tcp = [{"protocol": "TCP", "port": cfg.master_port}, {"protocol": "TCP", "port": cfg.ps_port}]
    airflow: dict[str, Any] = {"podSelector": {"matchLabels": {LABEL_CLIENT: "true"}}}
    if cfg.airflow_namespace and cfg.airflow_namespace != cfg.namespace:
        airflow["namespaceSelector"] = {
            "matchLabels": {LABEL_NAMESPACE_NAME: cfg.airflow_namespace}
        }
    job = {"matchLabels": {LABEL_JOB: names.slug}}
    workers = {"matchLabels": {LABEL_JOB: names.slug, LABEL_COMPONENT: "worker"}}
    data = [{"protocol": "TCP", "port": cfg.data_port}]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(cfg, names, names.network_policy, "network"),
        "spec": {
            "podSelector": job,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": job}], "ports": tcp},
                {"from": [{"podSelector": workers}], "ports": data},
                {"from": [airflow], "ports": tcp[:1]},
            ],
        },
    }


def master_dependents(
    cfg: KubernetesConfig, names: JobNames, secrets: JobSecrets
) -> list[tuple[str, dict[str, Any]]]:
    """The objects created beside the master pod, as (resource plural, object)."""
    return [
        ("secrets", token_secret(cfg, names, secrets)),
        ("services", master_service(cfg, names)),
        ("services", ps_service(cfg, names)),
        ("services", data_service(cfg, names)),
        ("networkpolicies", network_policy(cfg, names)),
    ]


# -- the node pods (created by the master) ---------------------------------------------------
def _node_env(
    cfg: KubernetesConfig, names: JobNames, node_id: str, job_dir: PurePosixPath, cpu: float
) -> dict[str, str]:
    """What every node is told: its job, its id, the master and the token file."""
    return {
        ENV_JOB_DIR: str(job_dir),
        ENV_NODE_ID: node_id,
        ENV_MASTER_ADDR: names.master_address(cfg.master_port),
        ENV_TOKEN_FILE: TOKEN_PATH,
        "OMP_NUM_THREADS": str(max(1, math.ceil(cpu))),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONUNBUFFERED": "1",
    }


def _serving_env(
    cfg: KubernetesConfig, names: JobNames, node_id: str, role: Role
) -> dict[str, str]:
    """What a PS or data worker is told besides: where it listens, the name it is reached by
    (a PS: its flash dir too)."""
    env = {ENV_BIND_HOST: "0.0.0.0", ENV_ADVERTISE_HOST: names.node_host(node_id, role)}
    if role == "ps":
        env.update({ENV_PS_PORT: str(cfg.ps_port), ENV_FLASH_DIR: FLASH_DIR})
    else:
        env[ENV_DATA_PORT] = str(cfg.data_port)
    return env


def _ports(cfg: KubernetesConfig, role: Role) -> list[dict[str, Any]]:
    """The container port of a serving node (named as its Service's targetPort)."""
    if role == "ps":
        return [{"name": "grpc", "containerPort": cfg.ps_port, "protocol": "TCP"}]
    return [{"name": "batches", "containerPort": cfg.data_port, "protocol": "TCP"}]


def _node_container(cfg: KubernetesConfig, role: Role, size: tuple[float, int]) -> dict[str, Any]:
    """A node's container but its ports, environment and mounts: resizable in place."""
    cpu, memory_mb = size
    return {
        "name": role,
        "image": cfg.image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": ["python", "-m", ROLE_MODULES[role], "--role", role],
        "resources": resources(cpu, memory_mb),
        "resizePolicy": [
            {"resourceName": "cpu", "restartPolicy": "NotRequired"},
            {"resourceName": "memory", "restartPolicy": "NotRequired"},
        ],
        "securityContext": _security_context(),
    }


def node_pod(
    cfg: KubernetesConfig,
    names: JobNames,
    node_id: str,
    role: Role,
    job_dir: PurePosixPath,
    size: tuple[float, int],
    master_uid: str,
    incarnation: int,
) -> dict[str, Any]:
    """A PS, worker, evaluator or data worker pod: no service account token, the job token as
    a file, the given size (resizable in place). A PS or data worker also listens on its port
    under a stable DNS name (``SERVING_ROLES``)."""
    cpu, memory_mb = size
    name = names.node_pod(node_id)
    env = _node_env(cfg, names, node_id, job_dir, cpu)
    extra_mounts: list[dict[str, Any]] = []
    extra_volumes: list[dict[str, Any]] = []
    container = _node_container(cfg, role, size)
    serves = role in SERVING_ROLES
    if serves:
        env.update(_serving_env(cfg, names, node_id, role))
        container["ports"] = _ports(cfg, role)
    if role == "ps":
        # Flash checkpoints live in memory; the slot counts against the pod's memory limit.
        extra_volumes.append(
            {"name": "flash", "emptyDir": {"medium": "Memory", "sizeLimit": f"{memory_mb}Mi"}}
        )
        extra_mounts.append({"name": "flash", "mountPath": FLASH_DIR})
    env.update(_tls_env(serves=serves))
    container["env"] = _env(cfg, env)
    container["volumeMounts"] = _mounts(cfg, *extra_mounts)
    spec = _pod_spec(cfg, names, container, extra_volumes, service_account=None, serves=serves)
    spec["terminationGracePeriodSeconds"] = 10
    subdomain = names.node_subdomain(role)
    if subdomain is not None:
        spec["hostname"] = name
        spec["subdomain"] = subdomain
    meta = metadata(
        cfg, names, name, role, **{LABEL_NODE: node_id, LABEL_INCARNATION: str(incarnation)}
    )
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    return owned(pod, names.master_pod, master_uid)


def resize_patch(role: Role, size: tuple[float, int]) -> dict[str, Any]:
    """Strategic-merge patch of the ``resize`` subresource: the container's new size."""
    cpu, memory_mb = size
    return {"spec": {"containers": [{"name": role, "resources": resources(cpu, memory_mb)}]}}
