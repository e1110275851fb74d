"""A job's checkpoint policy and its options: the ``checkpoint`` section of the job spec.

``{"policy": "cpr", "mtbf_s": 3600, "cpr": {"target_pls": 0.05}}``: the policy's name, the
failure rate it plans with, and a section of options per registered policy (each filled with
its defaults, validated by its ``Options``; only ``policy``'s apply).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic import model_validator as model_check

from airflow_rover.core.policies.base import CheckpointPolicy
from airflow_rover.core.policies.costs import FailureHistory, mtbf_from_history
from airflow_rover.core.policies.options import (
    CheckpointPolicyError,
    PolicyOptions,
    check_choice,
    check_range,
    describe_errors,
    invalid,
)
from airflow_rover.core.policies.registry import DEFAULT_POLICY, POLICIES

OptionsT = TypeVar("OptionsT", bound=PolicyOptions)
_FIELDS = ("policy", "mtbf_s")


class CheckpointPolicyConfig(BaseModel):
    """A job's checkpoint policy and its options. Options of the policies not chosen are kept
    (and validated) so that a recommendation can be compared against them."""

    model_config = ConfigDict(extra="allow", frozen=True)  # the extras: one section per policy

    policy: str = Field(default=DEFAULT_POLICY, description="a registered policy's name")
    mtbf_s: float | None = Field(
        default=None,
        description="mean seconds between embedding-PS failures of this job (T_fail); "
        "default: from the job history (mtbf_from_history)",
    )

    @model_check(mode="before")
    @classmethod
    def _sections(cls, data: Any) -> Any:
        """Every registered policy's section, validated (its defaults where not given)."""
        if not isinstance(data, Mapping):
            return data
        unknown = [k for k in data if k not in _FIELDS and k not in POLICIES]
        errors = [f"{k}: unknown option; accepted: {accepted_keys()}" for k in unknown]
        sections: dict[str, Any] = {}
        for name, policy in POLICIES.items():
            given = data.get(name, {})
            try:
                sections[name] = (
                    given
                    if isinstance(given, policy.Options)
                    else policy.Options.model_validate(given)
                )
            except ValidationError as exc:
                errors += describe_errors(exc, policy.Options.accepted(), prefix=name)
        if errors:
            raise invalid("; ".join(errors))
        return {**{k: data[k] for k in _FIELDS if k in data}, **sections}

    @field_validator("policy", mode="before")
    @classmethod
    def _policy(cls, v: Any) -> Any:
        return check_choice("checkpoint_policy", v, tuple(POLICIES))

    @field_validator("mtbf_s")
    @classmethod
    def _mtbf(cls, v: float | None) -> float | None:
        return None if v is None else check_range("mtbf_s", v, 0.0, None)

    # -- reading -------------------------------------------------------------------------------
    def section(self, name: str | None = None) -> PolicyOptions:
        """The options of policy ``name`` (default: the chosen one)."""
        extra = self.__pydantic_extra__ or {}
        options: PolicyOptions = extra[name or self.policy]
        return options

    def options_of(self, kind: type[OptionsT]) -> OptionsT:
        """The section of the policy whose options are ``kind`` (typed)."""
        found = next(s for s in (self.__pydantic_extra__ or {}).values() if isinstance(s, kind))
        return found

    def build(self, name: str | None = None) -> CheckpointPolicy:
        """A policy object of ``name`` (default: the chosen one) with its options."""
        name = name or self.policy
        return POLICIES[name](self.section(name), self.mtbf_s)

    def failure_interval(self, history: Iterable[FailureHistory], num_emb_ps: int) -> float | None:
        """T_fail for this job: ``mtbf_s`` when given, else from the job history (None when
        there is neither: the master keeps its default interval until it knows)."""
        return self.mtbf_s if self.mtbf_s is not None else mtbf_from_history(history, num_emb_ps)

    def check_cluster(self, num_ps: int) -> None:
        """Reject a policy the job's PS count cannot carry (ECRM needs k+1 PS)."""
        self.build().check_cluster(num_ps)

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def parse(cls, value: Any) -> CheckpointPolicyConfig:
        """Validate a dict (or JSON text) into a config; errors as ``CheckpointPolicyError``."""
        try:
            if isinstance(value, str | bytes):
                return cls.model_validate_json(value)
            return cls.model_validate(value)
        except ValidationError as exc:
            raise CheckpointPolicyError("; ".join(describe_errors(exc, accepted_keys()))) from None

    @classmethod
    def from_task_params(
        cls, checkpoint_policy: str = DEFAULT_POLICY, options: Mapping[str, Any] | None = None
    ) -> CheckpointPolicyConfig:
        """Build from an operator's ``checkpoint_policy`` and its flat ``options`` dict.

        ``options`` keys are the chosen policy's options (``target_pls``, ``k``, ...) plus
        ``mtbf_s``; anything else is rejected naming the accepted keys.
        """
        if checkpoint_policy not in POLICIES:
            raise CheckpointPolicyError(
                f"checkpoint_policy={checkpoint_policy!r}; accepted: {', '.join(POLICIES)}"
            )
        section = POLICIES[checkpoint_policy].Options
        opts = dict(options or {})
        top = {k: opts.pop(k) for k in list(opts) if k == "mtbf_s"}
        unknown = sorted(set(opts) - set(section.model_fields))
        if unknown:
            accepted = ", ".join([*section.model_fields, "mtbf_s"])
            raise CheckpointPolicyError(
                f"checkpoint_options: unknown option(s) {unknown} for "
                f"checkpoint_policy={checkpoint_policy!r}; accepted: {accepted}"
            )
        return cls.parse({"policy": checkpoint_policy, checkpoint_policy: opts, **top})


def accepted_keys() -> str:
    """The keys of a ``checkpoint`` section: its fields and the registered policies."""
    return ", ".join([*_FIELDS, *POLICIES])
