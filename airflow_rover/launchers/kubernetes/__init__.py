"""The Kubernetes backend: the job master as a pod behind a Service, PS pods behind a headless
Service, worker pods; the master creates and deletes its node pods (``nodes``), Airflow creates
and removes the master's objects (``job``); every manifest comes from ``manifests``.

See ``docs/kubernetes.md``.
"""

from airflow_rover.launchers.kubernetes.config import KubernetesConfig, KubernetesJob

__all__ = ["KubernetesConfig", "KubernetesJob"]
