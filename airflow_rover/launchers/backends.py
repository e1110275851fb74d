"""The backends a job can run on, and the one factory that picks a job's: the hook, the CLI and
the master's process entry all ask ``backend_for``; the operator names one with
``launcher=`` (``backend_named``).

A new backend is a module with a ``JobBackend`` subclass and a line in ``BACKENDS``.
"""

from __future__ import annotations

from typing import Any

from airflow_rover.core.job_dir import JobDir
from airflow_rover.launchers.base import JobBackend
from airflow_rover.launchers.kubernetes.backend import KubernetesBackend
from airflow_rover.launchers.local import LocalBackend

BACKENDS: dict[str, type[JobBackend]] = {
    "local": LocalBackend,
    "kubernetes": KubernetesBackend,  # a job directory with kubernetes.json
}
"""Each backend by the name the operator's ``launcher=`` takes."""
DEFAULT_BACKEND = "local"  # runs every job directory no other backend claims


def backend_named(name: str, settings: Any = None) -> JobBackend:
    """The backend ``name`` with its settings (None where it takes none)."""
    try:
        backend = BACKENDS[name]
    except KeyError:
        raise ValueError(f"launcher={name!r}; accepted: {list(BACKENDS)}") from None
    return backend.with_settings(settings)


def backend_for(job_dir: JobDir) -> JobBackend:
    """The backend that runs (or is to run) the job in ``job_dir``."""
    for name, backend in BACKENDS.items():
        found = backend.of_job(job_dir) if name != DEFAULT_BACKEND else None
        if found is not None:
            return found
    return BACKENDS[DEFAULT_BACKEND].with_settings(None)
