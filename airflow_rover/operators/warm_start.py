"""``WarmStartOperator``: a training job's first plan from the most similar past jobs.

.. seealso:: ``docs/warm-start.md`` and the example DAG ``dags/daily_retrain.py``.
"""

from __future__ import annotations

import ast
import json
import logging
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowFailException
from pydantic import ValidationError

from airflow_rover.core.autoscale_prior import job_shape
from airflow_rover.core.spec import (
    FeatureConfig,
    JobSpec,
    ResourcePlan,
    TrainingConfig,
    default_features,
)
from airflow_rover.core.throughput import JobShape
from airflow_rover.core.warm_start import (
    DEFAULT_K,
    DEFAULT_MIN_SIMILARITY,
    DEFAULT_MU,
    JobTraits,
    Refinement,
    WarmStart,
    check_settings,
)
from airflow_rover.data.features import resolve_features
from airflow_rover.data.reader import open_dataset, open_split
from airflow_rover.hooks.history_store import HistoryStoreHook
from airflow_rover.operators._validation import (
    check_static_entries,
    describe,
    has_template,
    parse_param,
)

log = logging.getLogger(__name__)


def rendered_dict(value: Any, param: str) -> dict[str, Any]:
    """A rendered dict parameter: a dict, or the text of one (JSON or a Python literal, which
    is what an XCom dict renders to without ``render_template_as_native_obj``)."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        for parse in (json.loads, ast.literal_eval):
            try:
                parsed = parse(value)
            except (ValueError, SyntaxError):
                continue
            if isinstance(parsed, dict):
                return parsed
    raise ValueError(f"{param} must render to a dict, got {value!r}")


def job_traits(
    model: str,
    train_data: str | None,
    features: FeatureConfig | None,
    embedding_dim: int,
    dag_id: str | None,
    task_id: str | None,
) -> JobTraits:
    """The incoming job's traits; dataset size and default features come from the training
    set's manifest when ``train_data`` is given (unreadable: unknown, with a warning)."""
    samples = None
    if train_data:
        try:
            reader = open_dataset(train_data)
            samples = reader.num_samples
            if features is None:
                schema = reader.schema
                columns = [(c.name, c.vocab_size) for c in schema.categorical]
                features = default_features(columns, schema.num_dense, model, embedding_dim)
        except (OSError, ValueError) as exc:
            log.warning("Warm start: cannot read %s (%s); its size is unknown", train_data, exc)
    return JobTraits.of(model, features, samples, dag_id, task_id)


def spec_traits(spec: JobSpec, dag_id: str | None, task_id: str | None) -> JobTraits:
    """The traits of a job about to start (the same ones its history record will carry)."""
    features = resolve_features(spec)
    samples = open_split(spec, spec.train_data).num_samples
    return JobTraits.of(spec.model, features, samples, dag_id, task_id)


def describe_query(traits: JobTraits) -> dict[str, Any]:
    return {
        "model": traits.model,
        "feature_signature": traits.feature_signature,
        "dataset_samples": traits.dataset_samples,
        "dag_id": traits.dag_id,
        "task_id": traits.task_id,
    }


def decide(
    hook: HistoryStoreHook,
    traits: JobTraits,
    cold_start: ResourcePlan,
    k: int = DEFAULT_K,
    mu: float = DEFAULT_MU,
    min_similarity: float = DEFAULT_MIN_SIMILARITY,
    refinement: Refinement | None = None,
    shape: JobShape | None = None,
) -> WarmStart:
    """Warm start from the history, or the cold-start plan (saying why) when the history has
    no similar job or cannot be read: a missing history never stops training. The autoscaler's
    prior is fitted for ``shape`` (default the refinement's)."""
    try:
        return hook.warm_start(traits, cold_start, k, mu, min_similarity, refinement, shape)
    except Exception as exc:  # any database or driver error: train with the cold-start plan
        log.warning("Warm start: the history store cannot be read: %s: %s", type(exc).__name__, exc)
        message = f"history store unavailable ({type(exc).__name__}): cold-start plan"
        return WarmStart(cold_start, "cold_start", message, (), k, mu)


class WarmStartOperator(BaseOperator):
    """Choose a training job's initial plan from the most similar past jobs in the history.

    Scores every recorded successful job against this one (model, feature config, dataset size,
    DAG and task: the similarity of ``airflow_rover.core.warm_start``), keeps the ``k`` best and
    smooths their final plans (DLRover-RM Algorithm 1, ``A_bar_i = mu * A_i + (1 - mu) *
    A_bar_{i-1}`` from the least to the most similar). With no similar job it says so and returns
    ``cold_start_plan``. The XCom is a JSON dict: ``plan``, ``source`` (``history`` or
    ``cold_start``), ``message``, ``matches`` (job ids, scores, plans), ``prior`` (the
    autoscaler's, from the same jobs; None without history), ``query``, ``k``, ``mu``; feed
    ``plan`` to ``ElasticTrainingOperator(plan="{{ ti.xcom_pull('warm_start')['plan'] }}")``
    and ``prior`` to its ``autoscale={"prior": "{{ ti.xcom_pull('warm_start')['prior'] }}"}``.

    :param model: the training task's model reference. (templated)
    :param train_data: the training set; its manifest gives the dataset size and the default
        feature config. (templated)
    :param features: the training task's feature config, if it sets one.
    :param embedding_dim: the training task's ``embedding_dim`` (for the default features and
        the prior's throughput model).
    :param batch_size: the training task's ``training.batch_size`` (the prior's throughput
        model is fitted for it).
    :param cold_start_plan: the plan without history (default ``ResourcePlan()``). (templated)
    :param for_task_id: the training task the plan is for (past jobs of the same DAG and task
        score highest on the owner part).
    :param k: how many similar jobs to smooth; 0 disables warm start. (templated)
    :param mu: the smoothing factor, in (0, 1]. (templated)
    :param min_similarity: past jobs scoring below this, in [0, 1], are ignored. (templated)
    :param history_conn_id: connection to the history database; default SQLite in
        ``$AIRFLOW_HOME/rover/history.db``. (templated)

    .. seealso:: ``docs/warm-start.md``
    """

    template_fields: Sequence[str] = (
        "model",
        "train_data",
        "cold_start_plan",
        "k",
        "mu",
        "min_similarity",
        "history_conn_id",
    )
    template_fields_renderers = {"cold_start_plan": "json"}
    ui_color = "#fdf3d8"

    def __init__(
        self,
        *,
        model: str = "wide_deep",
        train_data: str | None = None,
        features: dict[str, Any] | FeatureConfig | None = None,
        embedding_dim: int = 16,
        batch_size: int = TrainingConfig().batch_size,
        cold_start_plan: dict[str, Any] | ResourcePlan | None = None,
        for_task_id: str | None = None,
        k: int | str = DEFAULT_K,
        mu: float | str = DEFAULT_MU,
        min_similarity: float | str = DEFAULT_MIN_SIMILARITY,
        history_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__}(task_id={self.task_id!r})"
        self.model = model
        self.train_data = train_data
        self.features = (
            parse_param(owner, "features", FeatureConfig, features) if features else None
        )
        self.embedding_dim = embedding_dim
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"{owner}: batch_size={batch_size!r}: accepted: an integer >= 1")
        self.batch_size = batch_size
        self.cold_start_plan = (
            cold_start_plan.model_dump()
            if isinstance(cold_start_plan, ResourcePlan)
            else (cold_start_plan or {})
        )
        self.for_task_id = for_task_id
        self.k = k
        self.mu = mu
        self.min_similarity = min_similarity
        self.history_conn_id = history_conn_id
        if not (isinstance(self.cold_start_plan, str) and has_template(self.cold_start_plan)):
            check_static_entries(owner, "cold_start_plan", ResourcePlan, self.cold_start_plan)
        if not any(has_template(v) for v in (k, mu, min_similarity)):
            try:
                check_settings(k, mu, min_similarity)
            except ValueError as exc:
                raise ValueError(f"{owner}: {exc}") from None

    def _settings(self) -> tuple[ResourcePlan, int, float, float]:
        """The rendered cold-start plan and settings; a bad one fails without retries."""
        owner = f"{type(self).__name__}(task_id={self.task_id!r})"
        try:
            plan = ResourcePlan.model_validate(
                rendered_dict(self.cold_start_plan, "cold_start_plan")
            )
            k, mu, floor = int(self.k), float(self.mu), float(self.min_similarity)
            check_settings(k, mu, floor)
        except ValidationError as exc:
            raise AirflowFailException(f"{owner}: cold_start_plan: {describe(exc)}") from None
        except (TypeError, ValueError) as exc:
            raise AirflowFailException(f"{owner}: {exc}") from None
        return plan, k, mu, floor

    def execute(self, context: Context) -> dict[str, Any]:
        cold, k, mu, floor = self._settings()
        traits = job_traits(
            self.model,
            self.train_data or None,
            self.features,
            self.embedding_dim,
            context["ti"].dag_id,
            self.for_task_id,
        )
        shape = job_shape(self.batch_size, self.embedding_dim)
        hook = HistoryStoreHook(self.history_conn_id)
        decision = decide(hook, traits, cold, k, mu, floor, shape=shape)
        self.log.info("Warm start (%s): %s", decision.source, decision.message)
        self.log.info("Initial plan: %s", decision.plan.model_dump())
        return {**decision.to_xcom(), "query": describe_query(traits)}
