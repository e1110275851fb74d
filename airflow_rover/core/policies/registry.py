"""The checkpoint policies a job can name (``checkpoint_policy=``): one line each.

A new policy is a module with a ``CheckpointPolicy`` subclass (its ``Options``, ``plan`` and
the hooks it needs) and its class in ``POLICIES`` (``docs/architecture.md``).
"""

from __future__ import annotations

from airflow_rover.core.policies.base import CheckpointPolicy
from airflow_rover.core.policies.cpr import PartialRecovery
from airflow_rover.core.policies.ecrm import ErasureCoding
from airflow_rover.core.policies.full import FullRecovery

POLICIES: dict[str, type[CheckpointPolicy]] = {
    FullRecovery.name: FullRecovery,
    PartialRecovery.name: PartialRecovery,
    ErasureCoding.name: ErasureCoding,
}
DEFAULT_POLICY = FullRecovery.name
"""What a job runs without ``checkpoint_policy``, and what a policy falls back to."""
