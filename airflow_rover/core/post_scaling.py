"""Runtime fixes a model cannot foresee (DLRover section 4.2 "adjust", DLRover-RM 4.3): a hot PS,
a straggling worker, a PS about to run out of memory. (How many workers the PS carry is the
throughput model's call, not a rule's.)

Each rule reads a ``JobProfile`` (what the master's profiler measured) and either proposes a
plan with its reason or stays silent; ``post_scaling`` runs them in order and returns every
proposal, most urgent first: a predicted OOM (it would end the job), a hot PS (it slows every
worker), then the worker-side rules.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from airflow_rover.core.spec import ResourcePlan

HOT_PS_RATIO = 2.0  # a PS using this many times the median PS CPU...
HOT_PS_BUSY = 0.85  # ...and at least this share of its own cores is hot
STRAGGLER_RATIO = 2.0  # a worker this many times slower than the median straggles
OOM_HORIZON_S = 600.0  # act when a PS would run out of memory within this horizon
OOM_HEADROOM = 1.25
OOM_MIN_SAMPLES = 10
OOM_GROWTH = 2.0  # a node killed out of memory comes back with this many times its memory


@dataclass(frozen=True)
class NodeProfile:
    node_id: str
    role: str  # "ps" or "worker"
    cpu_used: float  # cores, averaged over the last profiling interval
    memory_mb: float
    step_time_ms: float = 0.0  # workers
    memory_trend: tuple[tuple[float, float], ...] = ()  # (seconds, MB) samples, oldest first


@dataclass(frozen=True)
class JobProfile:
    plan: ResourcePlan
    nodes: tuple[NodeProfile, ...]
    max_workers: int = 32
    max_cpu: float = 8.0  # C_max: the largest node DLRover would ask for

    def role(self, role: str) -> list[NodeProfile]:
        return [n for n in self.nodes if n.role == role]


@dataclass(frozen=True)
class Proposal:
    plan: ResourcePlan
    rule: str
    reason: str
    nodes: tuple[str, ...] = field(default=())  # the nodes the rule is about


def hot_ps(profile: JobProfile) -> Proposal | None:
    """A PS far busier than the others (unbalanced parameters): give the hot one alone the
    cores it needs, ``min(s_hot / s_total * s_hat * w, C_max)`` (DLRover), s_hat = PS CPU per
    worker; the other PS keep their size."""
    ps = profile.role("ps")
    if len(ps) < 2:
        return None
    median = statistics.median(n.cpu_used for n in ps)
    hot = max(ps, key=lambda n: n.cpu_used)
    hot_cores = profile.plan.size_of(hot.node_id)[0]
    busy = hot.cpu_used >= HOT_PS_BUSY * hot_cores
    if not busy or hot.cpu_used < HOT_PS_RATIO * max(median, 1e-6):
        return None
    total = sum(n.cpu_used for n in ps)
    w = profile.plan.num_workers
    per_worker = total / w
    cores = min(hot.cpu_used / total * per_worker * w * HOT_PS_RATIO, profile.max_cpu)
    cores = max(cores, hot_cores * 2)  # at least double, or it is no fix
    cores = min(float(math.ceil(cores)), profile.max_cpu)
    if cores <= hot_cores:
        return None
    # The median PS may use no CPU at all (idle PS): say so rather than divide by zero.
    versus = f"{hot.cpu_used / median:.1f}x the median PS" if median > 0 else "the others idle"
    return Proposal(
        profile.plan.with_size(hot.node_id, cpu=cores),
        "hot_ps",
        f"{hot.node_id} uses {hot.cpu_used:.2f} cores, {versus}; "
        f"{hot.node_id} cores {hot_cores:g} -> {cores:g}, the other PS as they are",
        (hot.node_id,),
    )


def straggler(profile: JobProfile) -> Proposal | None:
    """A worker much slower than the median: the shard queue already gives it smaller slices;
    this rule names it so the plan's history says why (the plan itself is unchanged)."""
    workers = [n for n in profile.role("worker") if n.step_time_ms > 0]
    if len(workers) < 2:
        return None
    median = statistics.median(n.step_time_ms for n in workers)
    slow = [n for n in workers if n.step_time_ms > STRAGGLER_RATIO * median]
    if not slow:
        return None
    names = tuple(n.node_id for n in slow)
    return Proposal(
        profile.plan,
        "straggler",
        f"{', '.join(names)} step {max(n.step_time_ms for n in slow):.0f} ms against a median "
        f"of {median:.0f} ms: it gets smaller shard slices",
        names,
    )


def predicted_oom(profile: JobProfile) -> Proposal | None:
    """Fit each PS's memory growth (least squares over its samples); if one would cross its
    limit within ``OOM_HORIZON_S``, raise PS memory to what it needs then, with headroom."""
    limit = profile.plan.ps_memory_mb
    worst: tuple[float, NodeProfile, float] | None = None
    for node in profile.role("ps"):
        if len(node.memory_trend) < OOM_MIN_SAMPLES:
            continue
        # The recent slope: a PS grows fast while it creates rows for ids it has not seen and
        # slows as they repeat; the oldest samples would overstate the growth.
        t, mb = np.array(node.memory_trend[-OOM_MIN_SAMPLES:]).T
        slope, intercept = np.polyfit(t - t[-1], mb, 1)
        if slope <= 0:
            continue
        seconds_left = (limit - intercept) / slope
        if seconds_left < OOM_HORIZON_S and (worst is None or seconds_left < worst[0]):
            worst = (seconds_left, node, intercept + slope * OOM_HORIZON_S)
    if worst is None:
        return None
    seconds_left, node, needed = worst
    memory = int(math.ceil(needed * OOM_HEADROOM / 256.0) * 256)
    return Proposal(
        profile.plan.model_copy(update={"ps_memory_mb": max(memory, limit + 256)}),
        "predicted_oom",
        f"{node.node_id} grows to its {limit} MB limit in {max(seconds_left, 0):.0f} s; "
        f"PS memory {limit} -> {max(memory, limit + 256)} MB",
        (node.node_id,),
    )


def after_oom(plan: ResourcePlan, node_id: str, max_memory_mb: float) -> Proposal | None:
    """A node killed for using more memory than its size: that node alone, relaunched with
    ``OOM_GROWTH`` times the memory (at most ``max_memory_mb``); None when it cannot grow."""
    cpu, memory_mb = plan.size_of(node_id)
    grown = int(min(memory_mb * OOM_GROWTH, max_memory_mb))
    if grown <= memory_mb:
        return None
    return Proposal(
        plan.with_size(node_id, memory_mb=grown),
        "oom",
        f"{node_id} was killed out of memory at {memory_mb} MB: relaunched with {grown} MB "
        f"({cpu:g} cores as before)",
        (node_id,),
    )


def pending_pods(
    plan: ResourcePlan,
    waiting_s: Mapping[str, float],
    timeout_s: float,
    min_workers: int,
    low: Mapping[str, tuple[float, float]],
) -> Proposal | None:
    """Nodes the cluster has not scheduled for ``timeout_s``: a PS or a node sized apart from
    its role gets half its size, down to its role's size (a node sized apart) or its role's
    lower bound ``low[role]`` (cores, MB; memory is kept where the bound is 0: a PS's rows need
    it); else workers at their role's size are dropped, down to ``min_workers`` (the workers
    that stay are the lower-numbered ones: of one size, a slot freed is a slot for a waiting
    one). One change per plan: a size first, counts next time. None: nothing to shrink."""
    late = {
        node: seconds
        for node, seconds in sorted(waiting_s.items())
        if seconds >= timeout_s and node in plan.node_ids()
    }
    sized = {entry.node for entry in plan.sizes}
    for node, seconds in late.items():
        role = node.split("-")[0]
        if role != "ps" and node not in sized:
            continue
        cpu, memory_mb = plan.size_of(node)
        floor_cpu, floor_mb = plan.role_size(role) if node in sized else low.get(role, (0.0, 0.0))
        floor_mb = floor_mb or memory_mb  # no lower bound: the memory stays
        new_cpu = max(cpu / 2, floor_cpu) if floor_cpu < cpu else cpu
        new_mb = int(max(memory_mb // 2, floor_mb)) if floor_mb < memory_mb else memory_mb
        new_mb = max(new_mb, 256)
        if (new_cpu, new_mb) == (cpu, memory_mb):
            continue
        return Proposal(
            plan.with_size(node, cpu=new_cpu, memory_mb=new_mb),
            "pending",
            f"{node} not scheduled for {seconds:.0f} s (autoscale.pending_timeout_s="
            f"{timeout_s:g}): {node} {cpu:g} cores, {memory_mb} MB -> {new_cpu:g} cores, "
            f"{new_mb} MB",
            (node,),
        )
    workers = [node for node in late if node.startswith("worker-") and node not in sized]
    count = max(min_workers, plan.num_workers - len(workers))
    if not workers or count >= plan.num_workers:
        return None
    waits = ", ".join(f"{node} for {late[node]:.0f} s" for node in workers)
    return Proposal(
        plan.with_counts(num_workers=count),
        "pending",
        f"not scheduled: {waits} (autoscale.pending_timeout_s={timeout_s:g}): workers "
        f"{plan.num_workers} -> {count}",
        tuple(workers),
    )


Rule = Callable[[JobProfile], Proposal | None]
RULES: tuple[Rule, ...] = (predicted_oom, hot_ps, straggler)


def post_scaling(profile: JobProfile, rules: Sequence[Rule] = RULES) -> list[Proposal]:
    """Every rule's proposal, most urgent first (an OOM ends the job; a hot PS slows it all)."""
    return [p for rule in rules if (p := rule(profile)) is not None]
