"""``ElasticTrainingOperator``: train a recommendation model as an elastic job, deferring while
it runs.

.. seealso:: ``docs/operators.md`` and the example DAG ``dags/daily_retrain.py``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, BaseOperator, Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from pydantic import BaseModel, ValidationError

from airflow_rover.core.cluster_budget import ttl_for
from airflow_rover.core.data_schema import DataSchema
from airflow_rover.core.deadline import JobDeadline
from airflow_rover.core.incremental import check_init_option
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.job_status import with_decisions_from
from airflow_rover.core.policies import FailureEvidence, describe_floor
from airflow_rover.core.spec import (
    AutoscaleConfig,
    ClusterBudget,
    DataWorkersConfig,
    FeatureConfig,
    JobSpec,
    RecoveryConfig,
    ResourcePlan,
    TrainingConfig,
)
from airflow_rover.core.states import ACTIVE_STATES, TERMINAL_STATES, JobState
from airflow_rover.core.warm_start import JobTraits, refinement_for, within_bounds
from airflow_rover.data.features import resolve_features
from airflow_rover.data.fingerprint import training_fingerprint
from airflow_rover.data.offset_index import ENV_INDEX_DIR, job_index_dir
from airflow_rover.data.preflight import PreflightError, check_data
from airflow_rover.data.reader import open_split
from airflow_rover.data.sources import reads_s3
from airflow_rover.history.launches import Launch, LaunchIndex
from airflow_rover.history.records import record_from_status
from airflow_rover.history.registry import RunningJobRegistry
from airflow_rover.hooks.checkpoint_store import CheckpointStoreHook
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.hooks.history_store import HistoryStoreHook
from airflow_rover.launchers.backends import backend_named
from airflow_rover.launchers.base import JobBackend, JobDirInUse
from airflow_rover.launchers.kubernetes.config import (
    KubernetesConfig,
    KubernetesJob,
    check_visible,
    parse_config,
)
from airflow_rover.launchers.kubernetes.job import KubernetesPermissionError
from airflow_rover.operators import incremental
from airflow_rover.operators._validation import describe
from airflow_rover.operators.budget_admission import (
    AUTO_BUDGET,
    admission_request,
    check_fits_budget,
    default_cluster_budget,
)
from airflow_rover.operators.job_deadline import deferral_timeout
from airflow_rover.operators.job_identity import default_jobs_root, job_id_for, path_segment
from airflow_rover.operators.job_link import ElasticJobLink
from airflow_rover.operators.job_rerun import (
    Rerun,
    clear_job,
    clear_stored_checkpoints,
    rerun_decision,
)
from airflow_rover.operators.job_result import event_status_of, job_result, raise_job_ended
from airflow_rover.operators.model_asset import attach_model_event, outlet_of
from airflow_rover.operators.model_asset import model_asset as default_model_asset
from airflow_rover.operators.serving_export import ensure_saved_model
from airflow_rover.operators.training_params import (
    as_param_dict,
    autoscale_dict,
    check_autoscale,
    check_checkpoint_uri,
    check_flag,
    check_job_args,
    check_job_location,
    check_launcher,
    check_output_dir,
    check_plan_approval,
    check_polling,
    check_static_autoscale,
    check_static_checkpoint,
    check_static_data_workers,
    check_static_model,
    check_static_preprocess,
    check_static_specs,
    checkpoint_config,
    cluster_budget_of,
    dict_or_as_is,
    kubernetes_param,
    rendered_data_workers,
    static_cluster_budget,
    static_data_schema,
    static_features,
)
from airflow_rover.operators.warm_start import decide, rendered_dict, spec_traits
from airflow_rover.storage import StorageError, latest_remote_checkpoint
from airflow_rover.triggers.admission import BudgetAdmissionTrigger
from airflow_rover.triggers.elastic_job import ElasticJobTrigger, job_event
from airflow_rover.worker.preflight import check_model


class _AutoscaleParam(BaseModel):
    """``autoscale`` alone, so that its errors name ``autoscale.<field>``."""

    autoscale: AutoscaleConfig


class ElasticTrainingOperator(BaseOperator):
    """Train a model on parameter servers and workers as an elastic job, deferring while it runs.

    The task is idempotent per run: the job is keyed by dag, task, run id and map index and
    found again in its directory by every try. A retry reattaches to the running job or
    resumes it from its last checkpoint. A cleared or re-triggered task returns the finished
    job's result when the data, the spec and the model code are those it trained
    (``data.fingerprint``), and else trains a new model, which replaces the one published in
    ``output_dir/model`` once it succeeds.

    :param train_data: the training split: a dataset directory, Parquet files (a directory, a
        glob, a Hive-style partition such as ``.../dt={{ ds }}/``) (templated)
    :param eval_data: the held-out split scored at the end, named the same way. (templated)
    :param data_format: ``"auto"`` (by the manifest or the files' extension),
        ``"npy-columns"`` or ``"parquet"`` (``docs/data-formats.md``).
    :param data_schema: the label, dense and categorical columns of Parquet files and how
        each is read (``core.data_schema.DataSchema``); default: inferred from the files.
    :param output_dir: the job directory (model, logs, status); default
        ``$AIRFLOW_HOME/rover/jobs/<dag_id>/<run_id>/<task_id>``, on Kubernetes
        ``<kubernetes.job_volume_mount_path>/jobs/...``. (templated)
    :param model: a reference model (``"wide_deep"``) or ``"package.module:factory"``. (templated)
    :param preprocess: ``"package.module:function"``, a function from each ``Batch`` read from
        the data to the ``Batch`` the model trains on: the same rows and columns, ids within
        each column's vocabulary, deterministic. Trainers, data workers, the evaluator and the
        preflight run it; the SavedModel does not (it takes preprocessed features).
        (templated; ``docs/data-workers.md``)
    :param data_workers: processes that prepare the trainers' batches (read, preprocess,
        look up ids) so that the trainers only train: ``None``, ``0`` or ``"off"``: none;
        ``n``: n of them; ``"auto"``: as many as the trainers' input wait asks, within the
        default bounds; or a dict of ``DataWorkersConfig``'s fields, e.g. ``{"mode": "auto",
        "min": 1, "max": 4}`` (``min``/``max`` without ``mode``: auto), ``cpu``,
        ``memory_mb``, ``ready_batches``, ``interval_s``. (templated)
    :param plan: initial resources: ``num_workers``, ``num_ps``, ``worker_cpu``,
        ``worker_memory_mb``, ``ps_cpu``, ``ps_memory_mb``, ``sizes`` (nodes sized apart, e.g.
        ``[{"node": "ps-0", "cpu": 4}]``); or a template rendering to such a
        dict, e.g. a ``WarmStartOperator``'s ``"{{ ti.xcom_pull('warm_start')['plan'] }}"``.
        With ``warm_start`` this is the cold-start plan. (templated)
    :param training: ``batch_size``, ``epochs``, ``learning_rate``, ``shard_size``, ``seed``.
        (templated)
    :param recovery: ``checkpoint_interval_s``, ``max_node_restarts``, ``max_shard_failures``,
        ``max_master_restarts``: how much failure the job absorbs before the task fails; a
        retry of the task resumes from the last checkpoint and the shard queue.
        ``standby_ps``: keep a spare PS process that takes over a lost PS at once (local
        nodes). ``deterministic_after``: the same exception this often fails the task at once,
        without retry. (templated)
    :param features: embedding tables and dense features; default: one table per column.
    :param embedding_dim: width of the default tables.
    :param launcher: where the job runs: ``"local"`` (processes on the Airflow worker's host)
        or ``"kubernetes"`` (pods; needs ``kubernetes``).
    :param kubernetes: the pods' settings with ``launcher="kubernetes"``: ``image``,
        ``job_volume_claim`` (required), ``namespace``, ``job_volume_mount_path``,
        ``node_selector``, ``tolerations``, ``image_pull_secrets``, ``env``, ``volumes``,
        ``volume_mounts``, ... (``KubernetesConfig``, ``docs/kubernetes.md``). Validated but
        unused with the local launcher, so ``launcher`` alone switches a DAG. (templated)
    :param kubernetes_conn_id: the cncf-kubernetes connection to the cluster (in-cluster or a
        kubeconfig); default ``kubernetes_default``. (templated)
    :param poll_interval: seconds between the trigger's polls of the master.
    :param max_runtime: how long a try's job may run: its deadline is set this long after it
        is submitted, and there its master stops it (state ``stopped``) and the try fails. A
        retry does not reattach to a job past its deadline: it submits the job again with a
        deadline of its own, resuming from the last checkpoint.
    :param warm_start: start from the smoothed final plans of the most similar past jobs in the
        history store (as ``WarmStartOperator`` does; ``plan`` without history), and the
        autoscaler from their prior (``autoscale.prior``, unless given); the decision is pushed
        to XCom under ``warm_start``.
    :param history_conn_id: connection to the history database, where every ended job is
        recorded; default SQLite in ``$AIRFLOW_HOME/rover/history.db``. (templated)
    :param cluster_budget: share a resource budget with the jobs of other tasks and DAGs that
        name the same budget: ``{"name": "default", "cpu": 64, "memory_mb": 262144}`` (give
        ``cpu``, ``memory_mb`` or both). The job starts only when the cluster arbiter admits
        its plan (until then the task is deferred, holding no worker slot), its optimizer's
        scale-ups are applied only when the arbiter selects them, and it may be shrunk for a
        job of higher ``autoscale.weight``; the registry is in the history database. Default
        ``"auto"``: ``[rover] cluster_budget`` from the Airflow configuration, else with the
        local launcher this host's memory (``operators.budget_admission``); ``None``: no
        budget, every proposal is applied. (templated)
    :param model_asset: the Airflow Asset this task updates when its job succeeds (an
        ``airflow.sdk.Asset`` or its URI); its event carries the AUC, samples, model URI and
        data interval. Default: ``model_asset(dag_id, task_id, output_dir)``,
        ``file://<output_dir>/model`` for a literal ``output_dir``.
    :param export_saved_model: after the job succeeds, write the model's TensorFlow SavedModel
        into its folder (``model/saved_model``) before the task succeeds.
    :param autoscale: the job's optimizer (``AutoscaleConfig``): ``enabled``, bounds
        (``min_workers``, ``max_workers``, ``min_ps``, ``max_ps``, ``min_worker_cpu``,
        ``max_worker_cpu``, ``min_ps_cpu``, ``max_ps_cpu``, ``min_ps_memory_mb``,
        ``max_ps_memory_mb``; ``plan`` must lie within them), cooldowns
        (``min_plan_interval_s`` after an applied plan, ``decline_cooldown_s`` after a declined
        one), ``plan_approval`` (proposals wait for a person to approve or decline them, from
        the Airflow UI or the hook; not with ``cluster_budget``), ``pending_timeout_s`` (a
        node pod not scheduled this long gets a smaller plan), ``weight`` (the job's
        weight in a shared cluster budget), ``admit_at_minimum`` (start with
        ``min_workers`` workers when the plan does not fit the budget) and ``prior`` (where the
        optimizer starts, from similar past jobs: a ``WarmStartOperator``'s
        ``"{{ ti.xcom_pull('warm_start')['prior'] }}"``). (templated)
    :param stream_logs: while the task is deferred, its log shows the new lines of the job's
        master and nodes, prefixed by node (``[worker-1] ...``), at a bounded rate (the HTTP
        client's request lines left out); the whole logs stay in ``<output_dir>/logs``.

    .. seealso:: ``docs/warm-start.md``, ``docs/operators.md`` (Sharing a cluster budget),
        ``docs/serving.md`` (the SavedModel and the Asset)
    """

    template_fields: Sequence[str] = (
        "train_data",
        "eval_data",
        "output_dir",
        "model",
        "preprocess",
        "plan",
        "training",
        "recovery",
        "autoscale",
        "data_workers",
        "checkpoint_policy",
        "checkpoint_options",
        "checkpoint_uri",
        "aws_conn_id",
        "history_conn_id",
        "cluster_budget",
        "kubernetes",
        "kubernetes_conn_id",
        "init_from",
        "evict_after_days",
    )
    template_fields_renderers = {
        "kubernetes": "json",
        "plan": "json",
        "training": "json",
        "recovery": "json",
        "autoscale": "json",
        "data_workers": "json",
        "checkpoint_options": "json",
        "cluster_budget": "json",
    }
    ui_color = "#d9f2e6"
    operator_extra_links = (ElasticJobLink(),)
    external_id_key = "rover_job_dir"

    def __init__(
        self,
        *,
        train_data: str,
        eval_data: str | None = None,
        data_format: str = "auto",
        data_schema: dict[str, Any] | DataSchema | None = None,
        output_dir: str | None = None,
        model: str = "wide_deep",
        preprocess: str | None = None,
        data_workers: dict[str, Any] | DataWorkersConfig | int | str | None = None,
        plan: dict[str, Any] | ResourcePlan | str | None = None,
        training: dict[str, Any] | TrainingConfig | None = None,
        recovery: dict[str, Any] | RecoveryConfig | None = None,
        autoscale: dict[str, Any] | AutoscaleConfig | str | None = None,
        checkpoint_policy: str = "full",
        checkpoint_options: dict[str, Any] | None = None,
        checkpoint_uri: str | None = None,
        aws_conn_id: str | None = None,
        features: dict[str, Any] | FeatureConfig | None = None,
        embedding_dim: int = 16,
        launcher: str = "local",
        poll_interval: float = 5.0,
        max_runtime: timedelta = timedelta(hours=12),
        warm_start: bool = False,
        history_conn_id: str | None = None,
        cluster_budget: dict[str, Any] | ClusterBudget | str | None = AUTO_BUDGET,
        kubernetes: dict[str, Any] | KubernetesConfig | str | None = None,
        kubernetes_conn_id: str | None = None,
        init_from: str | None = None,
        evict_after_days: int | str | None = None,
        model_asset: Asset | str | None = None,
        export_saved_model: bool = True,
        stream_logs: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        owner = self._owner
        check_job_args(owner, warm_start, train_data)
        check_flag(owner, "stream_logs", stream_logs)
        check_launcher(owner, launcher, kubernetes, kubernetes_conn_id)
        check_polling(owner, poll_interval, max_runtime)
        check_checkpoint_uri(owner, checkpoint_uri)
        check_job_location(owner, output_dir, embedding_dim)
        check_init_option(owner, init_from, evict_after_days)
        if init_from and checkpoint_policy == "ecrm":
            raise ValueError(
                f"{owner}: init_from with checkpoint_policy='ecrm': ECRM's parity assumes rows "
                "start from their seeded values; use 'full' or 'cpr' to continue a model"
            )
        self.init_from = init_from
        self.evict_after_days = evict_after_days
        self.train_data = train_data
        self.eval_data = eval_data
        self.data_format = data_format
        self.data_schema = static_data_schema(owner, data_schema)
        self.output_dir = output_dir
        self.model = model
        self.preprocess = preprocess
        self.data_workers: Any = (
            data_workers.model_dump()
            if isinstance(data_workers, DataWorkersConfig)
            else data_workers
        )
        self.plan: dict[str, Any] | str = as_param_dict(plan, ResourcePlan)
        self.training: dict[str, Any] = as_param_dict(training, TrainingConfig)
        self.recovery: dict[str, Any] = as_param_dict(recovery, RecoveryConfig)
        self.autoscale: dict[str, Any] | str = as_param_dict(autoscale, AutoscaleConfig)
        self.checkpoint_policy = checkpoint_policy
        self.checkpoint_options = checkpoint_options or {}
        self.checkpoint_uri = checkpoint_uri
        self.aws_conn_id = aws_conn_id
        self.features = static_features(owner, features)
        self.embedding_dim = embedding_dim
        self.launcher = launcher
        self.poll_interval = float(poll_interval)
        self.max_runtime = max_runtime
        self.warm_start = warm_start
        self.history_conn_id = history_conn_id
        self.cluster_budget = static_cluster_budget(owner, cluster_budget)
        self.kubernetes = kubernetes_param(kubernetes)
        self.kubernetes_conn_id = kubernetes_conn_id
        self._launched_job_dir: str | None = None
        self._admitted_plan: ResourcePlan | None = None  # set when resumed from admission
        default_asset = default_model_asset(self.dag_id, self.task_id, output_dir)
        self.model_asset = outlet_of(owner, model_asset, default_asset)
        self.add_outlets([self.model_asset])
        self.export_saved_model = bool(export_saved_model)
        self.stream_logs = stream_logs
        # Validate now (DAG parse time) whatever is not a template; the rest after rendering.
        check_static_specs(owner, self.plan, self.training, self.recovery)
        check_static_autoscale(owner, self.autoscale, self.plan, cluster_budget)
        check_static_checkpoint(owner, checkpoint_policy, self.checkpoint_options)
        check_static_model(owner, model)
        check_static_preprocess(owner, preprocess)
        check_static_data_workers(owner, self.data_workers)

    @property
    def _owner(self) -> str:
        """How error messages name this task."""
        return f"{type(self).__name__}(task_id={self.task_id!r})"

    # -- building the job --------------------------------------------------------------------
    def _spec_or_raise(self, job_id: str, train_data: str, eval_data: str | None) -> JobSpec:
        try:
            checkpoint = checkpoint_config(
                self.checkpoint_policy, rendered_dict(self.checkpoint_options, "checkpoint_options")
            )
            spec = JobSpec.model_validate(  # one validation: errors say plan.x / recovery.y
                {
                    "job_id": job_id,
                    "train_data": train_data,
                    "eval_data": eval_data,
                    "data_format": self.data_format,
                    "data_schema": self.data_schema,
                    "model": self.model,
                    "preprocess": self.preprocess or None,
                    "data_workers": rendered_data_workers(self.data_workers),
                    "features": self.features,
                    "embedding_dim": self.embedding_dim,
                    "plan": dict_or_as_is(self.plan),
                    "training": self.training,
                    "recovery": self.recovery,
                    "checkpoint": checkpoint,
                    "checkpoint_uri": self.checkpoint_uri or None,
                    "autoscale": autoscale_dict(self.autoscale),
                }
            )
            checkpoint.check_cluster(spec.plan.num_ps)
            check_autoscale(self._owner, spec.autoscale, spec.plan)
            check_plan_approval(self._owner, spec.autoscale, self.cluster_budget)
            return spec
        except ValidationError as exc:
            raise ValueError(f"{self._owner}: {describe(exc)}") from None

    def job_dir(self, context: Context) -> Path:
        if self.output_dir:
            try:
                check_output_dir(self._owner, self.output_dir)  # as rendered
            except ValueError as exc:
                raise AirflowFailException(str(exc)) from None
            return Path(self.output_dir)
        ti = context["ti"]
        index = ti.map_index if ti.map_index is not None else -1
        task = self.task_id if index < 0 else f"{self.task_id}.{index}"
        k8s = self.kubernetes_job()  # on Kubernetes: on the volume the pods mount
        root = Path(k8s.config.job_volume_mount_path) / "jobs" if k8s else default_jobs_root()
        return root / path_segment(ti.dag_id) / path_segment(ti.run_id) / path_segment(task)

    def build_spec(self, context: Context) -> JobSpec:
        ti = context["ti"]
        index = ti.map_index if ti.map_index is not None else -1
        job_id = job_id_for(ti.dag_id, ti.task_id, ti.run_id, index)
        try:
            return self._spec_or_raise(job_id, self.train_data, self.eval_data or None)
        except ValueError as exc:  # a rendered template is invalid: retrying cannot fix it
            raise AirflowFailException(str(exc)) from exc

    def rendered_cluster_budget(self) -> dict[str, Any] | None:
        """The rendered ``cluster_budget`` as the trigger takes it (``"auto"`` resolved); a
        bad one fails the task without retries."""
        if self.cluster_budget is None:
            return None
        owner = self._owner
        try:
            if self.cluster_budget == AUTO_BUDGET:
                return default_cluster_budget(self.launcher, self.rendered_autoscale())
            budget = cluster_budget_of(owner, rendered_dict(self.cluster_budget, "cluster_budget"))
        except ValueError as exc:
            message = str(exc) if owner in str(exc) else f"{owner}: {exc}"
            raise AirflowFailException(message) from None
        return budget.model_dump(mode="json")

    def rendered_autoscale(self) -> AutoscaleConfig:
        """The rendered ``autoscale``; a bad one fails the task without retries, naming
        ``autoscale.<field>``."""
        try:
            value = {"autoscale": autoscale_dict(self.autoscale)}
            return _AutoscaleParam.model_validate(value).autoscale
        except ValidationError as exc:
            message = describe(exc, AutoscaleConfig)  # autoscale.<field>: ...
            raise AirflowFailException(f"{self._owner}: {message}") from None

    def kubernetes_job(self) -> KubernetesJob | None:
        """The rendered Kubernetes settings (None with the local launcher); a bad rendered
        value fails the task without retries."""
        if self.launcher != "kubernetes":
            return None
        owner = self._owner
        try:
            config = parse_config(owner, dict_or_as_is(self.kubernetes, "kubernetes"))
        except ValueError as exc:
            raise AirflowFailException(str(exc)) from None
        return KubernetesJob(config=config, kubernetes_conn_id=self.kubernetes_conn_id or None)

    def hook_for(self, job_dir: str | Path, backend: JobBackend | None = None) -> ElasticJobHook:
        return ElasticJobHook(job_dir, backend=backend)

    # -- running the job ---------------------------------------------------------------------
    def execute(self, context: Context) -> dict[str, Any]:
        """Follow the job an earlier try left running (its directory is in the task's
        ``task_state_store``), else submit one; then wait for it and return its result."""
        ElasticJobLink.persist(context["ti"])
        store = context.get("task_state_store")
        earlier = store.get(self.external_id_key) if store is not None else None
        if earlier and self.is_job_active(self.get_job_status(earlier, context)):
            self.log.info("Reattaching to the job in %s, still running", earlier)
            job_dir = str(earlier)
        else:
            job_dir = self.submit_job(context)
            if store is not None:
                store.set(self.external_id_key, job_dir)
        self.poll_until_complete(job_dir, context)
        return self.get_job_result(job_dir, context)

    def submit_job(self, context: Context) -> str:
        """Launch the job in the task's directory, or resume, follow or return the one there
        (``operators.job_rerun``). Returns the job directory."""
        job_dir = self.job_dir(context)
        spec = self.build_spec(context)
        os.environ.update(self._data_env(spec))  # preflight reads data on S3 as the job does
        os.environ[ENV_INDEX_DIR] = str(job_index_dir(job_dir))  # its offset indexes: the job's
        self.rendered_cluster_budget()  # a bad budget fails before any process starts
        try:  # what a retry cannot fix fails the task, before any process starts
            features = check_data(spec)
            spec = self._incremental(context, spec, features)
            spec = spec.model_copy(update={"fingerprint": training_fingerprint(spec)})
            hook = self.hook_for(job_dir)
            decision = rerun_decision(hook.job_dir, spec, hook.get_status())
            self.log.info("%s", decision.message)
            if decision.rerun in (Rerun.REATTACH, Rerun.RETURN):
                context["ti"].xcom_push(key="job_dir", value=str(job_dir))
                return str(job_dir)
            check_model(spec, features)  # built and called on real rows, as a worker does
        except (PreflightError, JobDirInUse, OSError, ValueError) as exc:
            raise AirflowFailException(f"{self.task_id}: {exc}") from exc
        context["ti"].xcom_push(key="job_dir", value=str(job_dir))
        if decision.rerun is Rerun.RETRAIN:
            hook.stop("a new job replaces it: its data, spec or model code changed")
            clear_job(hook.job_dir)
        self._launch(context, job_dir, spec, decision.replaced)
        return str(job_dir)

    def _launch(self, context: Context, job_dir: Path, spec: JobSpec, replaced: str | None) -> None:
        """Complete ``spec`` (warm start, failure rate, deadline) and launch its job
        (``replaced``: the id of the job it replaces in ``job_dir``)."""
        if self.warm_start:
            spec = self._warm_started(context, spec)
        spec = self._with_failure_rate(context, spec)
        spec = self._admitted(context, job_dir, spec)  # or defer until the budget admits it
        k8s = self.kubernetes_job()
        if k8s is not None:  # the pods must see the job dir and the data
            paths = {
                "output_dir": str(job_dir),
                "train_data": spec.train_data,
                "eval_data": spec.eval_data,
            }
            try:
                check_visible(self._owner, k8s.config, paths)
            except ValueError as exc:
                raise AirflowFailException(str(exc)) from None
        env = {**self._data_env(spec), **self._storage_env(spec, k8s is not None, replaced)}
        spec = spec.model_copy(update={"deadline": JobDeadline.after(self.max_runtime)})
        self._launched_job_dir = str(job_dir)
        try:
            self.hook_for(job_dir, backend_named(self.launcher, k8s)).launch(spec, env)
        except (KubernetesPermissionError, JobDirInUse) as exc:  # a retry cannot fix them
            self._give_back_admission(spec)
            raise AirflowFailException(f"{self.task_id}: {exc}") from exc
        except BaseException:
            self._give_back_admission(spec)
            raise
        self._index_launch(context, job_dir, spec)

    # -- the cluster budget's admission ------------------------------------------------------
    def _admitted(self, context: Context, job_dir: Path, spec: JobSpec) -> JobSpec:
        """``spec`` with the plan its cluster budget admits; while the budget has no room the
        task defers to ``BudgetAdmissionTrigger`` (nothing launched, no worker slot held) and
        resumes in ``execute_admitted``. A waiting job is listed in the UI already."""
        rendered = self.rendered_cluster_budget()
        if rendered is None:
            return spec
        if self._admitted_plan is not None:
            return spec.model_copy(update={"plan": self._admitted_plan})
        budget = ClusterBudget.model_validate(rendered)
        try:
            check_fits_budget(self._owner, spec, budget)
        except ValueError as exc:
            raise AirflowFailException(str(exc)) from None
        now = time.time()
        request = admission_request(
            spec, budget, now, _samples_to_train(spec), ttl_for(self.poll_interval)
        )
        try:
            with self.history_hook().get_conn() as store:
                decision = RunningJobRegistry(store).admit(request, budget, now)
        except Exception as exc:  # the registry is down: a retry asks again
            raise AirflowException(
                f"{self.task_id}: cluster budget {budget.name!r}: the job registry is "
                f"unavailable ({type(exc).__name__}: {exc})"
            ) from exc
        admission = decision.admissions[spec.job_id]
        if admission.plan is not None:
            self.log.info("Admitted to cluster budget %r: %s", budget.name, admission.reason)
            return spec.model_copy(update={"plan": admission.plan})
        self.log.info(
            "Job %s waits for cluster budget %r, deferred and holding nothing: %s",
            spec.job_id,
            budget.name,
            admission.reason,
        )
        self._index_launch(context, job_dir, spec)
        self.defer(
            trigger=BudgetAdmissionTrigger(
                job_id=spec.job_id,
                cluster_budget=rendered,
                plan=request.plan.model_dump(),
                waiting_since=now,
                history_conn_id=self.history_conn_id or None,
                min_plan=request.min_plan.model_dump() if request.min_plan else None,
                weight=request.weight,
                remaining_samples=request.remaining_samples,
                poll_interval=self.poll_interval,
                data_workers=list(request.data_workers),
            ),
            method_name="execute_admitted",
            timeout=self.max_runtime,
        )

    def execute_admitted(
        self, context: Context, event: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Resume once the cluster budget admitted the job: launch it with the admitted plan
        and wait for it, as ``execute`` does."""
        if not event or event.get("status") != "admitted":
            message = (event.get("message") if event else None) or repr(event)
            raise AirflowException(
                f"{self.task_id}: waiting for the cluster budget failed: {message}"
            )
        self._admitted_plan = ResourcePlan.model_validate(event["plan"])
        self.log.info(
            "Admitted to the cluster budget after waiting %s s (the last reason: %s): %s",
            event.get("waited_s"),
            event.get("waited_for"),
            event.get("reason"),
        )
        return self.execute(context)

    def _give_back_admission(self, spec: JobSpec) -> None:
        """The job did not launch: its reservation leaves the budget at once."""
        if self.rendered_cluster_budget() is None:
            return
        try:
            with self.history_hook().get_conn() as store:
                RunningJobRegistry(store).remove(spec.job_id)
        except Exception as exc:  # its TTL frees it anyway
            self.log.warning("Could not give the job's budget reservation back: %s", exc)

    def _index_launch(self, context: Context, job_dir: Path, spec: JobSpec) -> None:
        """Record the launch where the UI lists jobs from; the job runs without it."""
        ti = context["ti"]
        launch = Launch(
            job_id=spec.job_id,
            dag_id=ti.dag_id,
            task_id=ti.task_id,
            run_id=ti.run_id,
            map_index=ti.map_index if ti.map_index is not None else -1,
            try_number=ti.try_number,
            job_dir=str(job_dir),
            launcher=self.launcher,
            model=spec.model,
            checkpoint_policy=spec.checkpoint.policy,
            plan_approval=spec.autoscale.plan_approval,
            cluster_budget=self.rendered_cluster_budget(),
        )
        try:
            with self.history_hook().get_conn() as store:
                LaunchIndex(store).record(launch)
        except Exception as exc:  # the history database is down: the job is not affected
            self.log.warning("The job is not listed in the UI's index: %s", exc)

    def _storage_env(
        self, spec: JobSpec, on_kubernetes: bool, replaced: str | None
    ) -> dict[str, str]:
        """The durable store's credentials (``aws_conn_id``) for the job's master, resolved
        here in the task: they go to the master's environment only, never to the job files,
        the logs or XCom. A store that cannot be opened fails the task before any process.
        ``replaced``: the job this one replaces, whose checkpoints there are deleted."""
        if spec.checkpoint_uri is None:
            return {}
        self._check_store_is_this_jobs(spec, replaced)
        if not self.aws_conn_id:
            return {}
        if on_kubernetes:
            raise AirflowFailException(
                f"{self.task_id}: aws_conn_id with launcher='kubernetes': give the master pod's "
                "service account access to the bucket (e.g. IRSA) and leave aws_conn_id unset"
            )
        try:
            return CheckpointStoreHook(self.aws_conn_id).aws_settings().to_env()
        except ValueError as exc:
            raise AirflowFailException(f"{self.task_id}: {exc}") from None

    def _data_env(self, spec: JobSpec) -> dict[str, str]:
        """The S3 credentials (``aws_conn_id``) of a job whose data is on S3, for the task's
        preflight and for the job's master, workers and evaluator (environment only)."""
        if not self.aws_conn_id or not reads_s3(spec):
            return {}
        if self.launcher == "kubernetes":
            raise AirflowFailException(
                f"{self.task_id}: aws_conn_id with data on S3 and launcher='kubernetes': give "
                "the pods' service account access to the bucket (e.g. IRSA) and leave "
                "aws_conn_id unset"
            )
        try:
            return CheckpointStoreHook(self.aws_conn_id).aws_settings().to_env()
        except ValueError as exc:
            raise AirflowFailException(f"{self.task_id}: aws_conn_id: {exc}") from None

    def _check_store_is_this_jobs(self, spec: JobSpec, replaced: str | None) -> None:
        """A job resumes from the newest checkpoint at ``checkpoint_uri`` (a retry, another
        machine) and keeps the last two there: one of another job would be resumed from or
        deleted. So the newest one there must be this job's (or none), or the ``replaced``
        job's: a new job deletes those."""
        assert spec.checkpoint_uri is not None
        try:
            store = CheckpointStoreHook(self.aws_conn_id).get_store(spec.checkpoint_uri)
            latest = latest_remote_checkpoint(store)
            raw = store.read_bytes(f"{latest.name}/queue.json") if latest else None
            owner = json.loads(raw).get("job_id") if raw else spec.job_id
            if replaced is not None and owner in (spec.job_id, replaced) and raw:
                deleted = clear_stored_checkpoints(store)
                self.log.info(
                    "Deleted the replaced job's %d checkpoint(s) at %s", deleted, store.uri
                )
                owner = spec.job_id
        except (ValueError, StorageError) as exc:
            raise AirflowFailException(f"{self.task_id}: checkpoint_uri: {exc}") from None
        if owner != spec.job_id:
            whose = f"job {owner!r}" if owner else "no job (their queue.json names none)"
            raise AirflowFailException(
                f"{self.task_id}: checkpoint_uri={spec.checkpoint_uri!r} holds checkpoints of "
                f"{whose}, not of {spec.job_id!r}: give each run its own prefix, e.g. "
                "'s3://bucket/ctr/{{ ds }}'"
            )

    def get_job_status(self, external_id: Any, context: Context) -> str:
        """The job's state, asked on a retry. A job still running past its deadline is stopped
        and reported ``stopped``: the retry submits it again rather than reattaching."""
        hook = self.hook_for(external_id)
        state = str(hook.get_status()["state"])
        deadline = hook.get_deadline() if self.is_job_active(state) else None
        if deadline is None or not deadline.passed():
            return state
        reason = deadline.stop_reason()
        self.log.warning("Job in %s: %s; this try submits it again", external_id, reason)
        hook.stop(reason)
        return str(JobState.STOPPED)

    def is_job_active(self, status: str) -> bool:
        return status in ACTIVE_STATES or status == "unreachable"

    def is_job_succeeded(self, status: str) -> bool:
        return status == JobState.SUCCEEDED

    def poll_until_complete(self, external_id: Any, context: Context) -> None:
        """Check once, then defer until the job's deadline and a grace (by then its master
        has stopped it): a job that already ended is handled without deferring."""
        hook = self.hook_for(external_id)
        job = hook.get_status()
        if job["state"] == JobState.SUCCEEDED:
            return
        if job["state"] in (JobState.FAILED, JobState.STOPPED):
            self._record(context, job)
            raise_job_ended(job.get("job_id"), job["state"], job.get("message"), job.get("failure"))
        budget = self.rendered_cluster_budget()
        self.defer(
            trigger=ElasticJobTrigger(
                job_dir=str(external_id),
                poll_interval=self.poll_interval,
                stop_on_kill=True,
                apply_plans=not self.rendered_autoscale().plan_approval,  # else a person does
                cluster_budget=budget,
                history_conn_id=(self.history_conn_id or None) if budget else None,
                stream_logs=self.stream_logs,
            ),
            method_name="execute_complete",
            timeout=deferral_timeout(hook.get_deadline(), self.max_runtime, self.poll_interval),
        )

    def get_job_result(self, external_id: Any, context: Context) -> dict[str, Any]:
        job = self.hook_for(external_id).get_status()
        return self.execute_complete(context, job_event(event_status_of(job), job))

    # -- resuming ----------------------------------------------------------------------------
    def execute_complete(
        self, context: Context, event: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Resume after the trigger: raise with the master's message unless the job succeeded."""
        if not event or "status" not in event:
            raise AirflowException(f"Trigger for task {self.task_id} returned no event: {event!r}")
        job = event.get("job")
        if isinstance(job, dict) and job.get("state") in TERMINAL_STATES:
            self._record(context, job)
        if event["status"] != "success":
            failure = event.get("failure") or (
                job.get("failure") if isinstance(job, dict) else None
            )
            raise_job_ended(event.get("job_id"), event["status"], event.get("message"), failure)
        result = job_result(event["job"])
        if self.export_saved_model and result.get("model_dir"):
            ensure_saved_model(result["model_dir"], self.log)
        data = {"train_data": self.train_data, "eval_data": self.eval_data or None}
        extra = attach_model_event(self.model_asset, result, context, data)
        self.log.info("Model asset %s updated: %s", self.model_asset.uri, extra)
        return result

    def on_kill(self) -> None:
        """The task process is being killed: stop the job so nothing is orphaned."""
        if self._launched_job_dir is not None:
            self.hook_for(self._launched_job_dir).stop("the Airflow task was killed")

    # -- history (warm start in, job record out) ---------------------------------------------
    def history_hook(self) -> HistoryStoreHook:
        return HistoryStoreHook(self.history_conn_id or None)

    def _warm_started(self, context: Context, spec: JobSpec) -> JobSpec:
        """The spec with the warm-start plan (its own plan is the cold start) and, unless the
        user gave one, the autoscaler's prior from the same past jobs (``autoscale.prior``);
        the decision goes to XCom under ``warm_start``."""
        ti = context["ti"]
        try:
            traits = spec_traits(spec, ti.dag_id, ti.task_id)
        except (OSError, ValueError):  # preflight read the data; only a race gets here
            traits = JobTraits.of(spec.model, spec.features, None, ti.dag_id, ti.task_id)
        capacity = float(os.cpu_count() or 1) if self.launcher == "local" else None
        refinement = refinement_for(spec, capacity)
        decision = decide(self.history_hook(), traits, spec.plan, refinement=refinement)
        decision = within_bounds(decision, spec.autoscale)
        self.log.info("Warm start (%s): %s", decision.source, decision.message)
        self.log.info("Initial plan: %s", decision.plan.model_dump())
        ti.xcom_push(key="warm_start", value=decision.to_xcom())
        if spec.autoscale.prior is not None or decision.prior is None:  # the user's stays
            return spec.model_copy(update={"plan": decision.plan})
        autoscale = spec.autoscale.model_copy(update={"prior": decision.prior})
        return spec.model_copy(update={"plan": decision.plan, "autoscale": autoscale})

    def _incremental(self, context: Context, spec: JobSpec, features: FeatureConfig) -> JobSpec:
        """The spec with its day and, with ``init_from``, the model it starts from (checked
        against its layout; ``NoModelToStartFrom`` otherwise); pushed to XCom as ``init_from``."""
        ti = context["ti"]
        evict_days = incremental.rendered_days(self._owner, self.evict_after_days)
        wanted = incremental.rendered_source(self.init_from)
        check_init_option(self._owner, wanted, evict_days)
        source = incremental.resolve(wanted, evict_days, self.history_hook(), ti)
        if source is not None:
            incremental.check_compatible(source, spec, features)
            self.log.info("Starting from %s: %s", source.origin, source.location)
        elif wanted:
            self.log.info(
                "init_from=%r: no successful run of %s.%s in the history store; training "
                "from scratch",
                wanted,
                ti.dag_id,
                ti.task_id,
            )
        ti.xcom_push(key="init_from", value=source.model_dump() if source else None)
        return spec.model_copy(update={"init": source, "day": incremental.job_day(context)})

    def _with_failure_rate(self, context: Context, spec: JobSpec) -> JobSpec:
        """The spec with ``checkpoint.mtbf_s`` from this task's past runs in the history store
        (PS failures per PS-second), unless the user gave one: the job then plans its
        checkpoint interval (and CPR's benefit check) from it and the costs it measures, and
        says when another policy would be cheaper. No history, no change."""
        if spec.checkpoint.mtbf_s is not None:
            return spec
        ti = context["ti"]
        try:
            runs = self.history_hook().get_conn().failure_history(ti.dag_id, ti.task_id)
        except Exception as exc:  # planning without it is the default anyway
            self.log.warning("No failure history (%s); checkpoints at the given interval", exc)
            return spec
        evidence = FailureEvidence.of(runs)
        mtbf = evidence.mtbf_s(spec.plan.num_ps)
        if mtbf is None:
            return spec
        self.log.info(
            "Failure rate of this task: %s. The job plans its checkpoint interval from it and "
            "the save time it measures, never shorter than %s",
            evidence.describe(spec.plan.num_ps),
            describe_floor(spec.recovery.checkpoint_interval_s),
        )
        checkpoint = spec.checkpoint.model_copy(update={"mtbf_s": mtbf})
        return spec.model_copy(update={"checkpoint": checkpoint})

    def _record(self, context: Context, job: dict[str, Any]) -> None:
        """Record the ended job in the history store: an upsert by job id, so a retry or a
        second ``execute_complete`` replaces the record (with every data-worker decision of the
        job's ``state.json``: an event carries the last few). A history failure is only
        logged."""
        try:
            ti = context["ti"]
            job_dir = self.hook_for(self.job_dir(context)).job_dir
            spec = job_dir.read_spec()
            job = with_decisions_from(job, job_dir.read_json(job_dir.state_file))
            record = record_from_status(
                job,
                spec,
                features=_resolved_features(job_dir, spec),
                dag_id=ti.dag_id,
                task_id=ti.task_id,
                run_id=ti.run_id,
                map_index=ti.map_index if ti.map_index is not None else -1,
                try_number=getattr(ti, "try_number", None),
            )
            self.history_hook().record_job(record)
        except Exception as exc:  # the job's outcome matters more than its history entry
            self.log.warning(
                "Could not record job %s in the history store: %s", job.get("job_id"), exc
            )


def _samples_to_train(spec: JobSpec) -> float:
    """Samples the job will train (its WG in the arbiter); 0 when the data cannot say."""
    try:
        return float(open_split(spec, spec.train_data).num_samples * spec.training.epochs)
    except (OSError, ValueError):
        return 0.0


def _resolved_features(job_dir: JobDir, spec: JobSpec) -> FeatureConfig | None:
    """The feature config the job trained with: the spec's, else the saved model's, else the
    default one derived from the dataset; None if none can be read."""
    if spec.features is not None:
        return spec.features
    saved = (job_dir.read_json(job_dir.model_dir / "model.json") or {}).get("features")
    try:
        return FeatureConfig.model_validate(saved) if saved else resolve_features(spec)
    except (OSError, ValueError):
        return None
