"""One answer to "how is this job doing?", whoever asks (hook, trigger, CLI).

The master's own answer wins; when it cannot answer, its last mirrored ``state.json`` and
whether its process still lives decide.
"""

from __future__ import annotations

import time
from typing import Any

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.states import TERMINAL_STATES, JobState

#: The data workers' last decisions an event or a short ``rover status`` carries (the
#: master keeps up to 200: tens of KB).
EVENT_DECISIONS = 10
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
    ``recovery.checkpoint_history``, and with only the last ``EVENT_DECISIONS`` of
    ``data_workers.decisions`` (all stay in the job's ``state.json``)."""
    slim = {k: v for k, v in job.items() if k != "throughput_history"}
    recovery = job.get("recovery")
    if isinstance(recovery, dict) and "checkpoint_history" in recovery:
        slim["recovery"] = {k: v for k, v in recovery.items() if k != "checkpoint_history"}
    section = job.get("data_workers")
    decisions = section.get("decisions") if isinstance(section, dict) else None
    if isinstance(section, dict) and isinstance(decisions, list):
        slim["data_workers"] = {**section, "decisions": decisions[-EVENT_DECISIONS:]}
    return slim


def with_decisions_from(job: dict[str, Any], mirrored: dict[str, Any] | None) -> dict[str, Any]:
    """``job`` (an event's, ``without_history``) with the data workers' decisions of
    ``mirrored``, the same job's ``state.json``, where that holds more of them."""
    if not mirrored or mirrored.get("job_id") != job.get("job_id"):
        return job
    section, full = job.get("data_workers"), mirrored.get("data_workers")
    if not isinstance(section, dict) or not isinstance(full, dict):
        return job
    kept, all_of_them = section.get("decisions"), full.get("decisions")
    kept = kept if isinstance(kept, list) else []
    if not isinstance(all_of_them, list) or len(all_of_them) <= len(kept):
        return job
    return {**job, "data_workers": {**section, "decisions": all_of_them}}


def data_workers_lines(status: dict[str, Any], last: int | None = 5) -> list[str]:
    """``rover status``'s block on the data workers: mode, bounds, target / running, the last
    window's input wait, queue fill and samples/s, then the ``last`` decisions (None: all);
    no lines where the job has none (or they are off)."""
    section = status.get("data_workers")
    if not isinstance(section, dict) or section.get("mode") in (None, "off"):
        return []
    bounds = f" {section['min']}-{section['max']}" if "min" in section and "max" in section else ""
    head = f"data workers: {section.get('mode')}{bounds}, target {section.get('target', '?')}"
    head += f", running {section.get('running', '?')}"
    figures = [
        f"{label} {section[key] * scale:,.{digits}f}{unit}"
        for key, label, scale, digits, unit in (
            ("input_wait", "input wait", 100, 1, "%"),
            ("ready_fill", "ready queue", 100, 0, "% full"),
            ("samples_per_s", "trainers", 1, 1, " samples/s"),
        )
        if isinstance(section.get(key), int | float)
    ]
    lines = [head + ("; " + ", ".join(figures) if figures else "")]
    decisions = [d for d in section.get("decisions") or () if isinstance(d, dict)]
    shown = decisions if last is None else decisions[-last:] if last > 0 else []
    if len(shown) < len(decisions):
        lines.append(f"  ({len(decisions) - len(shown)} earlier decisions: --full shows them)")
    lines += [_decision_line(d) for d in shown]
    return lines


def _decision_line(decision: dict[str, Any]) -> str:
    at = decision.get("at")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at)) if isinstance(at, int | float) else "?"
    )
    change = f"{decision.get('previous', '?')} -> {decision.get('count', '?')}"
    return f"  {when}  {change}  {decision.get('rule') or ''}: {decision.get('reason') or ''}"
