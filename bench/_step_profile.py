"""Print where a rover worker's step and a PS request spend their time (``core.step_profile``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The worker's step, in the order it runs (on the training thread), then what the sender
# thread does meanwhile (overlapping the TF step), then the rare phases.
WORKER_PHASES = (
    ("worker/input", "input: wait for the next batch"),
    ("worker/ids", "ids of the next batch, start PushPull"),
    ("worker/tf_step", "TF forward/backward (+ to numpy)"),
    ("worker/tf_step_cpu", "  of which this thread's CPU"),
    ("worker/wait_push_pull", "wait for the PushPull reply"),
    ("worker/dense_mirror", "dense mirror: apply own grads"),
    ("worker/replay", "replay own update on rows read ahead"),
)
SENDER_PHASES = (
    ("rpc/PushPull/encode", "split + encode + send"),
    ("rpc/PushPull/encode_cpu", "  of which this thread's CPU"),
    ("rpc/PushPull/wait", "wait: gRPC + PS"),
    ("rpc/PushPull/decode", "decode reply"),
    ("rpc/PushPull/merge", "merge replies"),
)
RARE_PHASES = (("worker/first_pull", "first pull"), ("worker/flush", "last push (flush)"))
PS_PHASES = (
    ("ps/PushPull/decode", "decode request"),
    ("ps/push/check", "push: validate"),
    ("ps/push/apply", "push: table + dense apply (lock)"),
    ("ps/pull", "pull: table lookup + dense read"),
    ("ps/PushPull/handle", "handler in all"),
    ("ps/PushPull/encode", "encode reply"),
)


def read_profiles(job_dir: Path) -> list[dict[str, Any]]:
    """The profiles the job's workers wrote (``worker.profile_report``), by node id."""
    return [json.loads(p.read_text()) for p in sorted((job_dir / "logs").glob("*.profile.json"))]


def _rows(
    phases: tuple[tuple[str, str], ...], ns: dict[str, int], calls: dict[str, int], per: int
) -> list[str]:
    out = []
    for key, label in phases:
        if key in ns:
            ms = ns[key] / 1e6 / max(per, 1)
            out.append(f"    {label:<40} {ms:7.2f} ms/step  ({calls.get(key, 0)} calls)")
    return out


def format_profile(report: dict[str, Any], title: str) -> str:
    """One worker's step profile and its PS's, in ms per step."""
    worker = report["worker"]
    ns, calls, ends = worker["ns"], worker["calls"], worker["step_ends"]
    steps = len(ends)
    traces = worker.get("tf_traces")
    lines = [f"step profile, {title}: {steps} steps, step function traced {traces} time(s)"]
    cpu = worker.get("step_cpu", [])
    if steps > 1:
        wall = (ends[-1] - ends[0]) / 1e6 / (steps - 1)
        used = ""
        if len(cpu) == steps:
            per_step = (cpu[-1] - cpu[0]) / 1e6 / (steps - 1)
            used = f"; the worker process used {per_step:.2f} ms CPU/step, all its threads"
        lines.append(f"  worker step, wall {wall:.2f} ms/step{used} (training thread):")
    lines += _rows(WORKER_PHASES, ns, calls, steps)
    lines.append("  worker sender thread (runs during the TF step):")
    lines += _rows(SENDER_PHASES, ns, calls, steps)
    lines.append("  once per run:")
    lines += [r.replace("ms/step", "ms     ") for r in _rows(RARE_PHASES, ns, calls, 1)]
    for i, ps in enumerate(report.get("ps", [])):
        pushes = ps["calls"].get("ps/PushPull/handle", 0)
        lines.append(f"  PS {i}, per PushPull request ({pushes} requests, all workers):")
        lines += _rows(PS_PHASES, ps["ns"], ps["calls"], pushes)
    return "\n".join(lines)
