"""The one source of truth for job and node states, used by the master, hooks and triggers."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    PENDING = "pending"  # master up, nodes starting
    RUNNING = "running"
    RECOVERING = "recovering"  # a parameter server is being relaunched from its checkpoint
    EVALUATING = "evaluating"  # all shards done, scoring the held-out split
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # on request (task marked failed, cleared, killed) or at its deadline


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED})
FAILED_STATES = frozenset({JobState.FAILED, JobState.STOPPED})
ACTIVE_STATES = frozenset(
    {JobState.PENDING, JobState.RUNNING, JobState.RECOVERING, JobState.EVALUATING}
)


class NodeState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
