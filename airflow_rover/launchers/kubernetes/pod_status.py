"""What a node pod's status says about its process (pure, no network)."""

from __future__ import annotations

from typing import Any

# A pod stuck in one of these never starts by itself: report it as a failed start, so the
# master's restart budget and failure message take over instead of waiting forever.
FATAL_WAITING = frozenset(
    {
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
EXIT_FAILED_START = 1
EXIT_KILLED = 137  # a pod failed by the node without a container exit (eviction)


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses[0] if statuses else {}


def exit_code(pod: dict[str, Any]) -> int | None:
    """The node process's exit code, or None while it runs (or may still start)."""
    status = pod.get("status") or {}
    state = _container(pod).get("state") or {}
    terminated = state.get("terminated")
    if terminated is not None:
        return int(terminated.get("exitCode", EXIT_KILLED))
    phase = status.get("phase")
    if phase == "Succeeded":
        return 0
    if phase == "Failed":
        return EXIT_KILLED
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in FATAL_WAITING:
        return EXIT_FAILED_START
    return None


def unscheduled(pod: dict[str, Any]) -> bool:
    """Pending and not placed on a node yet (the scheduler found no room); a pod pulling
    its image is scheduled and not counted."""
    status = pod.get("status") or {}
    if status.get("phase") != "Pending":
        return False
    conditions = status.get("conditions") or []
    return not any(
        c.get("type") == "PodScheduled" and c.get("status") == "True" for c in conditions
    )


def exit_reason(pod: dict[str, Any] | None) -> str | None:
    """The container's terminated reason (``OOMKilled``: over its memory limit), or the pod's
    (``Evicted``); None while it runs or when the status gives none."""
    if pod is None:
        return None
    terminated = (_container(pod).get("state") or {}).get("terminated") or {}
    reason = terminated.get("reason") or (pod.get("status") or {}).get("reason")
    return str(reason) if reason else None


def failure_note(pod: dict[str, Any] | None, code: int) -> str:
    """One line saying why a node pod ended, for the node's log in the job directory."""
    if pod is None:
        return f"pod gone (exit code {code}): deleted or evicted, not by the master"
    status = pod.get("status") or {}
    state = _container(pod).get("state") or {}
    detail = state.get("terminated") or state.get("waiting") or {}
    parts = [f"pod {pod['metadata']['name']}", f"phase {status.get('phase', '?')}"]
    reason = detail.get("reason") or status.get("reason")
    if reason:
        parts.append(f"reason {reason}")
    parts.append(f"exit code {code}")
    message = detail.get("message") or status.get("message")
    return ", ".join(parts) + (f": {message}" if message else "")
