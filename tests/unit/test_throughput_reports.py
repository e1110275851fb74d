"""The master's samples/s (``status.throughput``, what the trigger logs on every poll) counts
only what each worker process trained after its first progress report to this master.

A worker's counters run from its own start, so a master that did not see them start (a
relaunched master, a resumed job) or the first reports of two workers a few milliseconds apart
must not read those counts as trained in that instant. Driven through the master's real HTTP
API; the nodes are records (``master_rig``).
"""

from __future__ import annotations

import time

from master_rig import Job, start_running

from airflow_rover.core.job_status import progress_line
from airflow_rover.core.spec import RecoveryConfig


def beat(job: Job, worker: str, samples: int) -> None:
    job.post(
        f"/nodes/{worker}/heartbeat",
        {"steps": samples // 64, "samples": samples, "step_time_ms": 5.0},
    )


def test_counts_trained_before_the_first_report_are_not_a_rate(make_job) -> None:
    """Workers whose first reports to this master already count a million samples each (they
    trained before it started): those reports are the starting line, so the status says
    0 samples/s until they report again, then what they trained since, over the time it took
    (on main the first poll read ~1e8 samples/s)."""
    job = make_job()
    start_running(job)
    beat(job, "worker-0", 1_000_000)
    beat(job, "worker-1", 990_000)
    first_reports_done = time.time()
    first = job.status()["throughput"]
    time.sleep(0.3)
    second_reports_start = time.time()
    beat(job, "worker-0", 1_000_640)
    beat(job, "worker-1", 990_640)
    rate = job.status()["throughput"]
    ceiling = 1280 / (second_reports_start - first_reports_done)
    print(f"first poll {first} samples/s; then {rate} samples/s (at most {ceiling:.0f})")
    assert first == 0.0
    assert 0 < rate <= ceiling
    assert job.master.throughput.trained == 1280


def test_a_relaunched_worker_starts_its_own_count(make_job) -> None:
    """A worker that dies and is relaunched reports from zero again: its first report is its
    starting line, the fall from its predecessor's count is no negative rate."""
    job = make_job()
    start_running(job)
    for samples in (640, 1280):
        beat(job, "worker-0", samples)
        time.sleep(0.05)
    job.launcher.exit("worker-0", 1)
    job.master.step()  # the master relaunches it
    assert job.launcher.started.count(("worker-0", "worker")) == 2
    beat(job, "worker-0", 192)  # trained while starting up: before its first report here
    after_relaunch = job.status()["throughput"]
    time.sleep(0.05)
    beat(job, "worker-0", 320)
    print(f"after the relaunch {after_relaunch} samples/s, then {job.status()['throughput']}")
    assert after_relaunch >= 0
    assert job.master.throughput.trained == 640 + 128
    assert job.status()["throughput"] > 0


def test_no_rate_once_training_is_over(make_job) -> None:
    """Scoring the held-out split trains nothing: the status says 0 samples/s, not the last
    window's rate (on main the evaluating job kept reporting it)."""
    job = make_job(with_eval=True, recovery=RecoveryConfig(checkpoint_interval_s=0))
    start_running(job)
    beat(job, "worker-0", 0)
    while (shard := job.lease("worker-0"))["status"] == "ok":
        assert job.done("worker-0", shard["shard"]["shard_id"])
    time.sleep(0.05)
    beat(job, "worker-0", 4000)
    training = job.status()["throughput"]
    job.master.step()  # every shard done: the evaluator scores the held-out split
    status = job.status()
    print(f"training {training} samples/s, then {status['state']} {status['throughput']}")
    assert training > 0
    assert (status["state"], status["throughput"]) == ("evaluating", 0.0)


def test_the_progress_line_says_apart_resumed_samples_and_shards() -> None:
    """What the trigger logs on every poll."""
    status = {
        "state": "running",
        "progress": {
            "samples_done": 150_000,
            "samples_resumed": 100_000,
            "samples_total": 200_000,
            "shards": {"todo": 10, "doing": 2, "done": 28, "quarantined": 0},
        },
        "throughput": 25_000.0,
    }
    assert progress_line(status) == (
        "running, 150000/200000 samples (resumed from a checkpoint holding 100000), "
        "shards 28/40 done, 25000.0 samples/s"
    )
