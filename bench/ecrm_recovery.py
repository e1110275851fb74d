"""Recovering a lost parameter server: ECRM's rebuild from parity next to a checkpoint reload.

    python bench/ecrm_recovery.py            # ~3 min on 2 cores (300k samples, 2 jobs)
    python bench/ecrm_recovery.py --quick    # ~2 min: a smoke run (60k samples)
    python bench/ecrm_recovery.py --checkpoint-interval 20 --work-dir /tmp/ecrm-bench
    python bench/ecrm_recovery.py --only ecrm --window 10   # one policy: to iterate on it

ECRM's recovery methodology (``papers/ecrm-erasure-coding.txt`` section 4.2, metrics: "time
to fully recover a failed server and training throughput during recovery") on the real
runtime: a master, 3 PS and 2 TensorFlow workers on this machine, launched like
``bench/elastic.py`` does (``ElasticJobHook``, no Airflow), Adagrad, shard_size 2048, a
checkpoint every ``--checkpoint-interval`` seconds (10), autoscale off. One job per policy,
each run the same way: train until steady, trace the workers' samples (the master's status,
polled every 50 ms) for a window (30 s), then SIGKILL ``ps-1`` half a checkpoint interval after
the next checkpoint commit (``--kill-phase``: full's loss depends on this, 0.5 is the paper's
average case; the age of the state restored is printed), trace on until the job has
recovered, stop.

- Both policies keep a spare PS process (``recovery.standby_ps``; ``--no-standby``: none),
  which takes over the lost PS.
- full (baseline: checkpoint reload): ps-1 is relaunched and restores its partition from the
  last checkpoint (or the newer snapshot in shared memory); every batch it lost since is trained
  again. Recovered = the relaunched PS is ready and the master's ``progress.samples_done`` (the
  shards done on every PS: it rolls back when the restored PS's ledger lacks their batches,
  ``ShardQueue.reconcile``) is back where it was at the kill. Shards in flight at the kill count
  as progress after it, which shortens full's time a little (in the baseline's favour).
- ecrm (k=2, ``--rows-per-lock`` rows per lock, default the product's): ps-1 is relaunched
  empty and rebuilt from the parity the other PS keep while the workers train on. Recovered =
  when the replacement finished its rebuild (its ``recovery.ecrm_rebuilds`` entry's
  ``finished_at``, the PS's own clock, read once the entry is ``done``: the master, which
  checks every 0.2 s, learns of it up to a tick later).

Per policy: time to fully recover from the kill; the workers' throughput from the kill until
then against an equally long window just before the kill of the same run (rates interpolate
each worker's progress reports, every 0.2 s here: at the product's 1 s a recovery of about a
second is smeared over its neighbours); for full the age of the state it restored and the
paper's best / average / worst-case estimates (relaunch time plus none / half / all of a
checkpoint interval's work redone at the measured rate); for ECRM the rebuild's rows, held
updates and degraded (decoded) reads. Both narrow definitions are printed too: full's reload
(the master's ``recovery_seconds["ps"]``: PS death detected to restored PS ready) and ECRM's
rebuild (``ecrm_rebuilds[].seconds``). Last, where the cores went (``CpuMeter``): the machine's
and the job's workers, PS and master, during recovery against as long just before the kill.
Every process of both jobs shares this machine's cores, so the rebuild's work is taken from the
workers whenever the machine was busy before (the paper's replacement has a server of its own).

Goals (ECRM issue): ECRM recovers >= 5x faster than the checkpoint reload (full's time to fully
recover / ECRM's), and keeps >= 85% of the normal throughput during recovery. Printed as MET /
NOT MET; the exit code is 0 when both are met.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.policies import EcrmOptions
from airflow_rover.core.spec import JobSpec
from airflow_rover.data.synthetic import GeneratedDataset, SyntheticConfig, generate_dataset
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.launchers.local import ENV_NODE_ID
from airflow_rover.launchers.local_processes import job_processes, node_processes

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.elastic import wait_for, worker_samples

GOAL_SPEEDUP = 5.0  # full's time to fully recover / ECRM's
GOAL_THROUGHPUT = 0.85  # ECRM's throughput during recovery / before the kill
# Workers report their samples this often (training.progress_report_s; the product's default
# is 1 s, too coarse for a recovery that lasts about a second). The status is polled 4x as often.
HEARTBEAT_S = 0.2
POLL_S = 0.05
TAIL_S = 3.0  # trace on this long after recovery, so that rates at its end interpolate
KILLED = "ps-1"
ECRM_K = 2
POLICIES = ("full", "ecrm")


@dataclass(frozen=True)
class Settings:
    samples: int
    epochs: int
    steady: int  # samples trained before the trace starts
    window_s: float  # traced before the kill
    checkpoint_interval_s: float
    kill_phase: float  # kill this share of an interval after a commit (< 0: after the window)
    rows_per_lock: int  # ECRM's lock granularity
    standby: bool  # recovery.standby_ps: a spare PS process takes over (both policies)
    timeout_s: float  # for recovery


@dataclass(frozen=True)
class Point:
    """One poll of the master's status, what this bench needs of it."""

    t: float  # time.time()
    state: str
    workers: dict[str, int]  # samples per worker
    samples_done: int
    checkpoints: int
    ps_recoveries: list[float]  # recovery_seconds["ps"]
    rebuilds: list[dict[str, Any]]  # recovery.ecrm_rebuilds
    cpu: dict[str, float]  # core-seconds used so far (``CpuMeter``)


@dataclass
class Outcome:
    policy: str
    trace: list[Point] = field(default_factory=list)
    kill_t: float = 0.0
    trace_start: float = 0.0
    done_at_kill: int = 0
    ready_t: float | None = None  # the relaunched PS ready (seen in the status)
    recovered_t: float | None = None
    reload_s: float | None = None  # recovery_seconds["ps"]: detected -> ready
    floor: int | None = None  # samples_done after the restore rolled it back (full)
    rebuild: dict[str, Any] | None = None  # ecrm_rebuilds entry of ps-1 (ecrm)
    committed_age_s: float | None = None  # last committed checkpoint's age at the kill
    restored_from: str | None = None  # the relaunched PS's own words (full)
    restored_age_s: float | None = None  # that snapshot's age at the kill (full)
    final_state: str = ""
    error: str | None = None  # why the run ended before recovering
    cpu: CpuMeter | None = None

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered_t is None else self.recovered_t - self.kill_t


# -- the job ---------------------------------------------------------------------------------


def spec_for(data: GeneratedDataset, policy: str, settings: Settings) -> JobSpec:
    checkpoint: dict[str, Any] = {"policy": policy}
    if policy == "ecrm":
        checkpoint["ecrm"] = {"k": ECRM_K, "rows_per_lock": settings.rows_per_lock}
    return JobSpec.model_validate(
        {
            "job_id": f"recovery-{policy}",
            "train_data": str(data.train_dir),
            "plan": {"num_ps": 3, "num_workers": 2},
            "training": {
                "shard_size": 2048,
                "epochs": settings.epochs,
                "optimizer": "adagrad",
                "progress_report_s": HEARTBEAT_S,
            },
            "autoscale": {"enabled": False},
            "recovery": {
                "checkpoint_interval_s": settings.checkpoint_interval_s,
                "standby_ps": settings.standby,
            },
            "checkpoint": checkpoint,
        }
    )


class CpuMeter:
    """Core-seconds used so far by this machine and by the job's processes, per role: the
    master, its PS (the spare and the replacement among them) and its workers. On 2 cores
    the workers compete with the rebuild for CPU: this says how much each side had. A
    process keeps what it used once it dies; one is counted from when it is first seen
    (looked for every ``every`` samples)."""

    ROLES = ("workers", "ps", "master")

    def __init__(self, layout: JobDir, every: int = 10) -> None:
        self.layout, self.every = layout, every
        self._procs: dict[int, tuple[str, psutil.Process]] = {}
        self._last: dict[int, float] = {}
        self._used = dict.fromkeys(self.ROLES, 0.0)
        self._samples = 0

    def _discover(self) -> None:
        pid = self.layout.master_info().get("pid")
        if pid is None:
            return
        with contextlib.suppress(psutil.Error):
            master = psutil.Process(pid)
            self._procs.setdefault(pid, ("master", master))
            for child in master.children():
                with contextlib.suppress(psutil.Error):
                    node = child.environ().get(ENV_NODE_ID, "")
                    role = "workers" if node.startswith("worker") else "ps"
                    self._procs.setdefault(child.pid, (role, child))

    def sample(self) -> dict[str, float]:
        if self._samples % self.every == 0:
            self._discover()
        self._samples += 1
        for pid, (role, proc) in list(self._procs.items()):
            try:
                times = proc.cpu_times()
            except psutil.Error:
                del self._procs[pid]
                continue
            now = times.user + times.system
            self._used[role] += now - self._last.get(pid, now)
            self._last[pid] = now
        machine = psutil.cpu_times()
        busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
        return {"machine": busy, **self._used}


def poll(hook: ElasticJobHook, meter: CpuMeter | None = None) -> Point:
    status = hook.get_status()
    recovery = status.get("recovery") or {}
    return Point(
        t=time.time(),
        state=str(status.get("state")),
        workers={
            n["id"]: int(n["samples"]) for n in status.get("nodes", []) if n["role"] == "worker"
        },
        samples_done=int((status.get("progress") or {}).get("samples_done", 0)),
        checkpoints=int(recovery.get("checkpoints", 0)),
        ps_recoveries=list((recovery.get("recovery_seconds") or {}).get("ps", [])),
        rebuilds=list(recovery.get("ecrm_rebuilds") or []),
        cpu=meter.sample() if meter is not None else {},
    )


def trace_until(
    hook: ElasticJobHook, out: Outcome, until: Callable[[Point], bool], timeout_s: float
) -> Point:
    deadline = time.monotonic() + timeout_s
    while True:
        point = poll(hook, out.cpu)
        out.trace.append(point)
        if point.state in ("failed", "stopped", "succeeded"):
            raise RuntimeError(f"the {out.policy} job ended ({point.state}) before recovering")
        if until(point):
            return point
        if time.monotonic() > deadline:
            raise TimeoutError(f"{out.policy}: not recovered {timeout_s:.0f} s after the kill")
        time.sleep(POLL_S)


def run_policy(data: GeneratedDataset, root: Path, policy: str, settings: Settings) -> Outcome:
    hook = ElasticJobHook(root / policy)
    layout = hook.get_conn()
    out = Outcome(policy, cpu=CpuMeter(layout))
    hook.launch(spec_for(data, policy, settings))
    try:
        _kill_and_trace(hook, out, settings)
    except (TimeoutError, RuntimeError) as exc:
        out.error = str(exc)
    finally:
        hook.stop("bench done")
        out.final_state = str(hook.get_status().get("state"))
        time.sleep(1.0)
        for proc in job_processes(layout.root):  # ours: this job's processes only
            with contextlib.suppress(psutil.Error):
                print(f"note: {proc.pid} ({proc.name()}) outlived the stop; killing it")
                proc.kill()
    return out


def _kill_and_trace(hook: ElasticJobHook, out: Outcome, settings: Settings) -> None:
    """Train until steady, trace a window, SIGKILL ps-1, trace until recovered (``out``)."""
    layout, policy = hook.get_conn(), out.policy
    wait_for(
        "steady training",
        lambda: (
            (s := hook.get_status()).get("state") == "running"
            and worker_samples(s) >= settings.steady
        ),
    )
    out.trace_start = time.time()
    lead = settings.window_s + 1.5 * HEARTBEAT_S
    before = trace_until(hook, out, lambda p: p.t - out.trace_start >= lead, lead + 60)
    interval = settings.checkpoint_interval_s
    if settings.kill_phase >= 0 and interval > 0:  # kill this long after a checkpoint
        due = settings.kill_phase * interval

        def aligned(p: Point) -> bool:
            committed = committed_at(layout)
            return committed is not None and due <= p.t - committed < due + 0.5

        before = trace_until(hook, out, aligned, 2 * interval + 60)
    known_ps = len(before.ps_recoveries)
    victim = node_processes(layout).get(KILLED)
    if victim is None:
        raise RuntimeError(f"no {KILLED} process found under the master")
    out.done_at_kill = before.samples_done
    committed = committed_at(layout)
    out.kill_t = time.time()
    victim.send_signal(signal.SIGKILL)
    if committed is not None:
        out.committed_age_s = out.kill_t - committed

    def recovered(p: Point) -> bool:
        if out.ready_t is None and len(p.ps_recoveries) > known_ps:
            out.ready_t = p.t
            out.reload_s = _newest(before.ps_recoveries, p.ps_recoveries)
        if out.ready_t is None or p.state != "running":
            return False  # not relaunched yet, or its restore not reconciled yet
        if policy == "ecrm":
            mine = [r for r in p.rebuilds if r.get("node") == KILLED]
            if mine and mine[-1].get("done"):
                out.rebuild = mine[-1]
                return True
            return False
        out.floor = p.samples_done if out.floor is None else min(out.floor, p.samples_done)
        return p.samples_done >= out.done_at_kill

    last = trace_until(hook, out, recovered, settings.timeout_s)
    out.recovered_t = last.t
    finished = (out.rebuild or {}).get("finished_at")
    if isinstance(finished, float):  # ECRM: when the PS was rebuilt, not when the master saw it
        out.recovered_t = min(last.t, finished)
    tail_end = time.time() + TAIL_S
    trace_until(hook, out, lambda p: p.t >= tail_end, TAIL_S + 60)
    if policy == "full":
        out.restored_from, out.restored_age_s = restored_state(layout, out.kill_t)


def committed_at(layout: JobDir) -> float | None:
    """When the last checkpoint was committed (its ``queue.json`` written, then ``LATEST``)."""
    try:
        name = (layout.checkpoints / "LATEST").read_text().strip()
        return (layout.checkpoints / name / "queue.json").stat().st_mtime
    except OSError:
        return None


def _newest(before: list[float], after: list[float]) -> float | None:
    """The one value in ``after`` (a sorted list) that ``before`` lacks."""
    rest = list(after)
    for value in before:
        with contextlib.suppress(ValueError):
            rest.remove(value)
    return rest[0] if rest else None


_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_CKPT = re.compile(r"ckpt-\d+")


def _log_lines(path: Path) -> Iterator[tuple[float | None, str]]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        match = _LOG_TIME.match(line)
        when = None
        if match:
            stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
            when = stamp.timestamp()  # logged in local time, like time.time() here
        yield when, line


def restored_state(layout: JobDir, kill_t: float) -> tuple[str | None, float | None]:
    """What the relaunched PS says it restored, and how old that snapshot was at the kill
    (its "snapshot taken" line in the master's log)."""
    said = None
    for when, line in _log_lines(layout.log_file(KILLED)):
        if when is not None and when >= kill_t - 1 and f"{KILLED} restored" in line:
            said = line.split(f"{KILLED} ", 1)[1]
    if said is None:
        return None, None
    name = _CKPT.search(said)
    if name is None:
        return said, None
    taken = [
        when
        for when, line in _log_lines(layout.log_file("master"))
        if when is not None and f"checkpoint {name.group(0)}: snapshot taken" in line
    ]
    return said, (kill_t - taken[-1]) if taken else None


# -- rates -----------------------------------------------------------------------------------


class Samples:
    """The workers' total samples as a function of time, from the polled heartbeat counts.

    A worker's count changes once per progress report (every ``HEARTBEAT_S``); between two
    reports it is interpolated linearly. Reports that arrive without a change (the worker
    waited) are invisible in the status, so a gap longer than 1.5 reports is taken as flat
    until one report before the next change. A count that goes down (a restarted worker)
    continues from where it was."""

    def __init__(self, trace: list[Point]) -> None:
        self.curves: dict[str, tuple[list[float], list[float]]] = {}
        seen: dict[str, tuple[int, float]] = {}  # worker -> (last count, cumulative)
        for point in trace:
            for worker, count in point.workers.items():
                times, values = self.curves.setdefault(worker, ([], []))
                last, total = seen.get(worker, (count, 0.0))
                if values and count == last:
                    continue
                total += count - last if count >= last else count
                seen[worker] = (count, total)
                if times and point.t - times[-1] > 1.5 * HEARTBEAT_S:
                    times.append(point.t - HEARTBEAT_S)
                    values.append(values[-1])
                times.append(point.t)
                values.append(total)

    def at(self, t: float) -> float:
        total = 0.0
        for times, values in self.curves.values():
            i = bisect.bisect_right(times, t)
            if i == 0:
                total += values[0]
            elif i == len(times):
                total += values[-1]
            else:
                t0, t1, v0, v1 = times[i - 1], times[i], values[i - 1], values[i]
                total += v0 + (v1 - v0) * (t - t0) / (t1 - t0)
        return total

    def rate(self, start: float, end: float) -> float:
        return (self.at(end) - self.at(start)) / (end - start) if end > start else 0.0


@dataclass(frozen=True)
class Window:
    during: float  # samples/s in [start, end]
    before: float  # samples/s in an equally long window just before the kill
    seconds: float  # the length of both
    clipped: bool  # the traced time before the kill was shorter than [start, end]

    @property
    def ratio(self) -> float:
        return self.during / self.before if self.before > 0 else 0.0


def window(out: Outcome, start: float, end: float) -> Window:
    curve = Samples(out.trace)
    length = end - start
    earliest = out.trace_start + 1.5 * HEARTBEAT_S  # the first reports seed the interpolation
    before_start = max(out.kill_t - length, earliest)
    return Window(
        during=curve.rate(start, end),
        before=curve.rate(before_start, out.kill_t),
        seconds=length,
        clipped=before_start > out.kill_t - length,
    )


def worker_pauses(out: Outcome, end: float) -> dict[str, float]:
    """Each worker's longest time without progress from the kill until ``end`` (its counts
    change once per report while it trains: a longer gap is a pause)."""
    changes: dict[str, list[float]] = {}
    last: dict[str, int] = {}
    for point in out.trace:
        for worker, count in point.workers.items():
            if last.get(worker) != count:
                changes.setdefault(worker, []).append(point.t)
            last[worker] = count
    pauses = {}
    for worker, times in sorted(changes.items()):
        inside = [t for t in times if out.kill_t <= t <= end]
        before = [t for t in times if t < out.kill_t]
        edges = before[-1:] + inside + [end]
        pauses[worker] = max(b - a for a, b in itertools.pairwise(edges))
    return pauses


def describe_pauses(out: Outcome, end: float) -> str:
    pauses = worker_pauses(out, end)
    said = ", ".join(f"{w} {s:.1f} s" for w, s in pauses.items())
    return f"longest pause of each worker from its last progress before the kill: {said}"


# -- the report ------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def describe_window(label: str, w: Window, normal: float) -> str:
    note = " (the traced time before the kill was shorter: compared with all of it)"
    share = w.during / normal if normal > 0 else 0.0
    return (
        f"{label}: {w.during:8,.0f} samples/s over {w.seconds:5.2f} s = {w.ratio:4.2f} of the "
        f"{w.before:,.0f} samples/s in as long just before the kill{note if w.clipped else ''} "
        f"({share:4.2f} of normal)"
    )


def normal_rate(out: Outcome, settings: Settings) -> float:
    """The workers' samples/s over the traced window before the kill."""
    return Samples(out.trace).rate(out.kill_t - settings.window_s, out.kill_t)


def full_estimates(out: Outcome, settings: Settings) -> tuple[float, float, float] | None:
    """The paper's best / average / worst case of full recovery at this run's costs: the
    relaunch, plus none / half / all of a checkpoint interval's work (at the normal rate)
    trained again at the rate measured while re-training."""
    if out.ready_t is None or out.recovered_t is None:
        return None
    redo = Samples(out.trace).rate(out.ready_t, out.recovered_t)
    normal = normal_rate(out, settings)
    if redo <= 0 or normal <= 0:
        return None
    relaunch = out.ready_t - out.kill_t
    half = settings.checkpoint_interval_s / 2 * normal / redo
    return relaunch, relaunch + half, relaunch + 2 * half


def report_full(out: Outcome, settings: Settings) -> Window | None:
    every = settings.checkpoint_interval_s
    print(f"== full: ps-1 restored from the last checkpoint (one every {every:g} s)")
    normal = report_opening(out, settings)
    if normal is None:
        return None
    age = "none" if out.committed_age_s is None else f"{out.committed_age_s:.2f} s old"
    print(f"at the kill: {out.done_at_kill:,} samples done; last committed checkpoint {age}")
    if out.restored_from is not None:
        old = "" if out.restored_age_s is None else f" (snapshot {out.restored_age_s:.2f} s old)"
        print(f"ps-1's log: {out.restored_from}{old}")
    report_relaunch(out, "relaunched and restored", "pure reload, ")
    if out.floor is not None:
        print(
            f"progress rolled back to {out.floor:,} samples done: "
            f"{out.done_at_kill - out.floor:,} samples to train again"
        )
    if out.recovery_s is None or out.ready_t is None or out.recovered_t is None:
        print(f"not recovered: {out.error or '?'} (job {out.final_state})\n")
        return None
    print(f"time to fully recover (back where it was at the kill): {out.recovery_s:.2f} s")
    whole = window(out, out.kill_t, out.recovered_t)
    print(describe_window("throughput during recovery", whole, normal))
    print("  (all of it re-trains lost work: new progress during recovery is nil by definition)")
    print(describe_pauses(out, out.recovered_t))
    print(describe_cpu(out, out.kill_t, out.recovered_t))
    estimates = full_estimates(out, settings)
    if estimates is not None:
        redo = Samples(out.trace).rate(out.ready_t, out.recovered_t)
        best, average, worst = estimates
        print(
            f"paper's cases at these costs (relaunch {best:.2f} s, re-training at {redo:,.0f} "
            f"samples/s): best {best:.2f} s, average {average:.2f} s (+ half an interval's "
            f"work), worst {worst:.2f} s"
        )
    print()
    return whole


def report_opening(out: Outcome, settings: Settings) -> float | None:
    """Print whether the kill happened and the normal rate before it (None: no kill)."""
    if not out.kill_t:
        print(f"no kill: {out.error} (job {out.final_state})\n")
        return None
    normal = normal_rate(out, settings)
    print(f"normal throughput ({settings.window_s:g} s before the kill): {normal:,.0f} samples/s")
    return normal


def report_relaunch(out: Outcome, what: str, how: str) -> None:
    """When the replaced PS was back, from the kill and from the death detected."""
    if out.ready_t is None:
        return
    reload = "?" if out.reload_s is None else f"{out.reload_s:.2f} s"
    print(
        f"ps-1 {what} {out.ready_t - out.kill_t:.2f} s after the kill "
        f'({how}recovery_seconds["ps"]: {reload}, from the death detected)'
    )


def report_ecrm(out: Outcome, settings: Settings) -> Window | None:
    print(
        f"== ecrm k={ECRM_K}, {settings.rows_per_lock:,} rows per lock: ps-1 relaunched empty, "
        "rebuilt from parity while training goes on"
    )
    normal = report_opening(out, settings)
    if normal is None:
        return None
    report_relaunch(out, "relaunched", "")
    rebuild = out.rebuild
    if rebuild is not None:
        print(
            f"rebuild: {rebuild.get('seconds')} s (rows {rebuild.get('rows_seconds')} s): "
            f"{rebuild.get('rows', 0):,} rows, {rebuild.get('held_rows', 0):,} held updates, "
            f"{rebuild.get('degraded_rows', 0):,} rows served by decoding"
            + (f"; error: {rebuild['error']}" if "error" in rebuild else "")
        )
    if out.recovery_s is None or out.ready_t is None or out.recovered_t is None:
        print(f"not recovered: {out.error or '?'} (job {out.final_state})\n")
        return None
    print(f"time to fully recover (rebuild done): {out.recovery_s:.2f} s")
    whole = window(out, out.kill_t, out.recovered_t)
    print(describe_window("throughput during recovery", whole, normal))
    started = (rebuild or {}).get("started_at")
    if isinstance(started, int | float) and out.recovered_t > started:
        rebuilding = window(out, started, out.recovered_t)
        print(describe_window("  of which while rebuilding", rebuilding, normal))
    phases = [(rebuild or {}).get(k) for k in ("finished_at", "seconds", "rows_seconds")]
    numbers = [float(p) for p in phases if isinstance(p, int | float)]
    if len(numbers) == len(phases):
        finished, seconds, rows_seconds = numbers
        rows_done = finished - seconds + rows_seconds
        for label, (a, b) in {
            "    decoding its rows (degraded reads)": (finished - seconds, rows_done),
            "    encoding the parity it held": (rows_done, finished),
        }.items():
            if b > a:
                print(describe_window(label, window(out, a, b), normal))
    waiting = window(out, out.kill_t, out.ready_t)
    print(describe_window("  of which waiting for ps-1", waiting, normal))
    print(describe_pauses(out, out.recovered_t))
    print(describe_cpu(out, out.kill_t, out.recovered_t))
    print()
    return whole


def cpu_rates(out: Outcome, start: float, end: float) -> dict[str, float]:
    """Cores busy on average from ``start`` to ``end``, per ``CpuMeter`` entry (the
    nearest samples inside)."""
    inside = [p for p in out.trace if start <= p.t <= end and p.cpu]
    if len(inside) < 2 or inside[-1].t <= inside[0].t:
        return {}
    a, b = inside[0], inside[-1]
    return {k: (b.cpu[k] - a.cpu[k]) / (b.t - a.t) for k in b.cpu if k in a.cpu}


def describe_cpu(out: Outcome, start: float, end: float) -> str:
    """Where the cores went during recovery against as long just before the kill."""
    during = cpu_rates(out, start, end)
    before = cpu_rates(out, out.kill_t - (end - start), out.kill_t)
    if not during or not before:
        return "cores busy: not sampled"
    said = ", ".join(
        f"{k} {before[k]:.2f} -> {during[k]:.2f}" for k in ("machine", *CpuMeter.ROLES)
    )
    return f"cores busy (of {psutil.cpu_count()}), just before the kill -> during recovery: {said}"


def rows_recovered_s(out: Outcome) -> float | None:
    """From the kill until the replacement had decoded every row (before it re-encoded the
    parity the lost PS held), by the PS's clock like ``recovered_t``."""
    rebuild = out.rebuild or {}
    phases = [rebuild.get(k) for k in ("finished_at", "seconds", "rows_seconds")]
    if not out.kill_t or not all(isinstance(p, int | float) for p in phases):
        return None
    finished, seconds, rows_seconds = (float(p) for p in phases)  # type: ignore[arg-type]
    return finished - seconds + rows_seconds - out.kill_t


def _age(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds:.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller data: a smoke run")
    parser.add_argument("--samples", type=int, help="training set size (300k; quick: 60k)")
    parser.add_argument("--checkpoint-interval", type=float, default=10.0, help="seconds")
    parser.add_argument(
        "--kill-phase",
        type=float,
        default=0.5,
        help="kill this share of a checkpoint interval after a checkpoint was committed (0.5: "
        "the paper's average case for full; < 0: right after the window, wherever that falls)",
    )
    parser.add_argument(
        "--rows-per-lock",
        type=int,
        default=EcrmOptions().rows_per_lock,
        help="ECRM rows rebuilt per lock (default: the product's)",
    )
    parser.add_argument(
        "--no-standby",
        action="store_true",
        help="relaunch a lost PS as a new process (default: a spare PS takes over, both policies)",
    )
    parser.add_argument("--window", type=float, help="seconds traced before the kill (30; 10)")
    parser.add_argument("--work-dir", type=Path, help="kept afterwards (default: a temp dir)")
    parser.add_argument(
        "--only",
        choices=POLICIES,
        help="run this policy's job alone (to iterate on it; no goals: they need both)",
    )
    args = parser.parse_args()
    if args.kill_phase >= 0.95:
        parser.error("--kill-phase must be < 0.95 (the next checkpoint is due at 1)")
    settings = Settings(
        samples=args.samples or (60_000 if args.quick else 300_000),
        epochs=20,
        steady=10_000 if args.quick else 40_000,
        window_s=args.window or (10.0 if args.quick else 30.0),
        checkpoint_interval_s=args.checkpoint_interval,
        kill_phase=args.kill_phase,
        rows_per_lock=args.rows_per_lock,
        standby=not args.no_standby,
        timeout_s=300.0,
    )
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        if args.work_dir is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ecrm-bench-")))
        else:
            root = args.work_dir
            root.mkdir(parents=True, exist_ok=True)
        data = generate_dataset(
            root / "data", SyntheticConfig(num_train=settings.samples, num_eval=1000, seed=4)
        )
        policies = (args.only,) if args.only else POLICIES
        outcomes = {policy: run_policy(data, root, policy, settings) for policy in policies}
    print(
        f"3 PS, 2 workers, {settings.samples:,} samples x {settings.epochs} epochs, "
        f"adagrad, shard 2048; SIGKILL of ps-1 after {settings.window_s:g} s of tracing"
        + (
            f", {settings.kill_phase:g} of a checkpoint interval after a checkpoint"
            if settings.kill_phase >= 0
            else ""
        )
        + (
            "; a spare PS process takes over (recovery.standby_ps)\n"
            if settings.standby
            else "; a lost PS is relaunched as a new process (--no-standby)\n"
        )
    )
    if "full" in outcomes:
        report_full(outcomes["full"], settings)
    if "ecrm" in outcomes:
        during = report_ecrm(outcomes["ecrm"], settings)
    if args.only:
        print(f"\n(bench took {time.monotonic() - began:.0f} s; --only: no goals)")
        return 0
    full, ecrm = outcomes["full"], outcomes["ecrm"]
    print("== goals")
    speedup = 0.0
    if full.recovery_s is not None and ecrm.recovery_s is not None:
        speedup = full.recovery_s / ecrm.recovery_s
        print(
            f"time to fully recover: full {full.recovery_s:.2f} s / ecrm {ecrm.recovery_s:.2f} s "
            f"= {speedup:.1f}x; goal >= {GOAL_SPEEDUP:g}x: {verdict(speedup >= GOAL_SPEEDUP)}"
        )
    else:
        print(f"time to fully recover: a job did not recover; goal >= {GOAL_SPEEDUP:g}x: NOT MET")
    rows_back = rows_recovered_s(ecrm)
    if full.recovery_s is not None and rows_back:
        print(
            f"  (its rows alone, the paper's full recovery of a server: every entry and optimizer "
            f"state decoded, section 3.4, {rows_back:.2f} s after the kill: "
            f"{full.recovery_s / rows_back:.1f}x; the goal counts the parity it held as well)"
        )
    estimates = full_estimates(full, settings)
    if estimates is not None and ecrm.recovery_s:
        print(
            f"  (against full's average case at this run's costs, {estimates[1]:.2f} s: "
            f"{estimates[1] / ecrm.recovery_s:.1f}x; this kill came "
            f"{_age(full.restored_age_s)} after the snapshot full restored)"
        )
    rebuild_s = (ecrm.rebuild or {}).get("seconds")
    reload = "?" if full.reload_s is None else f"{full.reload_s:.2f} s"
    print(
        f'  narrow definitions: full\'s reload (recovery_seconds["ps"]) {reload}, '
        f"ecrm's rebuild (ecrm_rebuilds seconds) {rebuild_s} s"
    )
    ratio = during.ratio if during is not None else 0.0
    print(
        f"ecrm throughput during recovery: {ratio:.2f} of that just before the kill; goal >= "
        f"{GOAL_THROUGHPUT:.2f}: {verdict(ratio >= GOAL_THROUGHPUT)}"
    )
    if full.kill_t and ecrm.kill_t:
        change = normal_rate(ecrm, settings) / max(normal_rate(full, settings), 1e-9) - 1
        print(
            f"  (ecrm's normal throughput against full's, two runs apart: {change:+.1%}; "
            "the paper's normal-operation cost of ECRM: 2.6-4.2%)"
        )
    print(f"\n(bench took {time.monotonic() - began:.0f} s)")
    return 0 if speedup >= GOAL_SPEEDUP and ratio >= GOAL_THROUGHPUT else 1


if __name__ == "__main__":
    sys.exit(main())
