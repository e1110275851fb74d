"""DLRover's Brain service: a new job's creation plan from past jobs of the same scenario, as
``dlrover/go/brain/pkg/optimizer/implementation/`` computes it (the simulator's warm-started
DLRover, ``bench/_policies.DLRoverHeuristic``)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench._simcore import Config, Report
from bench._world import Setting

# -- DLRover's Brain: the creation plan from similar past jobs -------------------------------------
# dlrover/go/brain/pkg/optimizer/implementation/common/common.go
BRAIN_CPU_MARGIN = 4.0  # DefaultCPUMargin: cores added to the busiest PS's mean use
BRAIN_PS_CPU_MARGIN_PERCENT = 0.5  # DefaultPSCPUMarginPercent: on the jobs' total PS CPU
BRAIN_PS_MEMORY_MARGIN_PERCENT = 0.2  # DefaultPSMemoryMarginPercent
BRAIN_MAX_PS = 15  # DefaultMaxPSCount
BRAIN_WORKER_CREATE_CPU = 12.0  # DefaultWorkerCreateCPU: the first worker's least cores
BRAIN_WORKER_MEMORY_MARGIN_PERCENT = 0.5  # DefaultMemoryMarginPercent
BRAIN_WORKER_CREATE_MEMORY_MIB = 16 * 1024.0  # DefaultWorkerCreateMemory (16 GiB)
# .../optimizer/job_ps_create_resource_optimizer.go: the plan when no history estimates one
BRAIN_COLD_PS = 4
BRAIN_COLD_PS_CPU = 12.0
BRAIN_COLD_PS_MEMORY_MIB = 16 * 1024.0


@dataclass(frozen=True)
class UsageSample:
    """One runtime record of a past job, as Brain stores it (``JobRuntimeInfo`` in
    ``go/brain/pkg/common/job_metrics.go``): what each node used at one time.

    Memory is optional: the simulated worlds have none, and a history without any memory
    record sizes CPU only (Brain itself would then fall back to its cold plan)."""

    ps_cpu: tuple[float, ...]  # cores used, per PS
    worker_cpu: tuple[float, ...]  # cores used, per worker
    ps_memory_mib: tuple[float, ...] = ()
    worker_memory_mib: tuple[float, ...] = ()


@dataclass(frozen=True)
class PastRun:
    """One past job of the same scenario (Brain reads those created in the last 7 days)."""

    samples: tuple[UsageSample, ...]
    completed: bool = True  # exit reason "Completed": only these size the first worker

    @classmethod
    def of_reports(cls, reports: Sequence[Report], completed: bool = True) -> PastRun:
        """What Brain would have recorded of a simulated job: one sample per report."""
        samples = tuple(
            UsageSample(r.ps_cpu_used, (r.worker_cpu_used,) * r.config.workers) for r in reports
        )
        return cls(samples, completed)


@dataclass(frozen=True)
class CreationPlan:
    """Brain's plan for a new job: ``ps`` PS and one worker (its workers grow later)."""

    ps: int
    ps_cpu: float
    worker_cpu: float
    ps_memory_mib: float | None  # None: the history recorded no memory
    worker_memory_mib: float
    cold: bool  # True: no usable history, Brain's fixed cold PS plan

    def config(self, setting: Setting) -> Config:
        """As the job starts within ``setting``: cores rounded up as DLRover's master does
        (``brain_optimizer.convert_plan_msg``), a PS above the largest node split into more
        PS of that node (same total), and no more PS than the bounds and the budget hold next
        to the one worker."""
        worker_cpu = min(float(math.ceil(self.worker_cpu)), max(setting.bounds.worker_cpus))
        ps_cpu, count, cap = float(math.ceil(self.ps_cpu)), self.ps, max(setting.bounds.ps_cpus)
        if ps_cpu > cap:
            count, ps_cpu = math.ceil(count * ps_cpu / cap), cap
        room = math.floor((setting.budget - worker_cpu) / ps_cpu + 1e-9)
        if room < 1:
            raise ValueError(
                f"budget must hold Brain's first worker ({worker_cpu:g} cores) and one PS "
                f"({ps_cpu:g} cores), got {setting.budget:g} cores"
            )
        return Config(1, worker_cpu, (ps_cpu,) * min(count, setting.bounds.max_ps, room))


def major_cluster(values: Sequence[float]) -> list[float]:
    """The values nearest the median, half of them plus one at most: Brain's
    ``ComputeMajorCluster`` (``go/brain/pkg/optimizer/implementation/utils/math.go``).

    From the median it takes whichever neighbour is closer to the middle of what it holds
    (ties go right), until it holds ``len // 2 + 1`` values or reaches either end."""
    nums = sorted(values)
    if not nums:
        return []
    mid = len(nums) // 2
    cluster = [nums[mid]]
    left, right = mid - 1, mid + 1
    while left >= 0 and right < len(nums) and len(cluster) < mid + 1:
        kernel = cluster[len(cluster) // 2]
        if kernel - nums[left] < nums[right] - kernel:
            cluster.insert(0, nums[left])
            left -= 1
        else:
            cluster.append(nums[right])
            right += 1
    return cluster


def brain_ps_plan(history: Sequence[PastRun]) -> tuple[int, float, float | None] | None:
    """(PS count, cores per PS, memory per PS) from the history, or None when it has no
    estimate: Brain's ``EstimateJobResourceByHistoricJobs``
    (``go/brain/pkg/optimizer/implementation/utils/optimize_algorithm.go``).

    Per past job, the mean of the major cluster of its total-PS-CPU samples; across jobs,
    the mean of the major cluster of those means, times 1.5: the total. A PS gets the largest
    mean use of any one PS of any past job plus 4 cores; count = ceil(total / that), at most
    15 (then the cores are the total over 15). Memory: the largest one-PS sample, or the
    largest total over the count if more, plus 20%."""
    job_totals: list[float] = []
    max_ps_cpu = max_ps_memory = max_total_memory = 0.0
    with_memory = False
    for run in history:
        if not run.samples:
            continue
        totals = [sum(s.ps_cpu) for s in run.samples]
        job_totals.append(statistics.fmean(major_cluster(totals)))
        per_ps: dict[int, list[float]] = {}
        for s in run.samples:
            for j, used in enumerate(s.ps_cpu):
                per_ps.setdefault(j, []).append(used)
        max_ps_cpu = max([max_ps_cpu, *(statistics.fmean(u) for u in per_ps.values())])
        for s in run.samples:
            with_memory = with_memory or bool(s.ps_memory_mib)
            max_ps_memory = max(max_ps_memory, *s.ps_memory_mib, 0.0)
            max_total_memory = max(max_total_memory, sum(s.ps_memory_mib))
    if not job_totals:
        return None
    total_cpu = statistics.fmean(major_cluster(job_totals))
    if total_cpu == 0 or max_ps_cpu == 0 or (with_memory and max_ps_memory == 0):
        return None
    cpu = max_ps_cpu + BRAIN_CPU_MARGIN
    total = total_cpu * (1 + BRAIN_PS_CPU_MARGIN_PERCENT)
    count = math.ceil(total / cpu)
    if count > BRAIN_MAX_PS:
        count, cpu = BRAIN_MAX_PS, float(math.ceil(total / BRAIN_MAX_PS))
    if not with_memory:
        return count, cpu, None
    if max_ps_memory * count < max_total_memory:
        max_ps_memory = float(math.ceil(max_total_memory / count))
    return count, cpu, max_ps_memory * (1 + BRAIN_PS_MEMORY_MARGIN_PERCENT)


def brain_worker_plan(history: Sequence[PastRun]) -> tuple[float, float]:
    """(cores, memory) of the job's first worker: Brain's ``OptimizeJobWorkerCreateResource``
    (``go/brain/pkg/optimizer/implementation/optalgorithm/optimize_job_worker_create_resource
    .go``): the most any worker of a completed past job used, cores rounded up, at least 12
    cores; memory 1.5x the most used, at least 16 GiB."""
    samples = [s for run in history if run.completed for s in run.samples]
    cpu = max((c for s in samples for c in s.worker_cpu), default=0.0)
    memory = max((m for s in samples for m in s.worker_memory_mib), default=0.0)
    memory = max(memory * (1 + BRAIN_WORKER_MEMORY_MARGIN_PERCENT), BRAIN_WORKER_CREATE_MEMORY_MIB)
    return max(float(math.ceil(cpu)), BRAIN_WORKER_CREATE_CPU), memory


def brain_creation_plan(history: Sequence[PastRun]) -> CreationPlan:
    """Brain's plan for a new job (``optimizeCreateJob`` in ``go/brain/pkg/optimizer/
    implementation/optprocessor/running_training_job_optimize_request_processor.go``): the
    first worker's and the PS's plans, the cold PS plan where the history has no estimate."""
    worker_cpu, worker_memory = brain_worker_plan(history)
    ps = brain_ps_plan(history)
    if ps is None:
        return CreationPlan(
            BRAIN_COLD_PS,
            BRAIN_COLD_PS_CPU,
            worker_cpu,
            BRAIN_COLD_PS_MEMORY_MIB,
            worker_memory,
            cold=True,
        )
    count, cpu, memory = ps
    return CreationPlan(count, cpu, worker_cpu, memory, worker_memory, cold=False)
