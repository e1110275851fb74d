"""The ``ElasticTrainingOperator``'s arguments checked when the DAG is parsed, as far as they
are not templates, and the helpers that validate the templated ones again once rendered.
Every error names the operator and the argument."""

from __future__ import annotations

import ast
import json
from datetime import timedelta
from pathlib import PurePath
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError, field_validator

from airflow_rover.core.data_schema import DataSchema
from airflow_rover.core.plan_limits import check_start_plan
from airflow_rover.core.policies import CheckpointPolicyConfig
from airflow_rover.core.spec import (
    AutoscaleConfig,
    ClusterBudget,
    DataWorkersConfig,
    EmbeddingDim,
    FeatureConfig,
    RecoveryConfig,
    ResourcePlan,
    TrainingConfig,
    check_model_ref,
    check_preprocess_ref,
    data_workers_fields,
)
from airflow_rover.launchers.backends import BACKENDS
from airflow_rover.launchers.kubernetes.config import KubernetesConfig, check_static_config
from airflow_rover.operators._validation import (
    check_static_entries,
    describe,
    has_template,
    parse_param,
)
from airflow_rover.operators.budget_admission import AUTO_BUDGET
from airflow_rover.operators.warm_start import rendered_dict
from airflow_rover.storage.base import parse_checkpoint_uri


def check_job_args(owner: str, warm_start: Any, train_data: Any) -> None:
    """``warm_start`` is a bool and ``train_data`` a non-empty path."""
    if not isinstance(warm_start, bool):
        raise ValueError(f"{owner}: warm_start must be True or False, got {warm_start!r}")
    if not isinstance(train_data, str) or not train_data:
        raise ValueError(f"{owner}: train_data must be a non-empty path, got {train_data!r}")


def check_flag(owner: str, name: str, value: Any) -> None:
    """``value`` is a bool: a string such as ``"false"`` would read as true."""
    if not isinstance(value, bool):
        raise ValueError(f"{owner}: {name} must be True or False, got {value!r}")


def check_plan_approval(owner: str, autoscale: AutoscaleConfig, cluster_budget: Any) -> None:
    """No ``autoscale.plan_approval`` with a cluster budget, whose arbiter a person's approval
    would bypass."""
    if autoscale.plan_approval and cluster_budget not in (None, AUTO_BUDGET):
        raise ValueError(
            f"{owner}: autoscale.plan_approval=True with cluster_budget: the cluster arbiter "
            "applies a shared budget's plans, a person approves the others; give one of them"
        )


def check_autoscale(owner: str, autoscale: AutoscaleConfig, plan: ResourcePlan) -> None:
    """The starting plan lies within the autoscale bounds; the error names both."""
    try:
        check_start_plan(autoscale, plan)
    except ValueError as exc:
        raise ValueError(f"{owner}: {exc}") from None


def check_static_autoscale(owner: str, autoscale: Any, plan: Any, cluster_budget: Any) -> None:
    """``autoscale``'s literal entries; with no template in it (nor in ``plan``), the
    starting plan within its bounds and no approval with a cluster budget."""
    if isinstance(autoscale, str) and has_template(autoscale):  # judged once rendered
        return
    check_static_entries(owner, "autoscale", AutoscaleConfig, autoscale)
    if has_template(autoscale):
        return
    config = parse_param(owner, "autoscale", AutoscaleConfig, autoscale)
    check_plan_approval(owner, config, cluster_budget)
    if not has_template(plan):
        check_autoscale(owner, config, parse_param(owner, "plan", ResourcePlan, plan))


def check_launcher(owner: str, launcher: Any, kubernetes: Any, kubernetes_conn_id: Any) -> None:
    """A known launcher, with the Kubernetes settings it needs; those settings are checked
    even when unused, so that ``launcher`` alone switches a DAG's backend."""
    if launcher not in BACKENDS:
        raise ValueError(f"{owner}: launcher={launcher!r}; accepted: {list(BACKENDS)}")
    if launcher == "kubernetes" and kubernetes is None:
        raise ValueError(
            f"{owner}: launcher='kubernetes' needs kubernetes={{'image': ..., "
            "'job_volume_claim': ...}"
        )
    if kubernetes is not None:
        check_static_config(owner, kubernetes)
    if kubernetes_conn_id is not None and not isinstance(kubernetes_conn_id, str):
        raise ValueError(
            f"{owner}: kubernetes_conn_id must be a connection id, got {kubernetes_conn_id!r}"
        )


def check_polling(owner: str, poll_interval: Any, max_runtime: Any) -> None:
    """A positive poll interval in seconds and a positive ``max_runtime``."""
    if not isinstance(poll_interval, int | float) or poll_interval <= 0:
        raise ValueError(f"{owner}: poll_interval must be > 0 seconds, got {poll_interval!r}")
    if not isinstance(max_runtime, timedelta) or max_runtime <= timedelta(0):
        raise ValueError(f"{owner}: max_runtime must be a positive timedelta")


def check_job_location(owner: str, output_dir: Any, embedding_dim: Any) -> None:
    """A literal ``output_dir`` without ``..`` (the job would not be where it says) and an
    ``embedding_dim`` the spec accepts, checked when the DAG is parsed."""
    if output_dir is not None and not has_template(output_dir):
        check_output_dir(owner, output_dir)
    try:
        TypeAdapter(EmbeddingDim).validate_python(embedding_dim, strict=True)
    except ValidationError as exc:
        message = exc.errors()[0]["msg"]
        raise ValueError(f"{owner}: embedding_dim={embedding_dim!r}: {message}") from None


def check_output_dir(owner: str, output_dir: Any) -> None:
    """``output_dir`` is a path that names no ``..``."""
    if not isinstance(output_dir, str) or not output_dir:
        raise ValueError(f"{owner}: output_dir must be a path, got {output_dir!r}")
    if ".." in PurePath(output_dir).parts:
        raise ValueError(f"{owner}: output_dir={output_dir!r}: '..' in the path")


def check_checkpoint_uri(owner: str, checkpoint_uri: str | None) -> None:
    """A literal ``checkpoint_uri`` names a store the job can write to."""
    if checkpoint_uri is not None and not has_template(checkpoint_uri):
        try:
            parse_checkpoint_uri(checkpoint_uri)
        except ValueError as exc:
            raise ValueError(f"{owner}: {exc}") from None


def check_static_specs(owner: str, plan: Any, training: Any, recovery: Any) -> None:
    """The literal entries of ``plan``, ``training`` and ``recovery``; templates are validated
    once rendered."""
    if not (isinstance(plan, str) and has_template(plan)):  # e.g. an XCom pull
        check_static_entries(owner, "plan", ResourcePlan, plan)
    check_static_entries(owner, "training", TrainingConfig, training)
    check_static_entries(owner, "recovery", RecoveryConfig, recovery)


def check_static_checkpoint(owner: str, policy: Any, options: Any) -> None:
    """The checkpoint policy and its options, unless either is a template."""
    if not has_template(policy) and not has_template(options):
        try:
            checkpoint_config(policy, options)
        except ValueError as exc:
            raise ValueError(f"{owner}: {exc}") from None


def check_static_model(owner: str, model: Any) -> None:
    """The model reference, unless it is a template."""
    if not has_template(model):
        try:
            check_model_ref(model)
        except ValueError as exc:
            raise ValueError(f"{owner}: {exc}") from None


def check_static_preprocess(owner: str, preprocess: Any) -> None:
    """The preprocessing's import path, unless it is a template."""
    if not has_template(preprocess):
        try:
            check_preprocess_ref(preprocess)
        except ValueError as exc:
            raise ValueError(f"{owner}: {exc}") from None


class _DataWorkersParam(BaseModel):
    """``data_workers`` alone, in any of its forms, so that its errors name
    ``data_workers.<field>``."""

    data_workers: DataWorkersConfig

    @field_validator("data_workers", mode="before")
    @classmethod
    def _forms(cls, value: Any) -> Any:
        return data_workers_fields(value)


def data_workers_config(owner: str, value: Any) -> DataWorkersConfig:
    """``value`` in any accepted form (``core.spec.data_workers_fields``) as the config."""
    try:
        return _DataWorkersParam.model_validate({"data_workers": value}).data_workers
    except ValidationError as exc:
        raise ValueError(f"{owner}: {describe(exc, DataWorkersConfig)}") from None


def check_static_data_workers(owner: str, value: Any) -> None:
    """``data_workers`` unless it is a template; of a dict with templated values, its keys."""
    if not has_template(value):
        data_workers_config(owner, value)
    elif isinstance(value, dict):
        unknown = sorted(set(value) - set(DataWorkersConfig.model_fields))
        if unknown:
            raise ValueError(
                f"{owner}: invalid data_workers: unknown keys {unknown} are not permitted; "
                f"accepted: {', '.join(DataWorkersConfig.model_fields)}"
            )


def rendered_data_workers(value: Any) -> Any:
    """A rendered ``data_workers``: a template renders to text, which may hold a count, None
    or a dict (JSON or a Python literal); anything else is left for validation to name."""
    if not isinstance(value, str) or value.strip().lower() in ("off", "auto"):
        return value
    for parse in (json.loads, ast.literal_eval):
        try:
            parsed = parse(value)
        except (ValueError, SyntaxError):
            continue
        if parsed is None or isinstance(parsed, int | dict):
            return parsed
    return value


def as_param_dict(value: Any, model: type[BaseModel]) -> Any:
    """A ``model`` instance as its dict, an empty value as ``{}``, anything else as is."""
    return value.model_dump() if isinstance(value, model) else (value or {})


def static_features(owner: str, features: Any) -> FeatureConfig | None:
    """The validated ``features``; None for the default tables."""
    return parse_param(owner, "features", FeatureConfig, features) if features else None


def static_data_schema(owner: str, data_schema: Any) -> DataSchema | None:
    """The validated ``data_schema``; None to infer it from the files."""
    return parse_param(owner, "data_schema", DataSchema, data_schema) if data_schema else None


def kubernetes_param(
    kubernetes: dict[str, Any] | KubernetesConfig | str | None,
) -> dict[str, Any] | str | None:
    """``kubernetes`` as the dict (or template) it is rendered from."""
    if isinstance(kubernetes, KubernetesConfig):
        return kubernetes.model_dump(mode="json", by_alias=True)
    return kubernetes


def checkpoint_config(policy: Any, options: Any) -> CheckpointPolicyConfig:
    """The validated checkpoint policy; errors name the option and what it accepts."""
    config = CheckpointPolicyConfig.from_task_params(policy, options)
    config.build().check_runtime()
    return config


def cluster_budget_of(owner: str, value: Any) -> ClusterBudget:
    """``value`` as a ``ClusterBudget`` that limits something (cpu, memory_mb or both)."""
    budget = parse_param(owner, "cluster_budget", ClusterBudget, value)
    if budget.cpu is None and budget.memory_mb is None:
        raise ValueError(f"{owner}: cluster_budget needs a limit: cpu, memory_mb or both")
    return budget


def static_cluster_budget(owner: str, value: Any) -> dict[str, Any] | str | None:
    """``cluster_budget`` checked at parse time as far as it is not a template."""
    if value is None or value == AUTO_BUDGET:
        return value
    if isinstance(value, str) and has_template(value):  # one template: judged once rendered
        return value
    if isinstance(value, dict) and has_template(value):
        check_static_entries(owner, "cluster_budget", ClusterBudget, value)
        return value
    budget = cluster_budget_of(owner, value)
    return value if isinstance(value, dict) else budget.model_dump(mode="json")


def dict_or_as_is(value: Any, param: str = "plan") -> Any:
    """A rendered dict parameter (``plan``, ``kubernetes``) as a dict; anything else as is
    (validation names it)."""
    try:
        return rendered_dict(value, param)
    except ValueError:
        return value


def autoscale_dict(value: Any) -> Any:
    """A rendered ``autoscale`` as a dict, its ``prior`` too: a template such as
    ``"{{ ti.xcom_pull('warm_start')['prior'] }}"`` renders (without native rendering) to the
    text of a dict, or to ``None`` after a cold start. Anything else as is (validation names
    it)."""
    autoscale = dict_or_as_is(value, "autoscale")
    if isinstance(autoscale, dict) and isinstance(autoscale.get("prior"), str):
        text = autoscale["prior"].strip()
        none = text in ("", "None", "null")
        autoscale = {**autoscale, "prior": None if none else dict_or_as_is(text, "prior")}
    return autoscale
