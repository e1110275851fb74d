"""Triggers on several hosts deciding on one cluster budget at the same instant: each decider
is a process of its own (its own engine and connections, like a triggerer on another host)
that, every round, asks ``RunningJobRegistry.decide`` to grow its job by one worker as soon as
a barrier lets every decider go.

Every job holds ``BASE`` (1 worker + 1 PS of 1 core and 1024 MB) and proposes ``GROWN`` (one
more worker). ``run_rounds`` resets every job to ``BASE`` before each round, collects every
decider's answer after it, and hands them and the registry to the test's ``check``.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier

from airflow_rover.core.cluster_budget import RunningJob
from airflow_rover.core.optimizer import Budget
from airflow_rover.core.plans import PlanRecord
from airflow_rover.core.spec import ClusterBudget, ResourcePlan
from airflow_rover.history.registry import RunningJobRegistry
from airflow_rover.history.store import HistoryStore

MB = 1024
BASE = ResourcePlan(
    num_workers=1, num_ps=1, worker_cpu=1, ps_cpu=1, worker_memory_mb=MB, ps_memory_mb=MB
)
GROWN = BASE.model_copy(update={"num_workers": 2})
WAIT_S = 60.0  # a barrier wait longer than this means a decider hung or died


@dataclass(frozen=True)
class Answer:
    """What one decider's ``decide`` returned in one round (``error``: what it raised)."""

    round: int
    job_id: str
    allowed: bool
    cpu_used: float
    memory_mb_used: float
    seconds: float
    error: str | None = None


def job_at(job_id: str, plan: ResourcePlan, proposal_id: int | None) -> RunningJob:
    """The job's registry row holding ``plan``, asking for ``GROWN`` when ``proposal_id``."""
    return RunningJob(
        job_id=job_id,
        budget="shared",
        plan=plan,
        remaining_samples=10_000.0,
        samples_per_second=100.0,
        updated_at=time.time(),
        proposal=None if proposal_id is None else PlanRecord(id=proposal_id, plan=GROWN),
    )


def used(plan: ResourcePlan) -> tuple[float, float]:
    return Budget.used(plan)


def decider(
    url: str,
    job_id: str,
    budget: ClusterBudget,
    rounds: int,
    barrier: Barrier,
    answers: Queue[Answer],
) -> None:
    """One host's trigger: create the schema (racing the others), then every round wait at the
    barrier (the test has reset every row), decide and report."""
    with RunningJobRegistry(HistoryStore(url)) as registry:
        barrier.wait(WAIT_S)
        registry.ensure_schema()
        barrier.wait(WAIT_S)
        for number in range(rounds):
            barrier.wait(WAIT_S)  # the test reset every row: go, all at once
            began = time.perf_counter()
            try:
                decision = registry.decide(job_at(job_id, BASE, number + 1), budget)
                answer = Answer(
                    number,
                    job_id,
                    decision.allowed(job_id),
                    decision.cpu_used,
                    decision.memory_mb_used,
                    time.perf_counter() - began,
                )
            except Exception as exc:  # reported: the test fails on any error
                answer = Answer(number, job_id, False, 0, 0, 0, f"{type(exc).__name__}: {exc}")
            answers.put(answer)


def run_rounds(
    url: str,
    budget: ClusterBudget,
    deciders: int,
    rounds: int,
    check: Callable[[int, list[Answer], RunningJobRegistry], None],
) -> None:
    """Start ``deciders`` processes on the database at ``url`` and run ``rounds`` rounds,
    calling ``check(round, answers, registry)`` after each (every process has answered)."""
    # Forked before this process opens the database: each decider makes its own engine.
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(deciders + 1)
    answers: Queue[Answer] = context.Queue()
    job_ids = [f"job-{i}" for i in range(deciders)]
    processes = [
        context.Process(target=decider, args=(url, j, budget, rounds, barrier, answers))
        for j in job_ids
    ]
    for process in processes:
        process.start()
    try:
        with RunningJobRegistry(HistoryStore(url)) as registry:
            barrier.wait(WAIT_S)  # every decider is up
            barrier.wait(WAIT_S)  # and has created (or found) the schema
            for number in range(rounds):
                for job_id in job_ids:
                    registry.register(job_at(job_id, BASE, None))
                barrier.wait(WAIT_S)
                got = [answers.get(timeout=WAIT_S) for _ in job_ids]
                check(number, got, registry)
        for process in processes:
            process.join(WAIT_S)
    except BaseException:
        barrier.abort()
        raise
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    assert [p.exitcode for p in processes] == [0] * deciders
