"""Load on one job master: ``--workers`` simulated workers against a real master process on
loopback, each doing what a worker does to it (ready, then lease a shard, heartbeat, report it
done, until the queue is drained), all at once, as fast as the master answers.

The master is ``tests/fixtures/lone_master.py`` (the real ``master.serve``, whose launcher
starts no node) with a real PS, so the job ends as a job does (the model saved from the PS, the
final status in ``state.json``); the workers are coroutines of one process, each with its own
``httpx.AsyncClient`` (and connection). Printed per run, side by side: request latency
(p50/p99, per route and overall, as the client saw it), requests/s, leases/s, wall time, and
the CPU seconds of the master and of the client (which of the two the machine's cores were
spent on). Checked: every shard leased once and reported done once, every report accepted,
the master's own accounting agrees, no 5xx, no transport error; each run is bounded by
``--seconds``.

    python bench/master_load.py                          # 1,000 workers, then 100 for context
    python bench/master_load.py --workers 1000 --shards-per-worker 8 --seconds 120
    python bench/master_load.py --workers 1000 --pace-s 2   # each worker a request per 2 s
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import math
import os
import ssl
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))

from lone_master import Master, lone_master, ps_node, small_job

from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.spec import AutoscaleConfig, RecoveryConfig, ResourcePlan, TrainingConfig
from airflow_rover.rpc.master_api import API_PREFIX

ROUTES = ("ready", "lease", "heartbeat", "done")
SHARD_SIZE = 4  # samples: the dataset stays tiny, the queue long
EPOCHS = 2
LEASE_S = 3600.0  # no lease expires during a run: every shard is leased exactly once
STEP_TIME_MS = 10.0  # every worker reports the same step time: none is a straggler
WAIT_S = 0.05  # a worker told to wait asks again after this
REQUEST_TIMEOUT_S = 60.0
START_S = 60.0  # the master up, the PS ready, the workers asked for
END_S = 30.0  # the job's end after the last shard (the model saved), and how long the master
# then answers the workers still asking for a shard ("done"), as a master does
TERMINAL = ("succeeded", "failed", "stopped")


class LoadFailed(Exception):
    """A request failed (a transport error, or an answer other than 200)."""


@dataclass
class LoadRecord:
    """What the simulated workers saw: each request's latency by route (seconds), each shard
    leased (shard id, worker) and reported done (shard id, worker, accepted)."""

    latencies: dict[str, list[float]] = field(
        default_factory=lambda: {route: [] for route in ROUTES}
    )
    leases: list[tuple[int, str]] = field(default_factory=list)
    dones: list[tuple[int, str, bool]] = field(default_factory=list)
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    errors: list[str] = field(default_factory=list)
    waits: int = 0
    seconds: float = 0.0  # from the first request to the last answer
    timed_out: bool = False

    @property
    def requests(self) -> int:
        return sum(len(v) for v in self.latencies.values())


@dataclass
class LoadRun:
    """One run: its shape, what the workers saw, and the master's side of it."""

    workers: int
    shards: int
    pace_s: float
    record: LoadRecord
    final: dict[str, Any]  # the job's last status (``state.json``)
    master_cpu_s: float | None
    client_cpu_s: float

    def problems(self) -> list[str]:
        """What went wrong: a shard lost or given twice, a failed request, a master that
        disagrees, a run out of time; empty when none."""
        record = self.record
        found = audit(record, self.shards)
        if record.timed_out:
            done = sum(ok for _, _, ok in record.dones)
            found.append(
                f"the queue was not drained within {record.seconds:.0f} s: {len(record.leases)}"
                f" of {self.shards} shards leased, {done} done"
            )
        if record.errors:
            found.append(f"{len(record.errors)} failed request(s), first: {record.errors[0]}")
        server_errors = sum(n for code, n in record.statuses.items() if code >= 500)
        if server_errors:
            found.append(f"{server_errors} answer(s) 5xx: {dict(record.statuses)}")
        found += master_disagrees(self.final, self.shards)
        return found

    def leases_per_s(self) -> float:
        return len(self.record.leases) / self.record.seconds if self.record.seconds else 0.0

    def requests_per_s(self) -> float:
        return self.record.requests / self.record.seconds if self.record.seconds else 0.0


def audit(record: LoadRecord, shards: int) -> list[str]:
    """Every shard ``0 .. shards - 1`` leased exactly once and reported done exactly once, by
    the worker it was leased to, and every report accepted."""
    leased = collections.Counter(sid for sid, _ in record.leases)
    holder = {sid: worker for sid, worker in record.leases}
    accepted = collections.Counter(sid for sid, _, ok in record.dones if ok)
    found = []
    expected = set(range(shards))
    checks = [
        ("never leased", expected - set(leased)),
        ("leased more than once", {s for s, n in leased.items() if n > 1}),
        ("never done", expected - set(accepted)),
        ("done more than once", {s for s, n in accepted.items() if n > 1}),
        ("not in the queue", (set(leased) | set(accepted)) - expected),
        ("reported done but rejected", {sid for sid, _, ok in record.dones if not ok}),
        (
            "done by a worker it was not leased to",
            {s for s, w, _ in record.dones if holder.get(s) != w},
        ),
    ]
    for what, ids in checks:
        if ids:
            found.append(f"{len(ids)} shard(s) {what}: {sorted(ids)[:10]}")
    return found


def master_disagrees(final: dict[str, Any], shards: int) -> list[str]:
    """The master's last status: the job succeeded, every sample and shard done, each shard
    once by its own accounting."""
    found = []
    if final.get("state") != "succeeded":
        found.append(f"the job ended {final.get('state')}: {final.get('message')}")
    progress = final.get("progress", {})
    if progress.get("samples_done") != progress.get("samples_total"):
        found.append(
            f"the master counts {progress.get('samples_done')} samples done of "
            f"{progress.get('samples_total')}"
        )
    if progress.get("shards", {}).get("done") != shards:
        found.append(f"the master counts shards {progress.get('shards')}, of {shards}")
    accounting = (final.get("result") or {}).get("accounting", {})
    if accounting.get("done_once") != shards or accounting.get("done_more_than_once"):
        found.append(f"the master's accounting: {accounting}")
    return found


# -- the job and its master ------------------------------------------------------------------
def load_job(root: Path, workers: int, shards_per_worker: int) -> JobDir:
    """A job of ``workers`` workers and about ``shards_per_worker`` shards each, of
    ``SHARD_SIZE`` samples over ``EPOCHS`` passes; no lease expires, no checkpoint is taken and
    no plan proposed, so what the master does is serve the workers."""
    per_epoch = math.ceil(workers * shards_per_worker / EPOCHS)
    training = TrainingConfig(
        batch_size=SHARD_SIZE, shard_size=SHARD_SIZE, epochs=EPOCHS, shard_lease_s=LEASE_S
    )
    return small_job(
        root,
        num_train=per_epoch * SHARD_SIZE,
        job_id="master-load",
        plan=ResourcePlan(num_workers=workers),
        training=training,
        recovery=RecoveryConfig(checkpoint_interval_s=0),
        autoscale=AutoscaleConfig(enabled=False),
    )


def wait_for(master: Master, state: str, seconds: float) -> dict[str, Any]:
    """The master's status once the job is in ``state``."""
    deadline = time.monotonic() + seconds
    while True:
        status: dict[str, Any] = master.get("/status").json()
        if status["state"] == state:
            return status
        if time.monotonic() > deadline or master.process.poll() is not None:
            raise LoadFailed(f"the job is {status['state']}, not {state}, after {seconds} s")
        time.sleep(0.05)


def master_cpu_s(master: Master) -> float | None:
    """CPU seconds the master process has used (None once it is gone)."""
    try:
        times = psutil.Process(master.process.pid).cpu_times()
    except psutil.Error:
        return None
    return float(times.user + times.system)


def run_load(
    root: Path, workers: int, shards_per_worker: int, seconds: float, pace_s: float = 0.0
) -> LoadRun:
    """One job's master under ``workers`` simulated workers until its queue is drained (at
    most ``seconds``), then the job's end (its final status, at most ``END_S`` later)."""
    job_dir = load_job(root, workers, shards_per_worker)
    with lone_master(job_dir, linger_s=END_S) as master, ps_node(master, job_dir):
        status = wait_for(master, "running", START_S)
        shards = sum(status["progress"]["shards"].values())
        client_start = time.process_time()
        record = asyncio.run(drive(master, workers, seconds, pace_s))
        client_cpu = time.process_time() - client_start
        master_cpu = master_cpu_s(master)
        final = ended(job_dir, 0.0 if record.timed_out else END_S)
    return LoadRun(workers, shards, pace_s, record, final, master_cpu, client_cpu)


def ended(job_dir: JobDir, seconds: float) -> dict[str, Any]:
    """The job's final status (``state.json``) once it has ended, or its latest after
    ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        status = job_dir.read_json(job_dir.state_file) or {}
        if status.get("state") in TERMINAL or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


# -- the simulated workers -------------------------------------------------------------------
async def drive(master: Master, workers: int, seconds: float, pace_s: float) -> LoadRecord:
    """Run ``workers`` workers at once until each is told the queue is done, a request fails
    (the others are stopped) or ``seconds`` have passed (the same)."""
    record = LoadRecord()
    # a client (and a connection) per worker, as each worker process has: one client's pool
    # of a thousand connections is searched on every request (httpcore), a cost of its own
    options: dict[str, Any] = {
        "base_url": f"{master.address}{API_PREFIX}",
        "headers": {"Authorization": f"Bearer {master.token}"},
        "timeout": REQUEST_TIMEOUT_S,
        "verify": ssl.create_default_context(),  # shared: each one costs ~20 ms to load
    }
    start = time.perf_counter()
    tasks = []
    for i in range(workers):
        worker = Worker(httpx.AsyncClient(**options), f"worker-{i}", record, pace_s)
        worker.next_at = start + pace_s * i / workers  # paced ones start spread out
        tasks.append(asyncio.create_task(worker.run()))
    done, pending = await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
    record.seconds = time.perf_counter() - start
    record.timed_out = bool(pending) and not any(t.exception() for t in done)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return record


class Worker:
    """One simulated worker: ready, then lease, heartbeat and done per shard until the queue
    is done (told to wait: it asks again after ``WAIT_S``). ``pace_s``: its requests start at
    least this far apart (0: each as soon as the last is answered)."""

    def __init__(
        self, client: httpx.AsyncClient, node_id: str, record: LoadRecord, pace_s: float
    ) -> None:
        self.client, self.node_id, self.record, self.pace_s = client, node_id, record, pace_s
        self.next_at = 0.0

    async def run(self) -> None:
        node_id, record = self.node_id, self.record
        async with self.client:
            await self.post("ready", f"/nodes/{node_id}/ready", {})
            steps = samples = 0
            while True:
                reply = await self.post("lease", "/shards/lease", {"node_id": node_id})
                if reply["status"] == "done":
                    return
                if reply["status"] == "wait":
                    record.waits += 1
                    await asyncio.sleep(WAIT_S)
                    continue
                shard = reply["shard"]
                sid = shard["shard_id"]
                record.leases.append((sid, node_id))
                steps, samples = steps + 1, samples + shard["end"] - shard["start"]
                progress = {"steps": steps, "samples": samples, "step_time_ms": STEP_TIME_MS}
                await self.post("heartbeat", f"/nodes/{node_id}/heartbeat", progress)
                done = await self.post("done", f"/shards/{sid}/done", {"node_id": node_id})
                record.dones.append((sid, node_id, bool(done["accepted"])))

    async def post(self, route: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``path`` (paced); its latency is recorded under ``route``;
        LoadFailed unless the answer is 200."""
        record = self.record
        await asyncio.sleep(max(0.0, self.next_at - time.perf_counter()))
        start = time.perf_counter()
        self.next_at = start + self.pace_s
        try:
            reply = await self.client.post(path, json=body)
        except httpx.TransportError as exc:
            record.errors.append(f"{route} {path}: {type(exc).__name__}: {exc!r}")
            raise LoadFailed(record.errors[-1]) from exc
        record.latencies[route].append(time.perf_counter() - start)
        record.statuses[reply.status_code] += 1
        if reply.status_code != 200:
            record.errors.append(f"{route} {path}: {reply.status_code} {reply.text[:200]}")
            raise LoadFailed(record.errors[-1])
        answer: dict[str, Any] = reply.json()
        return answer


# -- the report ------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 of nothing)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def latency_ms(values: Sequence[float]) -> str:
    return f"{percentile(values, 50) * 1e3:.1f} / {percentile(values, 99) * 1e3:.1f}"


def report(runs: list[LoadRun]) -> str:
    """The runs side by side, one column each."""
    rows: list[tuple[str, list[str]]] = [
        ("shards", [str(r.shards) for r in runs]),
        ("wall s (drain)", [f"{r.record.seconds:.1f}" for r in runs]),
        ("requests", [str(r.record.requests) for r in runs]),
        ("requests/s", [f"{r.requests_per_s():.0f}" for r in runs]),
        ("leases/s", [f"{r.leases_per_s():.0f}" for r in runs]),
    ]
    for route in ROUTES:
        rows.append((f"{route} p50/p99 ms", [latency_ms(r.record.latencies[route]) for r in runs]))
    every = [[x for v in r.record.latencies.values() for x in v] for r in runs]
    rows.append(("all p50/p99 ms", [latency_ms(v) for v in every]))
    rows.append(("lease waits", [str(r.record.waits) for r in runs]))
    cpu = [f"{r.master_cpu_s or 0:.1f} / {r.client_cpu_s:.1f}" for r in runs]
    rows.append(("CPU s master/client", cpu))
    rows.append(("problems", [str(len(r.problems())) for r in runs]))
    head = ("", [f"{r.workers} workers" + (f", {r.pace_s:g} s" if r.pace_s else "") for r in runs])
    width = max(len(name) for name, _ in rows)
    cols = [max(len(head[1][i]), *(len(v[i]) for _, v in rows)) for i in range(len(runs))]
    lines = []
    for name, values in [head, *rows]:
        cells = "  ".join(v.rjust(w) for v, w in zip(values, cols, strict=True))
        lines.append(f"  {name.ljust(width)}  {cells}")
    return "\n".join(lines)


def machine() -> str:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return f"{os.cpu_count()} CPUs ({affinity} usable)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1000, 100])
    parser.add_argument("--shards-per-worker", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=120.0, help="bound of each run")
    parser.add_argument(
        "--pace-s",
        type=float,
        default=0.0,
        help="a worker's requests start at least this far apart (default: flat out)",
    )
    args = parser.parse_args(argv)
    runs = []
    for workers in args.workers:
        with tempfile.TemporaryDirectory(prefix="master-load-") as root:
            shards, seconds = args.shards_per_worker, args.seconds
            runs.append(run_load(Path(root), workers, shards, seconds, args.pace_s))
    print(f"master load on {machine()}: each worker leases, heartbeats and reports its shards")
    print(report(runs))
    if len(runs) > 1:
        ratio = runs[0].leases_per_s() / max(runs[-1].leases_per_s(), 1e-9)
        print(f"leases/s with {runs[0].workers} workers / with {runs[-1].workers}: {ratio:.2f}")
    failed = False
    for run in runs:
        for problem in run.problems():
            print(f"{run.workers} workers: {problem}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
