"""The master's side of the resource optimizer: profile the nodes, propose plans with reasons.

Every ``autoscale.interval_s`` the master samples each node's CPU and memory (psutil, through
the launcher's pids) and the job's throughput and step times. Once a plan has run for
``sampling_s``, the autoscaler asks the runtime rules (predicted OOM, hot PS, stragglers:
``core.post_scaling``), then the throughput model (``core.throughput``) for a better plan. The
model exists from the first observation: NNLS over the iteration times seen so far, pulled
towards a prior (the coefficients of similar past jobs when warm-started, else the paper's
scaled to the first observation), and NSGA-II (``core.optimizer``) searches node counts and,
where the launcher resizes nodes, node sizes. What a change costs (new workers starting, a PS
resize's pause) is what this job, or similar past jobs, measured.

A proposal is only proposed: the trigger applies it (``POST /plans/{id}/apply``), so Airflow
stays in charge. Every plan it proposes, and every plan asked for, lies within the job's
autoscale bounds (``core.plan_limits``). The clock is the caller's, so the simulator
(``bench/simulator.py``) drives this very class.
"""

from __future__ import annotations

import collections
import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import psutil

from airflow_rover.core.autoscale_prior import PRIOR_WEIGHT, Prior
from airflow_rover.core.host_bound import HostBound, HostUse
from airflow_rover.core.optimizer import (
    PlanBounds,
    ScalingCosts,
    choose_plan,
    pareto_plans,
    throughput_gain,
)
from airflow_rover.core.plan_limits import plan_limits
from airflow_rover.core.plans import PlanRecord, PlanState, pending_plan
from airflow_rover.core.post_scaling import JobProfile, NodeProfile, Proposal, post_scaling
from airflow_rover.core.spec import AutoscaleConfig, ResourcePlan
from airflow_rover.core.throughput import BusyShare, Coefficients, JobShape, ThroughputModel

log = logging.getLogger(__name__)

MEMORY_TREND_SAMPLES = 30
HOST_USE_SAMPLES = 60  # the busy cores a plan showed: its last samples
REPORTED_SAMPLES = 200  # the status's (and so the history store's) last throughput samples
PLAN_SAMPLES = 360  # a plan's step times the model takes the median of: its last hour's
IDLE_PS_SHARE = 0.3  # a PS busy under this share of its cores idles
MIN_MODEL_GAIN = 0.03  # a model-based plan must promise at least 3% more samples/s
GAIN_TOLERANCE = 0.01  # plans within 1% of the best gain count as the best: take the cheapest
SEARCH_GENERATIONS = 40
SEARCH_POPULATION = 40
CPU_SIZES = (0.5, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0)  # node sizes the search tries
# may replace a proposal the trigger has not applied, and none replaces them
URGENT_RULES = frozenset({"predicted_oom", "pending"})


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
        *,
        now: float | None = None,
        prior: Prior | None = None,
        resizable: bool = False,
        host_cores: float | None = None,
    ) -> None:
        self.config = config
        self.prior = prior or Prior()
        self.shape = replace(shape, hot_share=self.prior.hot_share)
        self.resizable = resizable  # whether the launcher resizes nodes: the search tries sizes
        self.host_cores = host_cores  # the cores all nodes share on one host; None: their own
        self._host_use: dict[ResourcePlan, collections.deque[tuple[float, float]]] = (
            collections.defaultdict(lambda: collections.deque(maxlen=HOST_USE_SAMPLES))
        )
        self._busy: dict[ResourcePlan, collections.deque[tuple[float, float]]] = (
            collections.defaultdict(lambda: collections.deque(maxlen=HOST_USE_SAMPLES))
        )
        # each plan's recent step times (ms) and how many samples it had: the model's rows
        self._step_ms: dict[ResourcePlan, collections.deque[float]] = collections.defaultdict(
            lambda: collections.deque(maxlen=PLAN_SAMPLES)
        )
        self._seen: collections.Counter[ResourcePlan] = collections.Counter()
        # the bounds, resolved against the plan the job started with (``start``)
        self.limits = plan_limits(config, start or ResourcePlan())
        # the budget: the job's own, else what the launcher can host (a machine's cores)
        self.cpu_budget = config.cpu_budget if config.cpu_budget is not None else capacity_cpu
        self.plans: list[PlanRecord] = []
        self.throughput: list[dict[str, Any]] = []
        self._plan_since = time.time() if now is None else now
        self._last_change = -math.inf
        self._last_decline = -math.inf
        self._change: tuple[float, bool] | None = None  # (applied at, PS changed) being timed
        self._search: tuple[tuple[Any, ...], Proposal | None] | None = None  # the last search
        self.measured: dict[str, list[float]] = {"worker_start_s": [], "ps_reload_s": []}
        self.hot_share_learned = False  # from this job's own PS profile, not the prior's

    def plan_changed(self, now: float) -> None:
        """The plan's workers are (re)starting: sample it afresh from now."""
        self._plan_since = now

    def applied(self, now: float, ps_changed: bool = False) -> None:
        """A plan was applied: its workers (re)start from now; timed until they all run."""
        self._last_change = now
        self._change = (now, ps_changed)
        self.plan_changed(now)

    def ps_resized(self, pause_s: float) -> None:
        """A PS resize held training for ``pause_s`` while the rows moved."""
        self.measured["ps_reload_s"].append(pause_s)

    def costs(self) -> ScalingCosts:
        """Seconds a change costs: the median of what this job measured, else what similar
        past jobs measured, else the defaults."""
        known = self.prior.costs or ScalingCosts()
        worker = self.measured["worker_start_s"]
        reload = self.measured["ps_reload_s"]
        return ScalingCosts(
            worker_start_s=statistics.median(worker) if worker else known.worker_start_s,
            ps_start_s=statistics.median(worker) if worker else known.ps_start_s,
            ps_reload_s=statistics.median(reload) if reload else known.ps_reload_s,
        )

    def measured_by_job(self) -> dict[str, float]:
        """What this job measured itself (the history keeps it for similar jobs' priors):
        the scaling costs it timed and the hot share its PS showed; nothing it assumed."""
        costs = asdict(self.costs())
        found = {
            "worker_start_s": bool(self.measured["worker_start_s"]),
            "ps_start_s": bool(self.measured["worker_start_s"]),
            "ps_reload_s": bool(self.measured["ps_reload_s"]),
        }
        out = {name: round(costs[name], 1) for name, timed in found.items() if timed}
        if self.hot_share_learned:
            out["hot_share"] = round(self.shape.hot_share, 3)
        return out

    def _time_change(self) -> None:
        """The plan's workers all run since ``_plan_since``: that is when the change ended."""
        if self._change is not None:
            at, ps_changed = self._change
            if not ps_changed:
                self.measured["worker_start_s"].append(max(0.0, self._plan_since - at))
            self._change = None

    def declined(self, now: float) -> None:
        """A person declined a proposal: ``decline_cooldown_s`` before the next one."""
        self._last_decline = now

    def record(
        self, now: float, plan: ResourcePlan, samples_per_second: float, step_times: list[float]
    ) -> None:
        """A throughput sample, kept only once the plan has run for its sampling period."""
        if now - self._plan_since < self.config.sampling_s or not step_times:
            return
        self._time_change()
        step_ms = round(statistics.mean(step_times), 3)
        sample = {
            "at": now,
            "plan": plan.model_dump(),
            "samples_per_second": round(samples_per_second, 1),
            "step_time_ms": step_ms,
        }
        if (busy := self._busy_shares(plan)) is not None:  # the history's prior fits them too
            sample["worker_busy"], sample["ps_busy"] = round(busy[0], 4), round(busy[1], 4)
        self.throughput.append(sample)
        self._step_ms[plan].append(step_ms)
        self._seen[plan] += 1

    def pending(self) -> PlanRecord | None:
        return pending_plan(self.plans)

    def propose(
        self,
        now: float,
        plan: ResourcePlan,
        nodes: Mapping[str, NodeSample],
        step_times: Mapping[str, float],
        remaining_samples: float,
    ) -> PlanRecord | None:
        """A new proposal, or None (too early, one is already waiting, or nothing to gain)."""
        cfg = self.config
        waiting = self.pending()
        if not cfg.enabled or now - self._plan_since < cfg.sampling_s:
            return None
        self._learn_host_use(plan, nodes, step_times)
        self._learn_busy(plan, nodes)
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
                for node_id, sample in nodes.items()
                if sample.role in ("ps", "worker")
            ),
            max_workers=int(self.limits.high("num_workers")),
            max_cpu=self.limits.high("ps_cpu"),
        )
        self._learn_hot_share(nodes)
        if waiting is not None:  # only an urgent rule may replace a proposal still waiting
            choice = self._from_rules(profile, only=URGENT_RULES)
            if choice is None:
                return None
            waiting.supersede(f"replaced by the urgent {choice.rule} rule")
        else:
            choice = (
                self._from_rules(profile)
                or self._probe_fewer_ps(plan, nodes)
                or self._from_model(plan, remaining_samples)
            )
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

    def propose_now(self, now: float, plan: ResourcePlan, proposal: Proposal) -> PlanRecord | None:
        """An urgent rule's proposal, outside the sampling and cooldowns (a pod that cannot
        be scheduled is no sample): it replaces a waiting proposal of another rule; None when
        one of its rule waits already or a person declined it for this plan."""
        waiting = self.pending()
        if waiting is not None and waiting.rule == proposal.rule:
            return None
        if proposal.rule in self._declined(plan):
            return None
        if waiting is not None:
            waiting.supersede(f"replaced by the urgent {proposal.rule} rule")
        record = self._record(now, plan, proposal.plan, proposal.rule, proposal.reason)
        self.plans.append(record)
        log.info("proposed plan %d (%s): %s", record.id, proposal.rule, proposal.reason)
        return record

    def master_applied(self, now: float, plan: ResourcePlan, proposal: Proposal) -> PlanRecord:
        """A plan the master applied at once (a node relaunched bigger after an OOM, a
        pending pod made smaller): recorded with its rule; a proposal still waiting was made
        for the plan before it and is superseded."""
        waiting = self.pending()
        if waiting is not None:
            waiting.supersede(f"replaced by the {proposal.rule} rule")
        record = self._record(now, plan, proposal.plan, proposal.rule, proposal.reason)
        record.mark_applied(now, f"applied by the master: {', '.join(proposal.nodes)}")
        self.plans.append(record)
        self.plan_changed(now)
        log.warning("plan %d (%s) applied: %s", record.id, proposal.rule, proposal.reason)
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

    def _probe_fewer_ps(
        self, plan: ResourcePlan, nodes: Mapping[str, NodeSample]
    ) -> Proposal | None:
        """On a shared host, one PS fewer once while every PS idles: a PS is a process on the
        job's own cores, and what it adds to each step shows only once two PS counts ran (the
        model's equation cannot say a PS fewer is faster). The data decide from there."""
        if self.host_cores is None or plan.num_ps <= self.limits.low("num_ps"):
            return None
        if "shared_host_ps" in self._declined(plan):
            return None
        busy = {n: s.cpu_used for n, s in nodes.items() if s.role == "ps" and n.startswith("ps-")}
        if len(busy) < plan.num_ps or any(
            used > IDLE_PS_SHARE * plan.size_of(node)[0] for node, used in busy.items()
        ):
            return None
        if any(ran.num_ps < plan.num_ps for ran in self._host_use):
            return None
        fewer = plan.with_counts(num_ps=plan.num_ps - 1)
        if not self._fits(fewer):
            return None
        return Proposal(
            fewer,
            "shared_host_ps",
            f"every PS at most {max(busy.values()):.2f} cores busy on a shared host: "
            f"{plan.num_ps} -> {fewer.num_ps} PS, to learn what a PS adds to each step",
        )

    def _within_budget(self, plan: ResourcePlan, current: ResourcePlan) -> ResourcePlan | None:
        """``plan``, or as many more workers as the budget allows; None if nothing changes."""
        while plan.num_workers > current.num_workers and not self._fits(plan):
            plan = plan.with_counts(num_workers=plan.num_workers - 1)
        return plan if plan != current and self._fits(plan) else None

    def model(self) -> ThroughputModel | None:
        """The throughput model fitted on the median iteration time seen under each plan,
        pulled towards the prior; None before the first observation."""
        if not self._step_ms:
            return None
        observations = [(p, statistics.median(ms) / 1000.0) for p, ms in self._step_ms.items()]
        prior = self.prior.coefficients
        if prior is None:  # cold: the paper's proportions at the first plan's speed
            prior = Coefficients.paper().scaled_to(self.shape, *observations[0])
        busy = [
            BusyShare(p, seconds, *shares)
            for p, seconds in observations
            if (shares := self._busy_shares(p)) is not None
        ]
        model = ThroughputModel.fit(self.shape, observations, prior, PRIOR_WEIGHT, busy)
        return replace(model, host=self.host_bound())

    def host_bound(self) -> HostBound | None:
        """What the shared host's cores allow, from what each plan kept busy; None where
        the nodes have their own cores or before a plan was profiled."""
        if self.host_cores is None or not self._host_use:
            return None
        uses = [
            HostUse(
                plan,
                statistics.median(busy for busy, _ in seen),
                statistics.median(cost for _, cost in seen),
            )
            for plan, seen in self._host_use.items()
        ]
        return HostBound.fit(self.host_cores, uses)

    def _busy_shares(self, plan: ResourcePlan) -> tuple[float, float] | None:
        """The median busy shares (workers', busiest PS's) profiled under ``plan``."""
        seen = self._busy.get(plan)
        if not seen:
            return None
        return statistics.median(w for w, _ in seen), statistics.median(ps for _, ps in seen)

    def _learn_busy(self, plan: ResourcePlan, nodes: Mapping[str, NodeSample]) -> None:
        """The share of their cores the workers (on average) and the busiest PS kept busy."""
        shares: dict[str, list[float]] = {"ps": [], "worker": []}
        in_plan = set(plan.node_ids())
        for node, sample in nodes.items():
            if sample.role in shares and node in in_plan:
                shares[sample.role].append(sample.cpu_used / plan.size_of(node)[0])
        if shares["ps"] and shares["worker"]:
            self._busy[plan].append((statistics.mean(shares["worker"]), max(shares["ps"])))

    def _learn_host_use(
        self, plan: ResourcePlan, nodes: Mapping[str, NodeSample], step_times: Mapping[str, float]
    ) -> None:
        """The job's busy cores and core-seconds per global step under ``plan`` (kept only
        where the nodes share a host)."""
        if self.host_cores is None:
            return
        busy = sum(s.cpu_used for s in nodes.values() if s.role in ("ps", "worker"))
        times = [ms for node, ms in step_times.items() if ms > 0 and node in nodes]
        if busy <= 0 or not times:
            return
        steps_per_s = plan.num_workers / (statistics.median(times) / 1000.0)
        self._host_use[plan].append((busy, busy / steps_per_s))

    def _expected_gain(
        self, plan: ResourcePlan, new: ResourcePlan, remaining_samples: float
    ) -> float | None:
        """Samples/s the change gains over the rest of the job by the fitted model (counting
        the change's cost); None without a model."""
        model = self.model()
        if model is None:
            return None
        return throughput_gain(model, plan, new, remaining_samples, self.costs())

    def bounds(self, plan: ResourcePlan) -> PlanBounds:
        """The plans the search spans: counts within the autoscale bounds; sizes too where the
        launcher resizes nodes, else today's."""
        lim = self.limits
        return PlanBounds(
            max_workers=int(lim.high("num_workers")),
            max_ps=int(lim.high("num_ps")),
            worker_cpus=self._sizes("worker_cpu", plan.worker_cpu),
            ps_cpus=self._sizes("ps_cpu", plan.ps_cpu),
            min_workers=int(lim.low("num_workers")),
            min_ps=int(lim.low("num_ps")),
            hot_ps=self.shape.hot_ps if self.resizable and self.shape.hot_share > 0 else None,
        )

    def _sizes(self, field_name: str, current: float) -> tuple[float, ...]:
        if not self.resizable:
            return (current,)
        low, high = self.limits.low(field_name), self.limits.high(field_name)
        if self.cpu_budget is not None:
            high = min(high, self.cpu_budget)
        return tuple(sorted({c for c in CPU_SIZES if low <= c <= high} | {current}))

    def _from_model(self, plan: ResourcePlan, remaining_samples: float) -> Proposal | None:
        """The plan of the Pareto front that gains nearly the most, cheapest first. The search
        is redone when the plan, what the model knows of it (the samples under it, each
        time they double), the hot PS, the costs or the job's size left (each time it halves)
        changed: NSGA-II need not run every interval to say the same again."""
        model = self.model()
        if model is None or "pareto" in self._declined(plan) or not self.limits.admits(plan):
            return None
        key = (
            plan,
            self._seen[plan].bit_length(),
            self._hot_key(model.shape),
            tuple(round(c / 10) for c in asdict(self.costs()).values()),
            round(math.log2(max(remaining_samples, 1.0))),
        )
        if self._search is None or self._search[0] != key:
            self._search = (key, self._search_model(model, plan, remaining_samples))
        return self._search[1]

    @staticmethod
    def _hot_key(shape: JobShape) -> tuple[float, int | None]:
        """The hot share to a tenth (the profile's noise moves the estimate in the second
        decimal) and, if there is one, which PS holds it."""
        share = round(shape.hot_share, 1)
        return share, shape.hot_ps if share > 0 else None

    def _search_model(
        self, model: ThroughputModel, plan: ResourcePlan, remaining_samples: float
    ) -> Proposal | None:
        candidates = [
            c
            for c in pareto_plans(
                model,
                plan,
                remaining_samples,
                self.bounds(plan),
                costs=self.costs(),
                seed=len(self.plans),
                generations=SEARCH_GENERATIONS,
                population=SEARCH_POPULATION,
            )
            if self._fits(c.plan)
        ]
        now = model.throughput(plan)
        best = choose_plan(candidates, plan, now, MIN_MODEL_GAIN, GAIN_TOLERANCE)
        if best is None:
            return None
        return Proposal(
            best.plan,
            "pareto",
            f"fitted model: {now:.0f} -> {model.throughput(best.plan):.0f} samples/s for cost "
            f"{best.cost:.1f} (Pareto point {candidates.index(best) + 1} of {len(candidates)})",
        )

    def _learn_hot_share(self, nodes: Mapping[str, NodeSample]) -> None:
        """How much PS load one PS keeps however many there are, and which PS, from the PS
        CPU profile (with one PS it cannot tell: the prior's share stays)."""
        loads = {n: s.cpu_used for n, s in nodes.items() if s.role == "ps" and n.startswith("ps-")}
        if len(loads) >= 2:
            hot = max(loads, key=lambda n: loads[n])
            share = JobShape.hot_share_from(list(loads.values()))
            self.shape = replace(self.shape, hot_share=share, hot_ps=int(hot.split("-")[1]))
            self.hot_share_learned = True

    def settings(self) -> dict[str, Any]:
        """On or off, the resolved bounds and the job's weight in a shared budget."""
        return {
            "enabled": self.config.enabled,
            "weight": self.config.weight,
            **self.limits.as_dict(),
        }

    def report(self, profiler: Profiler) -> dict[str, Any]:
        return {
            "throughput": self.throughput[-REPORTED_SAMPLES:],
            "scaling_costs": {k: round(v, 1) for k, v in asdict(self.costs()).items()},
            "hot_share": round(self.shape.hot_share, 3),
            "measured": self.measured_by_job(),
            "host_bound": _host_report(self.host_bound()),
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


def _host_report(bound: HostBound | None) -> dict[str, float] | None:
    if bound is None:
        return None
    return {
        "cores": round(bound.cores, 2),
        "step_base_core_s": round(bound.step_base, 5),
        "step_per_ps_core_s": round(bound.step_per_ps, 5),
    }
