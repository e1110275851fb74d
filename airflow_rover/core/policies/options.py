"""What every policy's options share: strict pydantic models whose errors name the option
(``cpr.r=2.0: must be in (0, 1]``) and what it accepts."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError

ERROR_TYPE = "checkpoint_policy"


class CheckpointPolicyError(ValueError):
    """A bad checkpoint policy or option; the message names the parameter and what it takes."""


def invalid(text: str) -> PydanticCustomError:
    """A validation error whose message is ``text`` as it stands."""
    return PydanticCustomError(ERROR_TYPE, "{text}", {"text": text})


def check_range(
    name: str, value: float, low: float, high: float | None, *, low_open: bool = True
) -> float:
    """``value`` finite and within (low, high] (``[low, ...`` when not ``low_open``)."""
    too_low = value <= low if low_open else value < low
    if math.isfinite(value) and not too_low and (high is None or value <= high):
        return value
    if high is None:
        rule = f"must be {'>' if low_open else '>='} {low:g}"
    else:
        rule = f"must be in {'(' if low_open else '['}{low:g}, {high:g}]"
    raise invalid(f"{name}={value!r}: {rule}")


def check_choice(name: str, value: Any, accepted: tuple[str, ...]) -> Any:
    if value not in accepted:
        raise invalid(f"{name}={value!r}; accepted: {', '.join(accepted)}")
    return value


class PolicyOptions(BaseModel):
    """A policy's options: its section of the job spec's ``checkpoint`` (``cpr: {...}``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    section: ClassVar[str] = ""

    @classmethod
    def option(cls, field_name: str | None) -> str:
        """The option's name as users write it: ``cpr.r``."""
        return f"{cls.section}.{field_name}" if cls.section else str(field_name)

    @classmethod
    def accepted(cls) -> str:
        return ", ".join(cls.model_fields)


def describe_errors(exc: ValidationError, accepted: str, prefix: str = "") -> list[str]:
    """One clause per error, each naming the option, the value given and what is accepted
    (``accepted``: the options of the model that raised); ``prefix``: the section the
    errors' locations are relative to."""
    parts = []
    for err in exc.errors():
        where = ".".join([*([prefix] if prefix else []), *(str(p) for p in err["loc"])])
        if err["type"] == ERROR_TYPE:
            parts.append(err["msg"])
        elif err["type"] == "extra_forbidden":
            parts.append(f"{where}: unknown option; accepted: {accepted}")
        else:
            parts.append(f"{where or 'checkpoint'}={err.get('input')!r}: {err['msg']}")
    return parts
