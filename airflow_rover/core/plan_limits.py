"""The plans a job may have: ``AutoscaleConfig``'s bounds resolved against its starting plan.

Every plan the autoscaler proposes (post-scaling rules, Pareto candidates), every plan asked
for from outside and the warm-start plan lie within these limits. Bounds left out are filled
here, so that a job whose starting plan is larger than the defaults keeps it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from airflow_rover.core.spec import AutoscaleConfig, ResourcePlan

DEFAULT_MAX_COUNT = 4  # workers and PS, unless the starting plan has more
DEFAULT_MAX_PS_CPU = 8.0  # C_max: the largest node DLRover asks for

# ResourcePlan's field -> the AutoscaleConfig fields that bound it
BOUNDED_FIELDS = {
    "num_workers": ("min_workers", "max_workers"),
    "num_ps": ("min_ps", "max_ps"),
    "worker_cpu": ("min_worker_cpu", "max_worker_cpu"),
    "ps_cpu": ("min_ps_cpu", "max_ps_cpu"),
    "ps_memory_mb": ("min_ps_memory_mb", "max_ps_memory_mb"),
}


@dataclass(frozen=True)
class PlanLimits:
    """Inclusive (low, high) per bounded plan field; ``math.inf`` where there is no maximum."""

    ranges: dict[str, tuple[float, float]]

    def low(self, field: str) -> float:
        return self.ranges[field][0]

    def high(self, field: str) -> float:
        return self.ranges[field][1]

    def admits(self, plan: ResourcePlan) -> bool:
        return not self.outside(plan)

    def outside(self, plan: ResourcePlan) -> list[str]:
        """One phrase per field of ``plan`` (or node size) outside its bounds, naming it."""
        found = []
        values = [(name, f"plan.{name}", getattr(plan, name)) for name in self.ranges]
        for entry in plan.sizes:
            for name, what, value in _node_fields(plan, entry.node):
                values.append((name, f"plan.sizes {entry.node} {what}", value))
        for name, what, value in values:
            if name not in self.ranges:
                continue
            low, high = self.ranges[name]
            low_name, high_name = BOUNDED_FIELDS[name]
            if value < low:
                found.append(f"{what}={value:g} is below autoscale.{low_name}={low:g}")
            elif value > high:
                found.append(f"{what}={value:g} is above autoscale.{high_name}={high:g}")
        return found

    def _within(self, name: str, value: float) -> float:
        if name not in self.ranges:
            return value
        low, high = self.ranges[name]
        return type(value)(min(max(value, low), high))

    def clamp(self, plan: ResourcePlan) -> ResourcePlan:
        """``plan`` with every bounded field, and every node's size, moved into its bounds."""
        update = {}
        for name in self.ranges:
            value = getattr(plan, name)
            if self._within(name, value) != value:
                update[name] = self._within(name, value)
        clamped = plan.model_copy(update=update) if update else plan
        for entry in plan.sizes:
            cpu, memory = ((name, value) for name, _, value in _node_fields(plan, entry.node))
            clamped = clamped.with_size(entry.node, self._within(*cpu), int(self._within(*memory)))
        return clamped

    def toward(self, current: ResourcePlan, proposed: ResourcePlan) -> ResourcePlan:
        """``proposed`` with each field it changes from ``current`` moved into the bounds, as
        far as it goes in the same direction (a change the bounds would reverse, from a
        ``current`` outside them, is dropped); fields it leaves alone stay as they are."""
        update = {}
        for name in self.ranges:
            old, new = getattr(current, name), getattr(proposed, name)
            if new == old:
                continue
            bounded = getattr(self.clamp(proposed), name)
            update[name] = bounded if (bounded - old) * (new - old) > 0 else old
        result = proposed.model_copy(update=update) if update else proposed
        for node in proposed.node_ids():
            if node not in current.node_ids() or proposed.size_of(node) == current.size_of(node):
                continue
            sizes = []
            for (name, _, old), (_, _, new) in zip(
                _node_fields(current, node), _node_fields(proposed, node), strict=True
            ):
                bounded = self._within(name, new)
                sizes.append(bounded if (bounded - old) * (new - old) > 0 else old)
            result = result.with_size(node, sizes[0], int(sizes[1]))
        return result

    def as_dict(self) -> dict[str, float | None]:
        """The bounds by their ``AutoscaleConfig`` names (None: no maximum), for the status."""
        out: dict[str, float | None] = {}
        for name, (low, high) in self.ranges.items():
            low_name, high_name = BOUNDED_FIELDS[name]
            out[low_name] = low if low > 0 else None
            out[high_name] = high if math.isfinite(high) else None
        return out


def _node_fields(plan: ResourcePlan, node: str) -> list[tuple[str, str, float]]:
    """(the plan field that bounds it, its name, its value) of ``node``'s cores and memory."""
    role = node.split("-")[0]
    cpu, memory_mb = plan.size_of(node)
    return [(f"{role}_cpu", "cpu", cpu), (f"{role}_memory_mb", "memory_mb", memory_mb)]


def plan_limits(config: AutoscaleConfig, start: ResourcePlan) -> PlanLimits:
    """``config``'s bounds for a job that starts with ``start`` (see the module docstring)."""
    defaults_high = {  # never below the minimum given, whatever the start
        "max_workers": max(DEFAULT_MAX_COUNT, start.num_workers, config.min_workers),
        "max_ps": max(DEFAULT_MAX_COUNT, start.num_ps, config.min_ps),
        "max_ps_cpu": max(DEFAULT_MAX_PS_CPU, start.ps_cpu, config.min_ps_cpu or 0.0),
    }
    ranges: dict[str, tuple[float, float]] = {}
    for name, (low_name, high_name) in BOUNDED_FIELDS.items():
        low, high = getattr(config, low_name), getattr(config, high_name)
        if high is None:
            high = defaults_high.get(high_name, math.inf)
        ranges[name] = (low if low is not None else 0.0, high)
    return PlanLimits(ranges)


def check_start_plan(config: AutoscaleConfig, plan: ResourcePlan) -> None:
    """Raise ValueError naming the plan's field and the bound when the starting plan lies
    outside ``config``'s bounds."""
    outside = plan_limits(config, plan).outside(plan)
    if outside:
        raise ValueError(
            "the starting plan lies outside the autoscale bounds: " + "; ".join(outside)
        )
