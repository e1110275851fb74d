"""The least privilege each side needs, as RBAC objects (the source of ``deploy/*.yaml``).

- The job master creates, lists and deletes its node pods, reads their logs when they die
  and resizes them in place: pods only, in its own namespace.
- Airflow (the task's worker and the triggerer) creates and deletes each job's master pod, its
  Services, its Secret (token, TLS) and its NetworkPolicy, and reads the master pod and its
  log.
- PS and worker pods get no service account token at all.
"""

from __future__ import annotations

from typing import Any

MASTER_ROLE = "airflow-rover-master"
AIRFLOW_ROLE = "airflow-rover-launcher"

MASTER_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "create", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["patch"]},
]
AIRFLOW_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "create", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["services", "secrets"], "verbs": ["get", "create", "delete"]},
    {
        "apiGroups": ["networking.k8s.io"],
        "resources": ["networkpolicies"],
        "verbs": ["get", "create", "delete"],
    },
]


def _role(name: str, namespace: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": rules,
    }


def _binding(name: str, namespace: str, subjects: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": subjects,
    }


def master_rbac(namespace: str, service_account: str = MASTER_ROLE) -> list[dict[str, Any]]:
    """The job masters' ServiceAccount (``KubernetesConfig.master_service_account``), Role and
    RoleBinding in the jobs' namespace."""
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": service_account, "namespace": namespace},
        "automountServiceAccountToken": False,  # only the master pod mounts it (pod setting)
    }
    subject = {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
    return [
        account,
        _role(MASTER_ROLE, namespace, MASTER_RULES),
        _binding(MASTER_ROLE, namespace, [subject]),
    ]


def airflow_rbac(namespace: str, accounts: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """A Role in the jobs' namespace bound to Airflow's accounts, given as (namespace, name):
    the triggerer's and the one the training tasks run as."""
    subjects = [{"kind": "ServiceAccount", "name": n, "namespace": ns} for ns, n in accounts]
    return [
        _role(AIRFLOW_ROLE, namespace, AIRFLOW_RULES),
        _binding(AIRFLOW_ROLE, namespace, subjects),
    ]
