"""The cluster arbiter: who gets a shared budget's cores and memory (DLRover-RM 4.3).

Every trigger of a job that shares a budget asks ``allocate`` with the budget's fresh rows
(``history.registry`` reads them under the budget's lock, so every trigger decides alike):

1. A running job's proposal that grows nothing the budget limits (a scale-down) is allowed.
2. When every pending scale-up and every waiting job's starting plan fit what the running
   plans leave, all are allowed and admitted.
3. Otherwise they are contested: ``core.optimizer.weighted_greedy`` takes the running jobs'
   scale-ups and the waiting jobs' starting plans together, largest RE * WG * weight first,
   while they fit. RE = gain / cost of the plan (``Prices``); WG = 1 / (remaining samples /
   samples/s once changed + 1); weight = the job's ``autoscale.weight``.
4. A waiting job that may start smaller (its ``min_plan``) and did not get its starting plan
   is admitted at its minimum plan if that fits what is left.
5. For a waiting job still left out, running jobs of lower weight are shrunk toward their
   minimum plan (lowest weight first) when that frees enough for it; it is admitted once
   their triggers have applied the smaller plans.

A job's data workers count beside its plan (``RunningJob.needs``): a running job holds them, a
waiting job needs them to start; no plan change moves them.

The gain of a running job's proposal is its master's ``expected_gain``, else linear in the
worker count (0 for a PS-side change, which then gets only what no gain needs). A waiting
job's gain is the samples/s it is expected to train at: its own estimate, else its workers
at the mean samples/s per worker of the budget's running jobs. Waiting jobs of equal score
are taken in the order they began to wait. Pure: no database, no Airflow.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from airflow_rover.core.cluster_budget import (
    Admission,
    Decision,
    RunningJob,
    Shrink,
    Verdict,
    describe,
    limits,
    proposal_gain,
)
from airflow_rover.core.optimizer import (
    Budget,
    Candidate,
    JobCandidates,
    Prices,
    weight,
    weighted_greedy,
)
from airflow_rover.core.spec import ClusterBudget, ResourcePlan

RHO = 1.0  # WG's exponent (DLRover-RM Eqn. 14)
NO_PEER_RATE = 1.0  # samples/s per worker assumed when no running job says better


@dataclass
class _Held:
    """(cores, MB) the budget's jobs hold as the decision goes."""

    limit: Budget
    cpu: float = 0.0
    memory_mb: float = 0.0

    def add(self, cpu: float, memory_mb: float) -> None:
        self.cpu += cpu
        self.memory_mb += memory_mb

    def left(self) -> tuple[float, float]:
        return self.limit.cpu - self.cpu, self.limit.memory_mb - self.memory_mb

    def fits(self, cpu: float, memory_mb: float) -> bool:
        return (
            self.cpu + cpu <= self.limit.cpu and self.memory_mb + memory_mb <= self.limit.memory_mb
        )

    def grows(self, cpu: float, memory_mb: float) -> bool:
        """Whether a change of (cpu, memory_mb) grows something this budget limits."""
        return (cpu > 0 and math.isfinite(self.limit.cpu)) or (
            memory_mb > 0 and math.isfinite(self.limit.memory_mb)
        )

    def words(self, cpu: float, memory_mb: float) -> str:
        """(cpu, memory_mb) in words, leaving out what the budget does not limit."""
        return describe(
            cpu if math.isfinite(self.limit.cpu) else math.inf,
            memory_mb if math.isfinite(self.limit.memory_mb) else math.inf,
        )


def allocate(
    jobs: Iterable[RunningJob],
    budget: ClusterBudget,
    now: float,
    prices: Prices | None = None,
    rho: float = RHO,
) -> Decision:
    """The arbiter's answer for ``budget``'s fresh ``jobs`` (see the module docstring).
    Deterministic: every trigger that reads the same rows decides alike."""
    prices = prices or Prices()
    fresh = [j for j in jobs if j.fresh(now)]
    running = sorted((j for j in fresh if not j.waiting), key=lambda j: j.job_id)
    waiting = sorted((j for j in fresh if j.waiting), key=_place_in_line)
    held = _Held(limits(budget))
    for job in running:
        held.add(*job.needs(job.plan))
    verdicts: dict[str, Verdict] = {}
    ups: list[RunningJob] = []
    for job in (j for j in running if j.proposal is not None):  # scale-downs only free
        change = _delta(job)
        if held.grows(*change):
            ups.append(job)
        else:
            held.add(*change)
            verdicts[job.job_id] = _verdict(
                job, True, f"grows nothing budget {budget.name!r} limits: always allowed"
            )
    if not ups and not waiting:
        return Decision(budget.name, verdicts, cpu_used=held.cpu, memory_mb_used=held.memory_mb)
    peer_rate = _rate_per_worker(running)
    if held.fits(*_total([_delta(j) for j in ups] + [j.needs(j.plan) for j in waiting])):
        return _everything_fits(budget, held, ups, waiting, verdicts)
    return _contested(budget, held, running, ups, waiting, verdicts, peer_rate, prices, rho)


def _everything_fits(
    budget: ClusterBudget,
    held: _Held,
    ups: list[RunningJob],
    waiting: list[RunningJob],
    verdicts: dict[str, Verdict],
) -> Decision:
    for job in ups:
        held.add(*_delta(job))
    for job in waiting:
        held.add(*job.needs(job.plan))
    used = f"{held.words(held.cpu, held.memory_mb)} of {held.words(*_limit(held))}"
    for job in ups:
        verdicts[job.job_id] = _verdict(
            job, True, f"every pending plan fits budget {budget.name!r} ({used})"
        )
    admissions = {
        job.job_id: Admission(
            job.job_id, job.plan, f"every pending plan fits budget {budget.name!r} ({used})"
        )
        for job in waiting
    }
    return Decision(budget.name, verdicts, admissions, {}, held.cpu, held.memory_mb)


def _contested(
    budget: ClusterBudget,
    held: _Held,
    running: list[RunningJob],
    ups: list[RunningJob],
    waiting: list[RunningJob],
    verdicts: dict[str, Verdict],
    peer_rate: float,
    prices: Prices,
    rho: float,
) -> Decision:
    """Steps 3 to 5 of the module docstring; ``held``: what the running jobs hold once the
    scale-downs are applied."""
    options: list[JobCandidates] = []
    scores: dict[str, float] = {}
    for job in ups:
        assert job.proposal is not None
        gain = proposal_gain(job)
        if gain < 0:
            continue  # it costs more and promises less: never worth contested resources
        candidate = Candidate(job.proposal.plan, prices.cost(job.proposal.plan), gain)
        scores[job.job_id] = _score(candidate, job, job.samples_per_second, rho)
        options.append(
            JobCandidates(
                job.job_id,
                job.plan,
                job.samples_per_second,
                job.remaining_samples,
                (candidate,),
                job_weight=job.weight,
            )
        )
    starts = {j.job_id: _start(j, j.plan, peer_rate, prices) for j in waiting}
    for job in waiting:
        scores[job.job_id] = _score(starts[job.job_id], job, 0.0, rho)
        options.append(_waiting_option(job, starts[job.job_id]))
    up_cpu, up_mem = _total([Budget.used(j.plan) for j in ups])
    room = Budget(
        held.limit.cpu - (held.cpu - up_cpu), held.limit.memory_mb - (held.memory_mb - up_mem)
    )
    chosen = weighted_greedy(options, room, min_gain=-math.inf, rho=rho)
    for job in ups:
        if job.job_id in chosen:
            held.add(*_delta(job))
    for job in waiting:
        if job.job_id in chosen:
            held.add(*job.needs(job.plan))
    ranked = sorted(scores, key=lambda job_id: -scores[job_id])
    rank = {job_id: f"rank {i + 1} of {len(ranked)}" for i, job_id in enumerate(ranked)}
    for job in ups:
        verdicts[job.job_id] = _up_verdict(job, budget, held, job.job_id in chosen, scores, rank)
    admissions: dict[str, Admission] = {}
    for job in waiting:
        if job.job_id in chosen:
            admissions[job.job_id] = Admission(
                job.job_id,
                job.plan,
                f"selected for budget {budget.name!r} by weighted greedy: "
                f"RE*WG {scores[job.job_id]:.4g}{_weighted(job)}, {rank[job.job_id]}",
                scores[job.job_id],
            )
    left_out = [j for j in waiting if j.job_id not in chosen]
    admissions |= _at_minimum(budget, held, left_out, peer_rate, prices, rho)
    left_out = [j for j in left_out if j.job_id not in admissions]
    left_out.sort(key=lambda j: -scores[j.job_id])  # stable: equal scores keep their line
    grown = {job_id for job_id, v in verdicts.items() if v.allowed}
    shrinks = _shrinks(budget, held, running, left_out, grown)
    for job in left_out:
        admissions[job.job_id] = _wait(job, budget, held, shrinks, scores, rank)
    return Decision(budget.name, verdicts, admissions, shrinks, held.cpu, held.memory_mb)


def _at_minimum(
    budget: ClusterBudget,
    held: _Held,
    left_out: list[RunningJob],
    peer_rate: float,
    prices: Prices,
    rho: float,
) -> dict[str, Admission]:
    """Step 4: the left-out waiting jobs that may start at their minimum plan, by weighted
    greedy within what is left."""
    smaller = [j for j in left_out if j.min_plan is not None and j.min_plan != j.plan]
    if not smaller:
        return {}
    starts = {j.job_id: _start(j, j.min_plan, peer_rate, prices) for j in smaller if j.min_plan}
    options = [_waiting_option(j, starts[j.job_id]) for j in smaller]
    chosen = weighted_greedy(options, Budget(*held.left()), min_gain=-math.inf, rho=rho)
    admitted: dict[str, Admission] = {}
    for job in smaller:
        plan = chosen.get(job.job_id)
        if plan is None:
            continue
        held.add(*job.needs(plan))
        score = _score(starts[job.job_id], job, 0.0, rho)
        admitted[job.job_id] = Admission(
            job.job_id,
            plan,
            f"its plan ({held.words(*job.needs(job.plan))}) does not fit budget "
            f"{budget.name!r}: starts at its minimum plan ({held.words(*job.needs(plan))}), "
            f"RE*WG {score:.4g}{_weighted(job)}",
            score,
        )
    return admitted


def _shrinks(
    budget: ClusterBudget,
    held: _Held,
    running: list[RunningJob],
    left_out: list[RunningJob],
    grown: set[str],
) -> dict[str, Shrink]:
    """Step 5: for each left-out waiting job, best first, the running jobs of lower weight
    whose shrinking to their minimum plan frees what it lacks (none if they cannot)."""
    shrinks: dict[str, Shrink] = {}
    free_cpu, free_mem = held.left()
    for job in left_out:
        need_cpu, need_mem = job.needs(job.min_plan or job.plan)
        lack_cpu, lack_mem = need_cpu - free_cpu, need_mem - free_mem
        victims = sorted(
            (
                r
                for r in running
                if r.weight < job.weight
                and r.job_id not in shrinks
                and r.job_id not in grown
                and r.min_plan is not None
                and _frees(r) != (0.0, 0.0)
            ),
            key=lambda r: (r.weight, r.job_id),
        )
        picked: list[RunningJob] = []
        for victim in victims:
            if lack_cpu <= 0 and lack_mem <= 0:
                break
            picked.append(victim)
            cpu, mem = _frees(victim)
            lack_cpu, lack_mem = lack_cpu - cpu, lack_mem - mem
        if not picked or lack_cpu > 0 or lack_mem > 0:
            continue  # shrinking every candidate would not make room: shrink none
        for victim in picked:
            assert victim.min_plan is not None
            shrinks[victim.job_id] = Shrink(
                victim.job_id,
                victim.min_plan,
                job.job_id,
                f"budget {budget.name!r}: shrunk to its minimum plan ("
                f"{victim.min_plan.num_workers} workers) for waiting job {job.job_id!r} of "
                f"weight {job.weight:g} (this job's weight: {victim.weight:g})",
            )
        free_cpu, free_mem = -lack_cpu, -lack_mem  # what is left once it starts
    return shrinks


def _frees(job: RunningJob) -> tuple[float, float]:
    """(cores, MB) the running job frees at its minimum plan."""
    assert job.min_plan is not None
    (cpu, mem), (low_cpu, low_mem) = Budget.used(job.plan), Budget.used(job.min_plan)
    return max(cpu - low_cpu, 0.0), max(mem - low_mem, 0.0)


def _wait(
    job: RunningJob,
    budget: ClusterBudget,
    held: _Held,
    shrinks: dict[str, Shrink],
    scores: dict[str, float],
    rank: dict[str, str],
) -> Admission:
    plan = job.min_plan or job.plan
    need = held.words(*job.needs(plan))
    whole = held.words(*_limit(held))
    if not _Held(held.limit).fits(*job.needs(plan)):
        reason = f"its plan needs {need}, more than budget {budget.name!r} has ({whole})"
    else:
        left = held.words(*(max(v, 0.0) for v in held.left()))
        reason = (
            f"budget {budget.name!r} has {left} left of {whole}; its plan needs {need}; "
            f"RE*WG {scores[job.job_id]:.4g}{_weighted(job)}, {rank[job.job_id]}"
        )
        shrunk = sorted(s.job_id for s in shrinks.values() if s.for_job == job.job_id)
        if shrunk:
            reason += f"; shrinking {', '.join(shrunk)} to make room"
    return Admission(job.job_id, None, reason, scores.get(job.job_id))


def _place_in_line(job: RunningJob) -> tuple[float, str]:
    return (job.waiting_since if job.waiting_since is not None else job.updated_at, job.job_id)


def _rate_per_worker(running: list[RunningJob]) -> float:
    """The mean samples/s per worker of the running jobs that report a rate."""
    rates = [j.samples_per_second / j.plan.num_workers for j in running if j.samples_per_second]
    return sum(rates) / len(rates) if rates else NO_PEER_RATE


def _start(job: RunningJob, plan: ResourcePlan, peer_rate: float, prices: Prices) -> Candidate:
    """A waiting job's start with ``plan`` as a candidate: its gain is the samples/s it is
    expected to train at (its estimate scaled to ``plan``'s workers, else its peers')."""
    if job.samples_per_second > 0:
        gain = job.samples_per_second * plan.num_workers / job.plan.num_workers
    else:
        gain = peer_rate * plan.num_workers
    return Candidate(plan, prices.cost(plan), gain)


def _waiting_option(job: RunningJob, start: Candidate) -> JobCandidates:
    return JobCandidates(
        job.job_id,
        None,
        0.0,
        job.remaining_samples,
        (start,),
        job_weight=job.weight,
        start_cost=job.data_workers,
    )


def _score(candidate: Candidate, job: RunningJob, rate: float, rho: float) -> float:
    """RE * WG * weight, as ``weighted_greedy`` ranks the candidate."""
    return (
        candidate.efficiency
        * weight(job.remaining_samples, rate + candidate.gain, rho)
        * job.weight
    )


def _delta(job: RunningJob) -> tuple[float, float]:
    """(cores, MB) the job's proposal adds to what its plan holds (negative: frees)."""
    assert job.proposal is not None
    (old_cpu, old_mem), (new_cpu, new_mem) = (
        Budget.used(job.plan),
        Budget.used(job.proposal.plan),
    )
    return new_cpu - old_cpu, new_mem - old_mem


def _total(changes: list[tuple[float, float]]) -> tuple[float, float]:
    return sum(c for c, _ in changes), sum(m for _, m in changes)


def _limit(held: _Held) -> tuple[float, float]:
    return held.limit.cpu, held.limit.memory_mb


def _up_verdict(
    job: RunningJob,
    budget: ClusterBudget,
    held: _Held,
    selected: bool,
    scores: dict[str, float],
    rank: dict[str, str],
) -> Verdict:
    """Why a contested scale-up was selected or not."""
    score = scores.get(job.job_id)
    if selected:
        reason = (
            f"selected for budget {budget.name!r} by weighted greedy: RE*WG {score:.4g}"
            f"{_weighted(job)}, {rank[job.job_id]}"
        )
    elif score is None:
        reason = f"budget {budget.name!r} is contested and this plan promises no gain"
    else:
        d_cpu, d_mem = _delta(job)
        needs = held.words(max(d_cpu, 0.0), max(d_mem, 0.0))
        left = describe(*(max(v, 0.0) for v in held.left()))
        reason = (
            f"budget {budget.name!r} is contested: this plan needs +{needs}, {left} left "
            f"after the selected plans; RE*WG {score:.4g}{_weighted(job)}, {rank[job.job_id]}"
        )
    return _verdict(job, selected, reason, score)


def _weighted(job: RunningJob) -> str:
    return f" (weight {job.weight:g} included)" if job.weight != 1.0 else ""


def _verdict(job: RunningJob, allowed: bool, reason: str, score: float | None = None) -> Verdict:
    assert job.proposal is not None
    return Verdict(
        job.job_id, job.proposal.id, allowed, reason, proposal_gain(job), score, job.proposal.plan
    )
