"""Turn pydantic errors into messages that name the operator parameter, at DAG parse time."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from airflow_rover.core.spec import describe_errors as describe

M = TypeVar("M", bound=BaseModel)


def has_template(value: Any) -> bool:
    """True if ``value`` (or anything inside it) is a Jinja template, rendered only at run time."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, dict):
        return any(has_template(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_template(v) for v in value)
    return False


def parse_param(owner: str, param: str, model: type[M], value: Any) -> M:
    """Validate ``value`` as ``model``; a bad value raises ValueError naming ``param``."""
    if isinstance(value, model):
        return value
    if not isinstance(value, dict):
        raise ValueError(
            f"{owner}: {param} must be a dict or {model.__name__}, got {type(value).__name__}"
        )
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise ValueError(f"{owner}: invalid {param}: {describe(exc, model)}") from None


def check_static_entries(owner: str, param: str, model: type[BaseModel], value: Any) -> None:
    """Validate now every entry of ``value`` that is not a template (all fields have
    defaults, so the literal entries alone form a valid model when they are right)."""
    if isinstance(value, dict):
        literal = {k: v for k, v in value.items() if not has_template(v)}
        unknown = sorted(set(value) - set(model.model_fields))
        if unknown:
            accepted = ", ".join(model.model_fields)
            raise ValueError(
                f"{owner}: invalid {param}: unknown keys {unknown} are not permitted; "
                f"accepted: {accepted}"
            )
        parse_param(owner, param, model, literal)
    else:
        parse_param(owner, param, model, value)
