"""The master's side of the resource optimizer: profile the nodes, propose plans with reasons.

Every ``autoscale.interval_s`` the master samples each node's CPU and memory (psutil, through
the launcher's pids) and the job's throughput and step times. Once a plan has run for
``sampling_s``, the autoscaler asks the post-scaling rules (hot PS, idle PS, predicted OOM:
``core.post_scaling``) and, when the job has run under at least two plans, the fitted
throughput model and its Pareto candidates (``core.optimizer``) for a better plan. A proposal is
only proposed: the trigger applies it (``POST /plans/{id}/apply``), so Airflow stays in charge.
Every plan it proposes, and every plan asked for, lies within the job's autoscale bounds
(``core.plan_limits``): a rule's plan is moved into them, the Pareto search spans only them.
"""

from __future__ import annotations

import collections
import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import psutil

from airflow_rover.core.optimizer import (
    PlanBounds,
    ScalingCosts,
    best_plan,
    pareto_plans,
    throughput_gain,
)
from airflow_rover.core.plan_limits import plan_limits
from airflow_rover.core.plans import PlanRecord, PlanState, pending_plan
from airflow_rover.core.post_scaling import JobProfile, NodeProfile, Proposal, post_scaling
from airflow_rover.core.spec import AutoscaleConfig, ResourcePlan
from airflow_rover.core.throughput import JobShape, ThroughputModel

log = logging.getLogger(__name__)

MEMORY_TREND_SAMPLES = 30
MIN_MODEL_GAIN = 0.10  # a model-based plan must promise at least 10% more samples/s
URGENT_RULES = frozenset({"predicted_oom"})  # may replace a proposal the trigger has not applied


@dataclass
class NodeSample:
    role: str
    cpu_used: float = 0.0
    memory_mb: float = 0.0
    peak_memory_mb: float = 0.0
    trend: collections.deque[tuple[float, float]] = field(
        default_factory=lambda: collections.deque(maxlen=MEMORY_TREND_SAMPLES)
    )


class Profiler:
    """CPU (cores) and resident memory of each node process, sampled by pid."""

    def __init__(self, pid_of: Callable[[str], int | None]) -> None:
        self._pid_of = pid_of
        self._procs: dict[str, psutil.Process] = {}
        self.nodes: dict[str, NodeSample] = {}

    def sample(self, roles: Mapping[str, str], now: float) -> None:
        for node_id, role in roles.items():
            pid = self._pid_of(node_id)
            if pid is None:
                continue
            proc = self._procs.get(node_id)
            if proc is None or proc.pid != pid:
                try:
                    proc = psutil.Process(pid)
                    proc.cpu_percent(None)  # the first reading is meaningless: prime it
                except psutil.Error:
                    continue
                self._procs[node_id] = proc
                self.nodes[node_id] = NodeSample(role)
                continue
            try:
                cpu = proc.cpu_percent(None) / 100.0
                rss = proc.memory_info().rss / 2**20
            except psutil.Error:
                continue
            node = self.nodes[node_id]
            node.cpu_used, node.memory_mb = cpu, rss
            node.peak_memory_mb = max(node.peak_memory_mb, rss)
            node.trend.append((now, rss))


class Autoscaler:
    """Proposals for one job, each with the rule or Pareto point behind it."""

    def __init__(
        self,
        config: AutoscaleConfig,
        shape: JobShape,
        capacity_cpu: float | None = None,
        start: ResourcePlan | None = None,
    ) -> None:
        self.config = config
        self.shape = shape
        # the bounds, resolved against the plan the job started with (``start``)
        self.limits = plan_limits(config, start or ResourcePlan())
        # the budget: the job's own, else what the launcher can host (a machine's cores)
        self.cpu_budget = config.cpu_budget if config.cpu_budget is not None else capacity_cpu
        self.plans: list[PlanRecord] = []
        self.throughput: list[dict[str, Any]] = []
        self._plan_since = time.time()
        self._last_change = 0.0
        self._last_decline = -math.inf
        self.profiler_nodes: dict[str, NodeSample] = {}

    def plan_changed(self, now: float) -> None:
        """The plan's workers are (re)starting: sample it afresh from now."""
        self._plan_since = now

    def applied(self, now: float) -> None:
        self._last_change = now
        self.plan_changed(now)

    def declined(self, now: float) -> None:
        """A person declined a proposal: ``decline_cooldown_s`` before the next one."""
        self._last_decline = now

    def record(
        self, now: float, plan: ResourcePlan, samples_per_second: float, step_times: list[float]
    ) -> None:
        """A throughput sample, kept only once the plan has run for its sampling period."""
        if now - self._plan_since < self.config.sampling_s or not step_times:
            return
        self.throughput.append(
            {
                "at": now,
                "plan": plan.model_dump(),
                "samples_per_second": round(samples_per_second, 1),
                "step_time_ms": round(statistics.mean(step_times), 3),
            }
        )

    def pending(self) -> PlanRecord | None:
        return pending_plan(self.plans)

    def propose(
        self,
        now: float,
        plan: ResourcePlan,
        profiler: Profiler,
        step_times: dict[str, float],
        remaining_samples: float,
    ) -> PlanRecord | None:
        """A new proposal, or None (too early, one is already waiting, or nothing to gain)."""
        cfg = self.config
        waiting = self.pending()
        if not cfg.enabled or now - self._plan_since < cfg.sampling_s:
            return None
        if waiting is None and now - self._last_change < cfg.min_plan_interval_s:
            return None
        if waiting is None and now - self._last_decline < cfg.decline_cooldown_s:
            return None
        if waiting is not None and waiting.rule in URGENT_RULES:
            return None  # an urgent proposal waits for the trigger: nothing replaces it
        profile = JobProfile(
            plan=plan,
            nodes=tuple(
                NodeProfile(
                    node_id=node_id,
                    role=sample.role,
                    cpu_used=sample.cpu_used,
                    memory_mb=sample.memory_mb,
                    step_time_ms=step_times.get(node_id, 0.0),
                    memory_trend=tuple(sample.trend),
                )
                for node_id, sample in profiler.nodes.items()
                if sample.role in ("ps", "worker")
            ),
            max_workers=int(self.limits.high("num_workers")),
            max_cpu=self.limits.high("ps_cpu"),
        )
        self.profiler_nodes = profiler.nodes
        if waiting is not None:  # only an urgent rule may replace a proposal still waiting
            choice = self._from_rules(profile, only=URGENT_RULES)
            if choice is None:
                return None
            waiting.supersede(f"replaced by the urgent {choice.rule} rule")
        else:
            choice = self._from_rules(profile) or self._from_model(plan, remaining_samples)
        if choice is None:
            return None
        gain = self._expected_gain(plan, choice.plan, remaining_samples)
        record = self._record(now, plan, choice.plan, choice.rule, choice.reason)
        if gain is not None:  # the cluster arbiter ranks scale-ups by it
            record.expected_gain = round(gain, 1)
        self.plans.append(record)
        log.info("proposed plan %d (%s): %s", record.id, choice.rule, choice.reason)
        return record

    def _record(
        self, now: float, plan: ResourcePlan, new: ResourcePlan, rule: str, reason: str
    ) -> PlanRecord:
        return PlanRecord(
            id=len(self.plans) + 1, at=now, plan=new, previous=plan, rule=rule, reason=reason
        )

    def request(self, now: float, plan: ResourcePlan, new: ResourcePlan, reason: str) -> PlanRecord:
        """A plan asked for from outside: proposed at once (the trigger applies it like any
        other), replacing a proposal still waiting. ValueError for a plan outside the bounds."""
        outside = self.limits.outside(new)
        if outside:
            raise ValueError(f"the requested plan lies outside the bounds: {'; '.join(outside)}")
        waiting = self.pending()
        if waiting is not None:
            waiting.supersede("replaced by a requested plan")
        record = self._record(now, plan, new, "requested", reason)
        self.plans.append(record)
        log.info("plan %d requested: %s", record.id, reason)
        return record

    def _fits(self, plan: ResourcePlan) -> bool:
        within = self.cpu_budget is None or plan.total_cores <= self.cpu_budget
        return self.limits.admits(plan) and within

    def _declined(self, plan: ResourcePlan) -> set[str]:
        """Rules whose proposal for this very plan was declined: not proposed again."""
        return {
            str(p.rule) for p in self.plans if p.state == PlanState.DECLINED and p.previous == plan
        }

    def _from_rules(
        self, profile: JobProfile, only: frozenset[str] | None = None
    ) -> Proposal | None:
        declined = self._declined(profile.plan)
        for proposal in post_scaling(profile):
            if proposal.rule in declined or (only is not None and proposal.rule not in only):
                continue
            bounded = self.limits.toward(profile.plan, proposal.plan)
            plan = self._within_budget(bounded, profile.plan)
            if plan is not None:
                reason = proposal.reason + _clamped(proposal.plan, bounded)
                if plan != bounded:
                    reason += f"; {plan.num_workers} workers fit autoscale.cpu_budget"
                return Proposal(plan, proposal.rule, reason, proposal.nodes)
        return None

    def _within_budget(self, plan: ResourcePlan, current: ResourcePlan) -> ResourcePlan | None:
        """``plan``, or as many more workers as the budget allows; None if nothing changes."""
        while plan.num_workers > current.num_workers and not self._fits(plan):
            plan = plan.with_counts(num_workers=plan.num_workers - 1)
        return plan if plan != current and self._fits(plan) else None

    def _model(self, plan: ResourcePlan) -> ThroughputModel | None:
        """The throughput model fitted on the iteration times seen under each plan; None until
        the job has run two distinct plans (one cannot tell the terms apart) or today's."""
        by_plan: dict[ResourcePlan, list[float]] = collections.defaultdict(list)
        for sample in self.throughput:
            by_plan[ResourcePlan.model_validate(sample["plan"])].append(sample["step_time_ms"])
        if len(by_plan) < 2 or plan not in by_plan:
            return None
        observations = [(p, statistics.median(ms) / 1000.0) for p, ms in by_plan.items()]
        self._learn_hot_share()
        return ThroughputModel.fit(self.shape, observations)

    def _expected_gain(
        self, plan: ResourcePlan, new: ResourcePlan, remaining_samples: float
    ) -> float | None:
        """Samples/s the change gains over the rest of the job by the fitted model (counting
        the change's cost); None without a model."""
        model = self._model(plan)
        if model is None:
            return None
        return throughput_gain(model, plan, new, remaining_samples, ScalingCosts())

    def _from_model(self, plan: ResourcePlan, remaining_samples: float) -> Proposal | None:
        """The most efficient Pareto plan of the fitted model, at today's node sizes."""
        model = self._model(plan)
        if model is None:
            return None
        if plan.worker_cpu != plan.ps_cpu:
            return None  # node sizes are not resized here: counts only, at today's size
        if not self.limits.admits(plan):
            return None  # sizes outside the bounds: the Pareto search keeps today's sizes
        bounds = PlanBounds(
            max_workers=int(self.limits.high("num_workers")),
            max_ps=int(self.limits.high("num_ps")),
            cpu_choices=(plan.worker_cpu,),
            min_workers=int(self.limits.low("num_workers")),
            min_ps=int(self.limits.low("num_ps")),
        )
        candidates = [
            c for c in pareto_plans(model, plan, remaining_samples, bounds) if self._fits(c.plan)
        ]
        best = best_plan(candidates, plan, MIN_MODEL_GAIN * model.throughput(plan))
        if best is None or "pareto" in self._declined(plan):
            return None
        return Proposal(
            best.plan,
            "pareto",
            f"fitted model: {model.throughput(plan):.0f} -> "
            f"{model.throughput(best.plan):.0f} samples/s for cost {best.cost:.1f} "
            f"(Pareto point {candidates.index(best) + 1} of {len(candidates)})",
        )

    def _learn_hot_share(self) -> None:
        """How much PS load one PS keeps however many there are, from the PS CPU profile."""
        loads = [s.cpu_used for s in self.profiler_nodes.values() if s.role == "ps"]
        self.shape = replace(self.shape, hot_share=JobShape.hot_share_from(loads))

    def settings(self) -> dict[str, Any]:
        """On or off, the resolved bounds and the job's weight in a shared budget."""
        return {
            "enabled": self.config.enabled,
            "weight": self.config.weight,
            **self.limits.as_dict(),
        }

    def report(self, profiler: Profiler) -> dict[str, Any]:
        return {
            "throughput": self.throughput[-200:],
            "peak_memory_mb": {n: round(s.peak_memory_mb, 1) for n, s in profiler.nodes.items()},
            "cpu_used": {n: round(s.cpu_used, 3) for n, s in profiler.nodes.items()},
        }


def _clamped(asked: ResourcePlan, bounded: ResourcePlan) -> str:
    """What moving a rule's plan into the autoscale bounds changed, for the plan's reason."""
    changed = [
        f"{name} {getattr(asked, name):g} -> {getattr(bounded, name):g}"
        for name in ResourcePlan.model_fields
        if name != "sizes" and getattr(asked, name) != getattr(bounded, name)
    ]
    changed += [
        f"{node} {asked.size_of(node)} -> {bounded.size_of(node)} (cores, MB)"
        for node in bounded.node_ids()
        if node in asked.node_ids() and asked.size_of(node) != bounded.size_of(node)
    ]
    return f"; within the autoscale bounds: {', '.join(changed)}" if changed else ""
