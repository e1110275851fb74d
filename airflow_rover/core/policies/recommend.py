"""Which checkpoint policy a job of this size and failure rate should use, and whether the
user's choice costs clearly more (``judge_choice``, logged by the master).

Candidates: full recovery at its optimal interval; CPR vanilla/MFU/SSU at the PLS budget (kept
only when CPR's own benefit check passes); ECRM at the ``k`` values the PS count and memory
allow. The cheapest feasible one wins, ties going to the one that loses nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from airflow_rover.core.policies.config import CheckpointPolicyConfig
from airflow_rover.core.policies.costs import CheckpointCosts, CheckpointPlan, pct
from airflow_rover.core.policies.cpr import CprOptions
from airflow_rover.core.policies.ecrm import EcrmCodec, EcrmOptions, ecrm_parity_fraction


def plan_checkpoints(cfg: CheckpointPolicyConfig, costs: CheckpointCosts) -> CheckpointPlan:
    """The save schedule of ``cfg``'s policy for a job with ``costs``."""
    return cfg.build().plan(costs)


@dataclass(frozen=True)
class PolicyOption:
    """One candidate a recommendation weighed: its settings, cost and a one-line verdict."""

    label: str
    config: CheckpointPolicyConfig
    overhead: float
    expected_pls: float
    feasible: bool
    reason: str


@dataclass(frozen=True)
class Recommendation:
    """The cheapest feasible policy within the accuracy budget, and every option weighed."""

    config: CheckpointPolicyConfig
    plan: CheckpointPlan
    options: tuple[PolicyOption, ...]
    reason: str

    @property
    def overhead(self) -> float:
        return self.plan.overhead.total


# Equal overheads: prefer no accuracy loss, then the simplest policy.
_PREFERENCE = ("full", "ecrm", "cpr-mfu", "cpr-ssu", "cpr-vanilla")


def recommend_checkpoint_policy(
    costs: CheckpointCosts,
    pls_budget: float = 0.1,
    *,
    ecrm_codec: EcrmCodec = "sum",
    ecrm_k: Iterable[int] | None = None,
) -> Recommendation:
    """Which policy and settings minimise expected overhead with a PLS of at most
    ``pls_budget`` (0: no update may be lost, so CPR is out).

    Candidates: full recovery at its optimal interval; CPR vanilla/MFU/SSU at
    ``target_pls = pls_budget`` (the largest interval the budget allows), kept only when CPR's
    own benefit check passes; ECRM for each ``k`` in ``ecrm_k`` (default 4, or the largest the
    PS count allows; with ``memory_headroom_bytes`` known, also 2 and 8) that fits the PS count
    and the memory headroom.
    """
    if not (math.isfinite(pls_budget) and 0 <= pls_budget <= 1):
        raise ValueError(f"pls_budget={pls_budget!r}: must be in [0, 1]")
    options: list[PolicyOption] = []
    plans: dict[str, CheckpointPlan] = {}

    full_cfg = CheckpointPolicyConfig(policy="full", mtbf_s=costs.mtbf_s)
    full = full_cfg.build().plan(costs)
    plans["full"] = full
    options.append(PolicyOption("full", full_cfg, full.overhead.total, 0.0, True, full.reason))

    options.extend(_cpr_options(costs, pls_budget, full, plans))
    options.extend(_ecrm_options(costs, ecrm_codec, ecrm_k, plans))

    feasible = [o for o in options if o.feasible]
    best = min(
        feasible,
        key=lambda o: (round(o.overhead, 12), _PREFERENCE.index(o.label.split("(")[0])),
    )
    plan = plans[best.label]
    others = ", ".join(
        f"{o.label} {pct(o.overhead)}" if o.feasible else f"{o.label} out ({o.reason})"
        for o in options
        if o is not best
    )
    reason = f"{best.label}: lowest expected overhead {pct(best.overhead)}; {others}"
    return Recommendation(best.config, plan, tuple(options), reason)


def _cpr_options(
    costs: CheckpointCosts,
    pls_budget: float,
    full: CheckpointPlan,
    plans: dict[str, CheckpointPlan],
) -> list[PolicyOption]:
    """CPR's variants at the largest interval the PLS budget allows."""
    out = []
    for variant in ("mfu", "ssu", "vanilla"):
        label = f"cpr-{variant}"
        if pls_budget <= 0:
            cfg = CheckpointPolicyConfig(policy="cpr", mtbf_s=costs.mtbf_s)
            out.append(
                PolicyOption(label, cfg, math.inf, 0.0, False, "no PLS budget: CPR loses updates")
            )
            continue
        cfg = CheckpointPolicyConfig.model_validate(
            {
                "policy": "cpr",
                "mtbf_s": costs.mtbf_s,
                "cpr": {"target_pls": pls_budget, "variant": variant},
            }
        )
        plan = cfg.build().plan(costs)
        ok = plan.policy == "cpr"
        over = plan.overhead.total if ok else plan.alternatives["cpr"]
        why = plan.reason if ok else f"no benefit: {pct(over)} vs full {pct(full.overhead.total)}"
        out.append(PolicyOption(label, cfg, over, plan.expected_pls, ok, why))
        if ok:
            plans[label] = plan

    return out


def _ecrm_options(
    costs: CheckpointCosts,
    codec: EcrmCodec,
    ks: Iterable[int] | None,
    plans: dict[str, CheckpointPlan],
) -> list[PolicyOption]:
    if ks is None:
        cap = costs.num_emb_ps - 1
        ks = [min(4, cap)] if cap >= 2 else [4]
        if costs.memory_headroom_bytes is not None:
            ks = sorted({*ks, *(k for k in (2, 8) if k <= cap)})
    out = []
    for k in ks:
        label = f"ecrm(k={k})"
        cfg = CheckpointPolicyConfig.model_validate(
            {"policy": "ecrm", "mtbf_s": costs.mtbf_s, "ecrm": EcrmOptions(k=k, codec=codec)}
        )
        if costs.num_emb_ps < k + 1:
            why = f"needs {k + 1} PS, the job has {costs.num_emb_ps}"
            out.append(PolicyOption(label, cfg, math.inf, 0.0, False, why))
            continue
        parity = ecrm_parity_fraction(k, codec) * costs.embedding_bytes
        if costs.memory_headroom_bytes is not None and parity > costs.memory_headroom_bytes:
            why = (
                f"parity needs {parity / 2**30:.2f} GiB, "
                f"{costs.memory_headroom_bytes / 2**30:.2f} GiB free"
            )
            out.append(PolicyOption(label, cfg, math.inf, 0.0, False, why))
            continue
        plan = cfg.build().plan(costs)
        plans[label] = plan
        out.append(PolicyOption(label, cfg, plan.overhead.total, 0.0, True, plan.reason))
    return out


def judge_choice(
    cfg: CheckpointPolicyConfig,
    costs: CheckpointCosts,
    pls_budget: float | None = None,
    *,
    tolerance: float = 0.1,
    min_gap: float = 0.002,
) -> str | None:
    """One line for the operator's log when the user's policy is expected to cost clearly
    more than the recommendation (more than ``tolerance`` relatively and ``min_gap`` of
    training time absolutely); None when it is about as good.

    The budget defaults to the user's own ``cpr.target_pls`` when they chose CPR, else 0
    (a user who chose full or ECRM asked for no lost updates).
    """
    budget = (
        pls_budget
        if pls_budget is not None
        else (cfg.options_of(CprOptions).target_pls if cfg.policy == "cpr" else 0.0)
    )
    mine = cfg.build().plan(costs)
    rec = recommend_checkpoint_policy(
        costs, budget, ecrm_codec=cfg.options_of(EcrmOptions).codec, ecrm_k=_user_k(cfg, costs)
    )
    gap = mine.overhead.total - rec.overhead
    if gap <= min_gap or gap <= tolerance * rec.overhead:
        return None
    return (
        f"checkpoint_policy={cfg.policy!r} is expected to cost {pct(mine.overhead.total)} of "
        f"training time ({mine.reason}); recommended: {rec.reason}"
    )


def _user_k(cfg: CheckpointPolicyConfig, costs: CheckpointCosts) -> list[int] | None:
    if cfg.policy != "ecrm":
        return None
    cap = costs.num_emb_ps - 1
    return sorted({cfg.options_of(EcrmOptions).k, *([min(4, cap)] if cap >= 2 else [])})
