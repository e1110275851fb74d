"""Checkpoint policies (``checkpoint_policy="full" | "cpr" | "ecrm"``): one module each, behind
the ``base.CheckpointPolicy`` interface, named in ``registry.POLICIES``.

How the rest of the job uses them::

    cfg = CheckpointPolicyConfig.from_task_params("cpr", {"target_pls": 0.05})  # operator
    policy = cfg.build()                       # master, PS, worker: the policy object
    plan = policy.plan(costs)                  # master, once a save has been timed
    rec = recommend_checkpoint_policy(costs, pls_budget=0.1)
    note = judge_choice(cfg, costs)            # None, or one line for the log

The formulas are in ``docs/checkpoint-policies.md``.
"""

from airflow_rover.core.policies.base import (
    CheckpointPolicy,
    LostUpdates,
    MasterPort,
    NodeJob,
    PsCalls,
    PsLoss,
    PsUnreachable,
)
from airflow_rover.core.policies.config import CheckpointPolicyConfig
from airflow_rover.core.policies.costs import (
    CheckpointCosts,
    CheckpointPlan,
    FailureEvidence,
    FailureHistory,
    Overhead,
    describe_floor,
    interval_floor,
    mtbf_from_history,
)
from airflow_rover.core.policies.cpr import (
    CprOptions,
    PartialRecovery,
    cpr_interval,
    expected_pls,
    partial_overhead,
)
from airflow_rover.core.policies.ecrm import (
    EcrmOptions,
    ErasureCoding,
    ecrm_overhead,
    ecrm_parity_fraction,
)
from airflow_rover.core.policies.full import (
    FullOptions,
    FullRecovery,
    full_overhead,
    optimal_full_interval,
)
from airflow_rover.core.policies.options import CheckpointPolicyError
from airflow_rover.core.policies.recommend import (
    PolicyOption,
    Recommendation,
    judge_choice,
    plan_checkpoints,
    recommend_checkpoint_policy,
)
from airflow_rover.core.policies.registry import DEFAULT_POLICY, POLICIES

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "CheckpointCosts",
    "CheckpointPlan",
    "CheckpointPolicy",
    "CheckpointPolicyConfig",
    "CheckpointPolicyError",
    "CprOptions",
    "EcrmOptions",
    "ErasureCoding",
    "FailureEvidence",
    "FailureHistory",
    "FullOptions",
    "FullRecovery",
    "LostUpdates",
    "MasterPort",
    "NodeJob",
    "Overhead",
    "PartialRecovery",
    "PolicyOption",
    "PsCalls",
    "PsLoss",
    "PsUnreachable",
    "Recommendation",
    "cpr_interval",
    "describe_floor",
    "ecrm_overhead",
    "ecrm_parity_fraction",
    "expected_pls",
    "full_overhead",
    "interval_floor",
    "judge_choice",
    "mtbf_from_history",
    "optimal_full_interval",
    "partial_overhead",
    "plan_checkpoints",
    "recommend_checkpoint_policy",
]
