"""airflow-rover in the simulator: the master's own ``Autoscaler`` behind the simulator's
``Policy`` protocol. Only the clock and the cluster are simulated: the reports of the simulated
nodes go in through ``Autoscaler.record`` and ``Autoscaler.propose`` as the master's profiler
and tick hand them in, and a proposal is applied at once, as the trigger applies it.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from airflow_rover.core.autoscale_prior import Prior
from airflow_rover.core.optimizer import ps_layout
from airflow_rover.core.plans import PlanRecord
from airflow_rover.core.spec import AutoscaleConfig, ResourcePlan
from airflow_rover.core.throughput import JobShape
from airflow_rover.master.autoscaler import Autoscaler, NodeSample
from bench._policies import Setting
from bench._simcore import REPORT_S, Config, JobView
from bench._world import World


def autoscale_config(setting: Setting) -> AutoscaleConfig:
    """The job's autoscale settings: the shipped defaults (interval, sampling, cooldown) within
    the world's bounds and budget."""
    bounds = setting.bounds
    return AutoscaleConfig(
        max_workers=bounds.max_workers,
        max_ps=bounds.max_ps,
        min_worker_cpu=min(bounds.worker_cpus),
        max_worker_cpu=max(bounds.worker_cpus),
        min_ps_cpu=min(bounds.ps_cpus),
        max_ps_cpu=max(bounds.ps_cpus),
        cpu_budget=setting.budget,
    )


def plan_of(cfg: Config, like: ResourcePlan | None = None) -> ResourcePlan:
    """``cfg`` as the master's plan: PS at the smallest PS's size, bigger ones sized apart."""
    role = min(cfg.ps_cpu)
    plan = (like or ResourcePlan()).model_copy(
        update={
            "num_workers": cfg.workers,
            "num_ps": cfg.num_ps,
            "worker_cpu": cfg.worker_cpu,
            "ps_cpu": role,
            "sizes": (),
        }
    )
    for j, cores in enumerate(cfg.ps_cpu):
        if cores != role:
            plan = plan.with_size(f"ps-{j}", cpu=cores)
    return plan


def config_of(plan: ResourcePlan) -> Config:
    ps = tuple(plan.size_of(f"ps-{j}")[0] for j in range(plan.num_ps))
    return Config(plan.num_workers, plan.worker_cpu, ps)


@dataclass
class MasterAutoscaler:
    """The master's autoscaler on simulated time."""

    name: str
    world: World
    setting: Setting
    start: ResourcePlan
    prior: Prior | None = None
    autoscaler: Autoscaler = field(init=False)
    applied: list[PlanRecord] = field(default_factory=list)
    _seen: int = 0
    _stable_since: float | None = None
    _ps_change_at: float | None = None

    def __post_init__(self) -> None:
        shape = JobShape.sized(self.world.batch_size, self.world.embedding_dim)
        self.autoscaler = Autoscaler(
            autoscale_config(self.setting),
            shape,
            self.setting.budget,
            start=self.start,
            now=0.0,
            prior=self.prior,
            resizable=self.world.resizable,
            host_cores=self.world.host_cores,
        )

    def initial(self) -> Config:
        return config_of(self.start)

    def next_check_s(self) -> float:
        return self.autoscaler.config.interval_s

    def decide(self, view: JobView) -> Config | None:
        scaler, plan = self.autoscaler, plan_of(view.config, self.start)
        if view.stable_since != self._stable_since:  # a change is over: its workers all run
            self._stable_since = view.stable_since
            if self._ps_change_at is not None:  # the master applies a PS resize at its end
                scaler.ps_resized(view.paused_s)
                scaler.applied(view.stable_since, ps_changed=True)
                self._ps_change_at = None
            scaler.plan_changed(view.stable_since)
        for report in view.reports[self._seen :]:
            if report.config == view.config and report.t > view.stable_since:
                samples = report.steps_per_s * self.world.batch_size
                scaler.record(report.t, plan, samples, [report.iteration_s * 1000.0])
        self._seen = len(view.reports)
        nodes, steps = self._profile(view)
        remaining = view.remaining * self.world.batch_size
        record = scaler.propose(view.now, plan, nodes, steps, remaining)
        if record is None or record.plan == plan:
            return None
        record.mark_applied(view.now)
        self.applied.append(record)
        if ps_layout(record.plan) != ps_layout(plan):
            self._ps_change_at = view.now
        else:
            scaler.applied(view.now)
        return config_of(record.plan)

    def _profile(self, view: JobView) -> tuple[dict[str, NodeSample], dict[str, float]]:
        """What the master's profiler would hold: each node's CPU over the last reports."""
        interval = self.autoscaler.config.interval_s
        recent = view.recent(max(1, int(interval / REPORT_S)))
        if not recent:
            return {}, {}
        cfg = view.config
        ps_cpu = collections.defaultdict(list)
        for r in recent:
            for j, used in enumerate(r.ps_cpu_used):
                ps_cpu[j].append(used)
        worker_cpu = sum(r.worker_cpu_used for r in recent) / len(recent)
        step_ms = 1000.0 * sum(r.iteration_s for r in recent) / len(recent)
        nodes = {f"ps-{j}": NodeSample("ps", sum(v) / len(v)) for j, v in ps_cpu.items()}
        nodes |= {f"worker-{i}": NodeSample("worker", worker_cpu) for i in range(cfg.workers)}
        return nodes, {f"worker-{i}": step_ms for i in range(cfg.workers)}
