"""The job specification: one validated model shared by the operator, the CLI and the master.

Every process of a job (master, parameter servers, workers) reads the same ``JobSpec`` from
``job.json`` in the job directory, so a field validated here is valid everywhere.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Sequence
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from airflow_rover.core.data_schema import DataFormat, DataSchema
from airflow_rover.core.deadline import JobDeadline
from airflow_rover.core.incremental import InitSource
from airflow_rover.core.policies import CheckpointPolicyConfig
from airflow_rover.core.prior_config import AutoscalePrior

REFERENCE_MODELS = ("wide_deep", "deepfm", "dcn", "xdeepfm")
OPTIMIZERS = ("sgd", "adagrad", "adam")
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


ColumnValues = Literal["ids", "ints", "strings"]
TableIndex = Literal["vocab", "ids"]


class TableConfig(_Strict):
    """One embedding input of the model: a categorical column read through a table's rows.

    Entries naming the same ``table`` share its rows (one table read by several columns);
    a list column's rows combine into one per sample by ``pooling``.
    """

    name: str = Field(min_length=1, pattern=r"^[A-Za-z_][\w-]*$")
    column: str = Field(min_length=1, description="categorical column whose ids index the table")
    vocab_size: int = Field(
        gt=0,
        description="index 'vocab': the hashed vocabulary's size, ids lie in [0, vocab_size); "
        "index 'ids': only the expected count of distinct ids (ids are not bounded by it and "
        "the table holds as many rows as ids it has seen)",
    )
    dim: int = Field(gt=0, le=1024)
    pooling: Literal["sum", "mean"] = Field(
        default="sum", description="how a list column's rows combine into one per sample"
    )
    table: str | None = Field(
        default=None,
        min_length=1,
        pattern=r"^[A-Za-z_][\w-]*$",
        description="the table whose rows this entry reads; entries naming the same one share "
        "its rows (and must agree on vocab_size and dim); default: the entry's own name",
    )
    values: ColumnValues = Field(
        default="ids",
        description="the column's raw values: ids already in [0, vocab_size), or ints or "
        "strings hashed into vocab_size buckets (core.hashing); what a served model takes. "
        "Of an index 'ids' table: int64 ids or ints as they are, strings by their 64-bit "
        "hash (a data_schema column with raw=true)",
    )
    multivalued: bool = Field(
        default=False, description="a list column: any number of ids per sample, pooled"
    )
    index: TableIndex = Field(
        default="vocab",
        description="how the PS finds an id's row: 'vocab', ids in [0, vocab_size), 4 bytes "
        "per possible id on every PS; 'ids', any int64 id (a raw 64-bit user or item id) its "
        "own row, no two ids sharing one, memory for the rows held (docs/embedding-tables.md)",
    )

    @model_serializer(mode="wrap")
    def _without_default_index(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A 'vocab' table dumps as it always did: job.json and training fingerprints of
        jobs without 'ids' tables stay the same, so their checkpoints still resume."""
        data: dict[str, Any] = handler(self)
        if self.index == "vocab":
            data.pop("index", None)
        return data

    @property
    def rows_of(self) -> str:
        """The name of the table whose rows this entry reads."""
        return self.table or self.name


class FeatureConfig(_Strict):
    """Which dense features and embedding tables the model sees."""

    num_dense: int = Field(ge=0)
    tables: tuple[TableConfig, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> FeatureConfig:
        names = [t.name for t in self.tables]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"features.tables: duplicate table names {dupes}")
        shape: dict[str, tuple[int, int, str]] = {}
        for t in self.tables:
            first = shape.setdefault(t.rows_of, (t.vocab_size, t.dim, t.index))
            if first != (t.vocab_size, t.dim, t.index):
                raise ValueError(
                    f"features.tables: {t.name!r} shares table {t.rows_of!r} with vocab_size "
                    f"{t.vocab_size}, dim {t.dim} and index {t.index!r}, where another entry "
                    f"has {first[0]}, {first[1]} and {first[2]!r}: entries sharing a table "
                    "agree on all three"
                )
        return self

    @property
    def id_tables(self) -> tuple[str, ...]:
        """Names of the tables keyed by raw ids (index 'ids'), in order of first appearance."""
        return tuple(dict.fromkeys(t.rows_of for t in self.tables if t.index == "ids"))


WorkerCount = Annotated[int, Field(ge=1, le=1024)]
EmbeddingDim = Annotated[int, Field(gt=0, le=1024)]
PsCount = Annotated[int, Field(ge=1, le=256)]


NodeCores = Annotated[float, Field(gt=0, le=256)]
NodeMemoryMb = Annotated[int, Field(ge=256)]
_SIZED_NODE = re.compile(r"^(ps|worker)-(0|[1-9]\d*)$")


def node_role_index(node_id: str) -> tuple[str, int]:
    """("ps" or "worker", index) of a PS or worker id; an evaluator is sized as a worker."""
    role, _, index = node_id.rpartition("-")
    if role == "evaluator" and index.isdigit():
        return "worker", int(index)
    if not _SIZED_NODE.match(node_id):
        raise ValueError(f"node {node_id!r}: expected 'ps-N' or 'worker-N' (N = 0, 1, ...)")
    return role, int(index)


class NodeSize(_Strict):
    """One node sized apart from its role (a hot PS's bigger node, a node that came back from
    an OOM with more memory); a field left out is the role's."""

    node: str = Field(pattern=_SIZED_NODE.pattern, description="'ps-N' or 'worker-N'")
    cpu: NodeCores | None = None
    memory_mb: NodeMemoryMb | None = None

    @model_validator(mode="after")
    def _some_size(self) -> NodeSize:
        if self.cpu is None and self.memory_mb is None:
            raise ValueError(f"plan.sizes: {self.node} gives neither cpu nor memory_mb")
        return self


class ResourcePlan(_Strict):
    """How many nodes of each role and how big: what the optimizer proposes and launchers apply.
    ``sizes``: nodes sized apart from their role's size."""

    num_workers: WorkerCount = 1
    num_ps: PsCount = 1
    worker_cpu: NodeCores = 1.0
    worker_memory_mb: NodeMemoryMb = 2048
    ps_cpu: NodeCores = 1.0
    ps_memory_mb: NodeMemoryMb = 2048
    sizes: tuple[NodeSize, ...] = ()

    @model_validator(mode="after")
    def _sized_nodes_exist(self) -> ResourcePlan:
        seen: set[str] = set()
        for entry in self.sizes:
            if entry.node in seen:
                raise ValueError(f"plan.sizes: {entry.node} is sized twice")
            seen.add(entry.node)
            role, index = node_role_index(entry.node)
            count = self.num_ps if role == "ps" else self.num_workers
            if index >= count:
                raise ValueError(
                    f"plan.sizes: {entry.node} does not exist in a plan of {count} "
                    f"{'PS' if role == 'ps' else 'workers'}"
                )
        return self

    @model_serializer(mode="wrap")
    def _without_empty_sizes(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A plan without per-node sizes dumps as it always did (old history rows compare)."""
        data: dict[str, Any] = handler(self)
        if not self.sizes:
            data.pop("sizes", None)
        return data

    def role_size(self, role: str) -> tuple[float, int]:
        """(cores, MB) of a ``role`` node not sized apart; an evaluator's is a worker's."""
        if role == "ps":
            return self.ps_cpu, self.ps_memory_mb
        return self.worker_cpu, self.worker_memory_mb

    def size_of(self, node_id: str) -> tuple[float, int]:
        """(cores, MB) of ``node_id`` under this plan (an evaluator is sized as a worker)."""
        role, _ = node_role_index(node_id)
        cpu, memory_mb = self.role_size(role)
        entry = next((s for s in self.sizes if s.node == node_id), None)
        if entry is None:
            return cpu, memory_mb
        return (
            cpu if entry.cpu is None else entry.cpu,
            memory_mb if entry.memory_mb is None else entry.memory_mb,
        )

    def node_ids(self) -> list[str]:
        """Every PS and worker of the plan, PS first."""
        return [f"ps-{i}" for i in range(self.num_ps)] + [
            f"worker-{i}" for i in range(self.num_workers)
        ]

    @property
    def total_cores(self) -> float:
        """Cores of every PS and worker, each at its own size."""
        return self._totals()[0]

    @property
    def total_memory_mb(self) -> int:
        """Memory (MB) of every PS and worker, each at its own size."""
        return self._totals()[1]

    def _totals(self) -> tuple[float, int]:
        """(cores, MB) of the plan: each role's size times its count, plus what the nodes
        sized apart (and still in the plan) differ by."""
        cores = self.num_workers * self.worker_cpu + self.num_ps * self.ps_cpu
        memory = self.num_workers * self.worker_memory_mb + self.num_ps * self.ps_memory_mb
        for entry in self.sizes:
            role, index = node_role_index(entry.node)
            if index >= (self.num_ps if role == "ps" else self.num_workers):
                continue
            role_cpu, role_mb = self.role_size(role)
            cores += 0.0 if entry.cpu is None else entry.cpu - role_cpu
            memory += 0 if entry.memory_mb is None else entry.memory_mb - role_mb
        return cores, memory

    def with_size(
        self, node_id: str, cpu: float | None = None, memory_mb: int | None = None
    ) -> ResourcePlan:
        """This plan with ``node_id`` at ``cpu`` cores and ``memory_mb`` MB (None: as today);
        a node back at its role's size is no longer listed. ValueError for a node the plan
        does not have or a size out of bounds."""
        role, _ = node_role_index(node_id)
        old_cpu, old_mb = self.size_of(node_id)
        new_cpu = old_cpu if cpu is None else cpu
        new_mb = old_mb if memory_mb is None else memory_mb
        role_cpu, role_mb = self.role_size(role)
        entry: dict[str, Any] = {"node": node_id}
        if new_cpu != role_cpu:
            entry["cpu"] = new_cpu
        if new_mb != role_mb:
            entry["memory_mb"] = new_mb
        others = [s.model_dump(exclude_none=True) for s in self.sizes if s.node != node_id]
        sizes = [*others, entry] if len(entry) > 1 else others
        return ResourcePlan.model_validate(
            {**self.model_dump(), "sizes": sorted(sizes, key=_node_order)}
        )

    def with_counts(
        self, num_workers: int | None = None, num_ps: int | None = None
    ) -> ResourcePlan:
        """This plan with other node counts; the sizes of nodes it no longer has are dropped."""
        workers = self.num_workers if num_workers is None else num_workers
        ps = self.num_ps if num_ps is None else num_ps
        kept = []
        for entry in self.sizes:
            role, index = node_role_index(entry.node)
            if index < (ps if role == "ps" else workers):
                kept.append(entry.model_dump(exclude_none=True))
        return ResourcePlan.model_validate(
            {**self.model_dump(), "num_workers": workers, "num_ps": ps, "sizes": kept}
        )

    def describe(self) -> str:
        """The plan in words, per-node sizes included (the UI's and the CLI's)."""
        workers = "worker" if self.num_workers == 1 else "workers"
        text = (
            f"{self.num_ps} PS x {self.ps_cpu:g} CPU, {self.ps_memory_mb} MB; "
            f"{self.num_workers} {workers} x {self.worker_cpu:g} CPU, {self.worker_memory_mb} MB"
        )
        if self.sizes:
            apart = [
                f"{s.node} {self.size_of(s.node)[0]:g} CPU, {self.size_of(s.node)[1]} MB"
                for s in self.sizes
            ]
            text += f" ({'; '.join(apart)})"
        return text


def _node_order(entry: dict[str, Any]) -> tuple[str, int]:
    return node_role_index(str(entry["node"]))


DEFAULT_LEARNING_RATES = {"adam": 0.001, "adagrad": 0.2, "sgd": 0.1}


class TrainingConfig(_Strict):
    """Optimisation settings; the same for every worker of the job."""

    batch_size: int = Field(default=512, ge=1, le=1 << 20)
    epochs: int = Field(default=1, ge=1, le=1000)
    optimizer: Literal["sgd", "adagrad", "adam"] = "adam"
    learning_rate: float = Field(
        default=0.001, gt=0, le=10, description="default: 0.001 adam, 0.2 adagrad, 0.1 sgd"
    )

    @model_validator(mode="before")
    @classmethod
    def _learning_rate_for_optimizer(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("learning_rate") is None:
            rate = DEFAULT_LEARNING_RATES.get(str(data.get("optimizer", "adam")))
            if rate is not None:
                data = {**data, "learning_rate": rate}
        return data

    shard_size: int = Field(
        default=8192, ge=1, description="samples per shard leased from the master's queue"
    )
    seed: int = 0
    shard_lease_s: float = Field(
        default=120.0, gt=0, description="a worker that holds a shard longer loses the lease"
    )
    progress_report_s: float = Field(
        default=1.0,
        ge=0.05,
        le=60,
        description="seconds between a worker's progress reports (samples, steps, step time) "
        "to the master: what its status and the autoscaler see",
    )


class RecoveryConfig(_Strict):
    """How much failure a job absorbs by itself before it fails (and Airflow's retry, which
    resumes from the last checkpoint and the shard queue, takes over)."""

    checkpoint_interval_s: float = Field(
        default=60.0, ge=0, description="seconds between checkpoints while training; 0: none"
    )
    max_node_restarts: int = Field(
        default=10, ge=0, le=10_000, description="relaunches of dead nodes per job run"
    )
    max_shard_failures: int = Field(
        default=3, ge=1, le=100, description="a shard whose worker died this often is quarantined"
    )
    deterministic_after: int = Field(
        default=2,
        ge=2,
        le=100,
        description="the same exception (type, message without its numbers, where raised) "
        "from this many nodes, restarts or shards fails the job at once, without retry: no "
        "restart can fix it (docs/fault-tolerance.md)",
    )
    max_master_restarts: int = Field(
        default=3, ge=0, le=100, description="relaunches of a dead master by its keeper"
    )
    standby_ps: bool = Field(
        default=False,
        description="keep a spare PS process started (imports done, idle) that takes over a "
        "lost PS at once instead of a fresh process (local launcher; about 100 MB of memory)",
    )


class AutoscaleConfig(_Strict):
    """The job's resource optimizer: it profiles the nodes and proposes plans within these
    bounds, which the trigger applies (``docs/optimizer.md``). A bound left out: the counts'
    maxima are 4, or the starting plan's count if larger; the PS cores' maximum is 8 (DLRover's
    largest node), or the starting plan's if larger; the other sizes are not bounded."""

    enabled: bool = True
    interval_s: float = Field(default=10.0, gt=0, description="seconds between optimizer runs")
    sampling_s: float = Field(
        default=10.0, ge=0, description="profile this long under a plan before judging it"
    )
    min_plan_interval_s: float = Field(
        default=30.0,
        ge=0,
        description="the cooldown after an applied plan: no proposal sooner than this after it",
    )
    decline_cooldown_s: float = Field(
        default=0.0,
        ge=0,
        description="no proposal sooner than this after a person declined one",
    )
    min_workers: int = Field(default=1, ge=1, le=1024)
    max_workers: int | None = Field(
        default=None, ge=1, le=1024, description="default: 4, or the starting plan's if more"
    )
    min_ps: int = Field(default=1, ge=1, le=256)
    max_ps: int | None = Field(
        default=None, ge=1, le=256, description="default: 4, or the starting plan's if more"
    )
    min_worker_cpu: float | None = Field(default=None, gt=0, le=256)
    max_worker_cpu: float | None = Field(default=None, gt=0, le=256)
    min_ps_cpu: float | None = Field(default=None, gt=0, le=256)
    max_ps_cpu: float | None = Field(
        default=None, gt=0, le=256, description="default: 8, or the starting plan's if more"
    )
    min_ps_memory_mb: int | None = Field(default=None, ge=256)
    max_ps_memory_mb: int | None = Field(
        default=None, ge=256, description="the most a predicted OOM may raise PS memory to"
    )
    pending_timeout_s: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="a node pod not scheduled (Pending) this long gets a smaller plan: "
        "workers at their role's size are dropped (down to min_workers), a PS or a node sized "
        "apart gets half its size (Kubernetes; local nodes never wait)",
    )
    cpu_budget: float | None = Field(
        default=None,
        gt=0,
        description="cores all nodes together may request; default: what the launcher hosts "
        "(the local launcher: this machine's cores)",
    )
    plan_approval: bool = Field(
        default=False,
        description="proposals wait for a person to apply (approve) or decline them; the "
        "trigger applies none itself. How the job runs, not what it learns: not in the "
        "training fingerprint",
    )
    weight: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="the job's weight in a shared cluster budget: the arbiter multiplies its "
        "priority by it, and may shrink running jobs of lower weight to start it",
    )
    admit_at_minimum: bool = Field(
        default=False,
        description="when the starting plan does not fit the cluster budget, start with "
        "min_workers workers if that fits, rather than wait for room",
    )
    prior: AutoscalePrior | None = Field(
        default=None,
        description="set by warm start from similar past jobs: the throughput model's "
        "coefficients, hot share and scaling costs the optimizer starts from; none: a cold "
        "start (docs/warm-start.md). Not in the training fingerprint",
    )

    @model_validator(mode="after")
    def _min_within_max(self) -> AutoscaleConfig:
        pairs = (
            ("min_workers", "max_workers"),
            ("min_ps", "max_ps"),
            ("min_worker_cpu", "max_worker_cpu"),
            ("min_ps_cpu", "max_ps_cpu"),
            ("min_ps_memory_mb", "max_ps_memory_mb"),
        )
        for low, high in pairs:
            lo, hi = getattr(self, low), getattr(self, high)
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"autoscale.{low}={lo} is above autoscale.{high}={hi}")
        return self


class DataWorkersConfig(_Strict):
    """GoldMiner's data workers: stateless processes that read the shards a trainer leased,
    run the preprocessing and serve the trainer ready batches (``docs/data-workers.md``).
    ``off``: each trainer prepares its own input; ``fixed``: ``count`` data workers; ``auto``:
    from ``count`` (default ``min``) within ``[min, max]``, as the trainers' input wait says."""

    mode: Literal["off", "fixed", "auto"] = "off"
    count: int | None = Field(
        default=None, ge=0, le=64, description="fixed: how many; auto: how many to start with"
    )
    min: int = Field(default=0, ge=0, le=64, description="auto: the fewest (0: the trainers)")
    max: int = Field(default=4, ge=1, le=64, description="auto: the most")
    cpu: float = Field(default=1.0, gt=0, le=64, description="cores of each data worker")
    memory_mb: int = Field(default=1024, ge=256, description="memory (MB) of each data worker")
    ready_batches: int = Field(
        default=8, ge=1, le=256, description="ready batches a trainer holds, per shard it fetches"
    )
    interval_s: float = Field(
        default=10.0, ge=1, le=600, description="auto: seconds between two scaling decisions"
    )

    @model_validator(mode="after")
    def _consistent(self) -> DataWorkersConfig:
        if self.mode == "fixed" and not self.count:
            raise ValueError("data_workers: mode 'fixed' needs count >= 1")
        if self.min > self.max:
            raise ValueError(f"data_workers.min={self.min} is above data_workers.max={self.max}")
        count = self.count
        if self.mode == "auto" and count is not None and not self.min <= count <= self.max:
            raise ValueError(
                f"data_workers.count={self.count} is outside [min={self.min}, max={self.max}]"
            )
        return self

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    @property
    def start(self) -> int:
        """How many data workers the job starts with."""
        if self.mode == "off":
            return 0
        if self.mode == "fixed":
            return self.count or 0
        return self.min if self.count is None else self.count


DATA_WORKERS_ACCEPTED = (
    "None, 0 or 'off' (none: each trainer prepares its own input), a count n >= 1 (n data "
    "workers), 'auto' (scaled within min..max by the trainers' input wait), or a dict of "
    "DataWorkersConfig's fields (mode, count, min, max, cpu, memory_mb, ready_batches, "
    "interval_s; min or max without mode: auto, count alone: fixed)"
)


def data_workers_fields(value: Any) -> Any:
    """The short forms of ``data_workers`` as ``DataWorkersConfig``'s fields: ``None``, ``0``
    or ``"off"``: off; ``n``: fixed n; ``"auto"``: auto with the default bounds; a dict without
    ``mode``: auto with ``min``/``max``, fixed with ``count`` alone. Anything else raises
    ValueError saying what is accepted."""
    if isinstance(value, DataWorkersConfig):
        return value
    if value is None:
        return {"mode": "off"}
    if isinstance(value, str) and value.strip().lower() in ("off", "auto"):
        return {"mode": value.strip().lower()}
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return {"mode": "fixed", "count": value} if value else {"mode": "off"}
    if isinstance(value, dict):
        if "mode" in value or not value or set(value) - set(DataWorkersConfig.model_fields):
            return value  # validation names an unknown key with the accepted ones
        if "min" in value or "max" in value:
            return {**value, "mode": "auto"}
        if "count" in value:
            return {**value, "mode": "fixed"}
        raise ValueError(
            f"data_workers={value!r} turns no data workers on: give mode ('fixed' or 'auto'), "
            "count, or min/max"
        )
    raise ValueError(f"data_workers={value!r}; accepted: {DATA_WORKERS_ACCEPTED}")


def check_preprocess_ref(value: Any) -> str | None:
    """None or an import path ``package.module:function``; anything else is rejected."""
    if value is None or (isinstance(value, str) and _IMPORT_PATH.match(value)):
        return value
    raise ValueError(
        f"preprocess={value!r}: expected an import path like 'mypkg.features:preprocess' "
        "(a function taking and returning a Batch), or None"
    )


class ClusterBudget(_Strict):
    """Resources that running jobs of any DAG share: a scale-up of a job is applied only when
    the cluster arbiter (``core.cluster_budget``) selects it within this budget. Jobs with the
    same ``name`` share one budget; a limit left out is not limited (give at least one)."""

    name: str = Field(
        default="default",
        min_length=1,
        max_length=100,
        pattern=r"^[\w.:-]+$",
        description="jobs naming the same budget share it",
    )
    cpu: float | None = Field(
        default=None, gt=0, description="cores the nodes of all these jobs may hold together"
    )
    memory_mb: int | None = Field(
        default=None, gt=0, description="memory (MB) the nodes of all these jobs may hold together"
    )


class JobSpec(_Strict):
    """Everything a job's processes need to run; written to ``job.json`` by the launcher."""

    job_id: str = Field(min_length=1, max_length=200, pattern=r"^[a-z0-9][a-z0-9.-]*$")
    train_data: str = Field(
        min_length=1, description="the training split: a dataset directory, files or a glob"
    )
    eval_data: str | None = Field(default=None, description="held-out split scored at the end")
    data_format: DataFormat = Field(
        default="auto",
        description="npy-columns, parquet, tfrecord or csv; auto: by the manifest or the files' "
        "extension (docs/data-formats.md)",
    )
    data_schema: DataSchema | None = Field(
        default=None,
        description="the label, weight, dense and categorical columns of a Parquet, TFRecord "
        "or CSV dataset; default: inferred from Parquet metadata",
    )
    model: str = Field(
        default="wide_deep",
        description="a reference model name or an import path 'package.module:factory'",
    )
    features: FeatureConfig | None = Field(
        default=None, description="default: one table per categorical column of the dataset"
    )
    embedding_dim: EmbeddingDim = 16
    plan: ResourcePlan = ResourcePlan()
    training: TrainingConfig = TrainingConfig()
    recovery: RecoveryConfig = RecoveryConfig()
    autoscale: AutoscaleConfig = AutoscaleConfig()
    checkpoint: CheckpointPolicyConfig = CheckpointPolicyConfig()
    preprocess: str | None = Field(
        default=None,
        description="an import path 'package.module:function' of the preprocessing that maps "
        "each batch read from the data to the batch the model trains on (same columns); "
        "none: the data schema's own mapping only",
    )
    data_workers: DataWorkersConfig = DataWorkersConfig()
    checkpoint_uri: str | None = Field(
        default=None,
        pattern=r"^(file://|s3://|/)",
        description="durable copies of each committed checkpoint: file:///path or "
        "s3://bucket/prefix (credentials from the environment, never from this file)",
    )
    deadline: JobDeadline | None = Field(
        default=None,
        description="the master stops the job at this time (set at submission from the "
        "task's max_runtime); none: the job runs until it ends",
    )
    init: InitSource | None = Field(
        default=None,
        description="the model or checkpoint the job starts from while it has no checkpoint "
        "of its own (core.incremental); none: fresh rows",
    )
    day: int | None = Field(
        default=None,
        description="the day the job trains for (days since 1970-01-01, the run's data "
        "interval): each row records the last day it was trained on",
    )
    fingerprint: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{32}$",
        description="digest of what the job trains (data.fingerprint): its checkpoints carry "
        "it, and a job resumes only checkpoints of the same one",
    )

    @field_validator("model")
    @classmethod
    def _model_ref(cls, value: str) -> str:
        return check_model_ref(value)

    @field_validator("preprocess")
    @classmethod
    def _preprocess_ref(cls, value: str | None) -> str | None:
        return check_preprocess_ref(value)

    @field_validator("data_workers", mode="before")
    @classmethod
    def _data_workers_forms(cls, value: Any) -> Any:
        return data_workers_fields(value)

    @property
    def resolved_features(self) -> FeatureConfig:
        """The job's features as its processes use them: written into ``job.json`` when the
        job is submitted (``data.features.with_resolved_features``)."""
        if self.features is None:
            raise ValueError(
                f"job {self.job_id}: the spec has no features; a job is submitted with its "
                "features resolved from the dataset (launchers.base.write_job)"
            )
        return self.features


def check_model_ref(value: str) -> str:
    """A reference model name or ``package.module:factory``; anything else is rejected."""
    if value in REFERENCE_MODELS or _IMPORT_PATH.match(value):
        return value
    raise ValueError(
        f"model={value!r}: expected one of {list(REFERENCE_MODELS)} "
        "or an import path like 'mypkg.models:build_tower'"
    )


# Reference models whose wide (linear) part reads a 1-dim table per categorical column.
_WIDE_TABLE_MODELS = frozenset(REFERENCE_MODELS)
WIDE_SUFFIX = "_wide"


class FeatureColumn(NamedTuple):
    """A categorical column as the default features read it (``default_features``)."""

    name: str
    vocab_size: int
    pooling: Literal["sum", "mean"] = "sum"
    table: str | None = None  # a table shared with other columns; default: its own
    values: ColumnValues = "ids"
    multivalued: bool = False
    index_kind: TableIndex = "vocab"  # "ids": the column holds raw int64 ids


def default_features(
    columns: Sequence[tuple[str, int] | FeatureColumn], num_dense: int, model: str, dim: int
) -> FeatureConfig:
    """One ``dim``-wide input per categorical column (columns naming one table share its rows),
    plus a 1-dim one of per-id linear weights for the reference models (their wide /
    first-order term), shared the same way."""
    full = [FeatureColumn(*c) for c in columns]
    tables = [_entry(c, c.name, c.table, dim) for c in full]
    if model in _WIDE_TABLE_MODELS:
        tables += [
            _entry(c, f"{c.name}{WIDE_SUFFIX}", c.table and f"{c.table}{WIDE_SUFFIX}", 1)
            for c in full
        ]
    return FeatureConfig(num_dense=num_dense, tables=tuple(tables))


def _entry(column: FeatureColumn, name: str, table: str | None, dim: int) -> TableConfig:
    return TableConfig(
        name=name,
        column=column.name,
        vocab_size=column.vocab_size,
        dim=dim,
        pooling=column.pooling,
        table=table,
        values=column.values,
        multivalued=column.multivalued,
        index=column.index_kind,
    )


def describe_errors(exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line per error, naming the field; unknown keys come with the accepted ones."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "value"
        message = err["msg"]
        if err["type"] == "value_error":  # our own message, without pydantic's "Value error, "
            message = str(err.get("ctx", {}).get("error", message))
            if re.match(rf"{re.escape(where)}\b", message):  # it names the field already
                parts.append(message)
                continue
        owner = _model_at(model, err["loc"][:-1]) if model is not None else None
        if err["type"] == "extra_forbidden" and owner is not None:
            message += f" (accepted: {', '.join(owner.model_fields)})"
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def _model_at(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model that holds the key at ``loc`` (a path of field names and list indexes from
    ``model``, or from a model that holds ``model`` as a field: the path's first steps then
    name that field); None where the path leaves the models (a plain dict)."""
    for start in range(len(loc) + 1):
        found = _walk(model, loc[start:])
        if found is not None:
            return found
    return None


def _walk(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    for step in loc:
        if isinstance(step, int):
            continue  # an item of a list or tuple field: its model was found with the field
        field = model.model_fields.get(str(step))
        if field is None:
            return None
        found = _model_in(field.annotation)
        if found is None:
            return None
        model = found
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model class in a field's type: itself, or inside Optional, a union or a
    list/tuple of it."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
