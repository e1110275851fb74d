"""What a Kubernetes job needs besides its ``JobSpec``: where and how its pods run.

The operator validates a ``KubernetesConfig`` at parse time and writes it, with the connection
id, to ``kubernetes.json`` in the job directory. That file is what makes a job directory a
Kubernetes job: the hook, the trigger, the sensor and the master (inside its pod) all read it,
so none of them carries the settings separately. No credential is ever in it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from airflow_rover.core.job_dir import JobDir, atomic_write_text

KUBERNETES_FILE = "kubernetes.json"

# The master process reads these (set in its pod's environment).
ENV_MASTER_HOST = "ROVER_MASTER_HOST"
ENV_MASTER_PORT = "ROVER_MASTER_PORT"
ENV_MASTER_ADVERTISE = "ROVER_MASTER_ADVERTISE"
ENV_POD_NAME = "ROVER_POD_NAME"
ENV_POD_UID = "ROVER_POD_UID"
ENV_NAMESPACE = "ROVER_NAMESPACE"
DEFAULT_DATA_PORT = 7060
"""The container port data worker pods serve batches on (``KubernetesConfig.data_port``)."""
# A PS pod is reached at a stable DNS name, not on loopback: where it binds and what it announces.
RESERVED_ENV_PREFIX = "ROVER_"

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
# Volume names the launcher uses itself.
OWN_VOLUMES = frozenset({"job", "token", "flash"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Toleration(_Strict):
    """A pod toleration (the Kubernetes fields, camelCase as in a manifest)."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds")

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator 'Exists' takes no value")
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration without a key needs operator 'Exists'")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds applies only with effect 'NoExecute'")
        return self

    def manifest(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class KubernetesConfig(_Strict):
    """Where a job's pods run and what they mount; every pod of the job gets the same."""

    namespace: str = Field(default="default", max_length=63, pattern=_DNS_LABEL)
    image: str = Field(min_length=1, description="the runtime image (docker/Dockerfile)")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    job_volume_claim: str = Field(
        min_length=1,
        max_length=253,
        description="a ReadWriteMany PersistentVolumeClaim holding the job directories; the "
        "Airflow workers and triggerer mount the same volume at job_volume_mount_path",
    )
    job_volume_mount_path: str = "/rover"
    master_service_account: str = Field(
        default="airflow-rover-master",
        min_length=1,
        max_length=253,
        description="the account whose Role lets the master create and delete its node pods",
    )
    master_cpu: float = Field(default=1.0, gt=0, le=64)
    master_memory_mb: int = Field(default=1024, ge=256)
    master_port: int = Field(default=8080, ge=1024, le=65535)
    airflow_namespace: str | None = Field(
        default=None,
        max_length=63,
        pattern=_DNS_LABEL,
        description="where the Airflow workers and triggerer run (default: the job's "
        "namespace); the job's NetworkPolicy admits their pods labelled "
        "airflow-rover/client=true",
    )
    ps_port: int = Field(default=50051, ge=1024, le=65535)
    data_port: int = Field(
        default=DEFAULT_DATA_PORT,
        ge=1024,
        le=65535,
        description="where data workers serve batches; the NetworkPolicy admits the job's "
        "worker pods to it",
    )
    node_selector: dict[str, str] = {}
    tolerations: tuple[Toleration, ...] = ()
    labels: dict[str, str] = {}
    env: dict[str, str] = Field(
        default={}, description="extra environment of every pod (plain values: no secrets)"
    )
    volumes: tuple[dict[str, Any], ...] = Field(
        default=(), description="extra pod volumes (Kubernetes Volume objects)"
    )
    volume_mounts: tuple[dict[str, Any], ...] = Field(
        default=(), description="where the extra volumes mount in every container"
    )
    run_as_user: int = Field(default=50000, ge=1, description="non-root; Airflow's image uid")
    run_as_group: int = Field(default=0, ge=0)
    resize_in_place: bool = Field(
        default=True,
        description="resize node pods in place (Kubernetes >= 1.33); else replace them",
    )

    @field_validator("image_pull_secrets")
    @classmethod
    def _secret_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", name) or len(name) > 253:
                raise ValueError(f"{name!r} is not a Secret name")
        return names

    @field_validator("job_volume_mount_path")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not PurePosixPath(path).is_absolute() or path == "/":
            raise ValueError(f"{path!r}: expected an absolute path below /")
        return str(PurePosixPath(path))

    @field_validator("node_selector", "labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
                raise ValueError(f"{key}={value!r} is not a valid Kubernetes label")
        return labels

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name.startswith(RESERVED_ENV_PREFIX):
                raise ValueError(f"{name!r}: names starting with ROVER_ are the launcher's")
        return env

    @model_validator(mode="after")
    def _volumes(self) -> KubernetesConfig:
        names = [v.get("name") for v in self.volumes]
        for volume in self.volumes:
            name = volume.get("name")
            if not isinstance(name, str) or not re.match(_DNS_LABEL, name):
                raise ValueError(f"volumes: {volume!r} needs a 'name' (a DNS label)")
            if name in OWN_VOLUMES:
                raise ValueError(f"volumes: the name {name!r} is the launcher's own")
            if len(volume) < 2:
                raise ValueError(f"volumes: {name!r} needs a source (e.g. persistentVolumeClaim)")
        if len(set(names)) != len(names):
            raise ValueError(f"volumes: duplicate names in {names}")
        for mount in self.volume_mounts:
            if mount.get("name") not in names:
                raise ValueError(f"volume_mounts: {mount!r} names no volume in {names}")
            path = mount.get("mountPath")
            if not isinstance(path, str) or not PurePosixPath(path).is_absolute():
                raise ValueError(f"volume_mounts: {mount!r} needs an absolute 'mountPath'")
        return self

    def mount_paths(self) -> list[PurePosixPath]:
        """Every path a job's pods see: the job volume's and the extra mounts'."""
        return [PurePosixPath(self.job_volume_mount_path)] + [
            PurePosixPath(m["mountPath"]) for m in self.volume_mounts
        ]

    def visible(self, path: str | Path) -> bool:
        """Whether the pods see ``path`` (it lies under a mounted volume)."""
        target = PurePosixPath(str(path))
        return any(target == root or root in target.parents for root in self.mount_paths())


class KubernetesJob(_Strict):
    """What ``kubernetes.json`` holds: the pods' settings and the Airflow connection id used
    to reach the cluster (an id, not a credential)."""

    config: KubernetesConfig
    kubernetes_conn_id: str | None = None

    @staticmethod
    def path(job_dir: JobDir) -> Path:
        return job_dir.root / KUBERNETES_FILE

    @classmethod
    def read(cls, job_dir: JobDir) -> KubernetesJob | None:
        """The job's Kubernetes settings; None for a job that does not run on Kubernetes."""
        try:
            text = cls.path(job_dir).read_text()
        except FileNotFoundError:
            return None
        return cls.model_validate_json(text)

    def write(self, job_dir: JobDir) -> None:
        atomic_write_text(self.path(job_dir), self.model_dump_json(indent=2, by_alias=True))


# -- the operator's parameter ----------------------------------------------------------------
REQUIRED_FIELDS = ("image", "job_volume_claim")
_PLACEHOLDER = {"image": "rendered-later", "job_volume_claim": "rendered-later"}


def _has_template(value: Any) -> bool:
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, dict):
        return any(_has_template(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_template(v) for v in value)
    return False


def check_static_config(owner: str, value: Any) -> None:
    """Validate the literal entries of the ``kubernetes`` parameter at parse time (a templated
    required entry stands in for itself); errors name ``kubernetes.<field>``."""
    if isinstance(value, KubernetesConfig) or (isinstance(value, str) and _has_template(value)):
        return
    if not isinstance(value, dict):
        raise ValueError(
            f"{owner}: kubernetes must be a dict or KubernetesConfig, got {type(value).__name__}"
        )
    missing = [f for f in REQUIRED_FIELDS if f not in value]
    if missing:
        raise ValueError(
            f"{owner}: kubernetes needs {missing} with launcher='kubernetes' "
            "(the runtime image and the PersistentVolumeClaim holding the job directories)"
        )
    literal = {k: v for k, v in value.items() if not _has_template(v)}
    parse_config(owner, {**{k: _PLACEHOLDER[k] for k in REQUIRED_FIELDS}, **literal})


def parse_config(owner: str, value: Any) -> KubernetesConfig:
    """``value`` as a ``KubernetesConfig``; a bad one raises ValueError naming the field."""
    from pydantic import ValidationError

    from airflow_rover.core.spec import describe_errors

    if isinstance(value, KubernetesConfig):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"{owner}: kubernetes must render to a dict, got {value!r}")
    try:
        return KubernetesConfig.model_validate(value)
    except ValidationError as exc:
        message = describe_errors(exc, KubernetesConfig)
        raise ValueError(f"{owner}: invalid kubernetes: {message}") from None


def check_visible(owner: str, config: KubernetesConfig, paths: Mapping[str, str | None]) -> None:
    """Every path the job's pods read or write must lie on a volume they mount."""
    for param, path in paths.items():
        if path and not config.visible(path):
            mounts = [str(p) for p in config.mount_paths()]
            raise ValueError(
                f"{owner}: {param}={path!r} is not under a volume the job's pods mount "
                f"({mounts}: kubernetes.job_volume_mount_path or kubernetes.volume_mounts)"
            )
