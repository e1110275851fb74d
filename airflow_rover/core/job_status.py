"""One answer to "how is this job doing?", whoever asks (hook, trigger, CLI).

The master's own answer wins; when it cannot answer, its last mirrored ``state.json`` and
whether its process still lives decide.
"""

from __future__ import annotations

from typing import Any

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.states import TERMINAL_STATES, JobState

ABSENT = "absent"  # no job in this directory (yet): a sensor keeps waiting
UNREACHABLE = "unreachable"  # the master runs but did not answer: transient, poll again


def resolve_status(
    job_dir: JobDir, api_status: dict[str, Any] | None, master_alive: bool
) -> dict[str, Any]:
    """The job's status: the master's answer, else its last mirrored state, else a verdict."""
    if api_status is not None:
        return api_status
    mirrored = job_dir.read_json(job_dir.state_file)
    if mirrored and mirrored.get("state") in TERMINAL_STATES:
        return mirrored
    if master_alive:
        return {**(mirrored or {}), "state": UNREACHABLE, "message": "master did not answer"}
    if mirrored is None and not job_dir.master_info():
        return {"state": ABSENT, "message": f"no job in {job_dir.root}"}
    return {
        **(mirrored or {}),
        "state": str(JobState.FAILED),
        "message": f"master process died before the job finished; see {job_dir.log_file('master')}",
    }


def progress_line(status: dict[str, Any]) -> str:
    """The job's state, samples done (and how many the checkpoint it resumed from held),
    shards and the master's samples/s (which counts only samples this job's processes
    trained)."""
    progress = status.get("progress") or {}
    resumed = progress.get("samples_resumed") or 0
    shards = progress.get("shards") or {}
    line = f"{status.get('state')}, {progress.get('samples_done', 0)}"
    line += f"/{progress.get('samples_total', '?')} samples"
    if resumed:  # applied batches, partly in shards not done yet: may exceed samples done
        line += f" (resumed from a checkpoint holding {resumed})"
    if shards:
        line += f", shards {shards.get('done', 0)}/{sum(shards.values())} done"
    return line + f", {status.get('throughput', 0)} samples/s"


def without_history(job: dict[str, Any]) -> dict[str, Any]:
    """The status without its lists over time: ``throughput_history`` and
    ``recovery.checkpoint_history`` (they stay in the job's ``state.json``)."""
    slim = {k: v for k, v in job.items() if k != "throughput_history"}
    recovery = job.get("recovery")
    if isinstance(recovery, dict) and "checkpoint_history" in recovery:
        slim["recovery"] = {k: v for k, v in recovery.items() if k != "checkpoint_history"}
    return slim
