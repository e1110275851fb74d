"""Checkpoint policies (``full`` | ``cpr`` | ``ecrm``): their settings, cost models and choice.

Pure logic, no Airflow, network or TensorFlow: the operator validates a task's policy here at
DAG parse time, the master turns it into a save schedule (``plan_checkpoints``) once it has
measured what a save costs, and ``recommend_checkpoint_policy`` says which policy a job of this
size and failure rate should use. The formulas (``docs/checkpoint-policies.md``):

* full recovery (CPR paper eq. 1, section 2.2): every PS reloads the last checkpoint on a failure.
  Overhead per unit of training time ``O_save/T_save + (O_load + T_save/2 + O_res)/T_fail``,
  minimised by ``T_save = sqrt(2*O_save*T_fail)``.
* partial recovery, CPR (eq. 2-4, sections 2.3, 4.1, 4.2): only the failed PS reloads; no work
  is redone, the overhead is ``O_save/T_save + (O_load + O_res)/T_fail``, but updates are lost:
  ``E[PLS] = 0.5*T_save/(T_fail*N_emb)``, so a target PLS gives ``T_save = 2*PLS*N_emb*T_fail``.
  When that interval costs no less than full recovery at its optimum, CPR falls back to full
  recovery and says why (section 4.2, "PLS-based checkpointing").
* erasure coding, ECRM (ECRM paper sections 3, 4.3): parity on other PS, no rollback and no
  pause; a near-constant throughput cost in normal operation plus a slower phase while a lost
  PS is rebuilt, and ``1/k`` (``xor``) or ``2/k`` (``sum``, float64 parity) extra memory.

How the rest of the job uses it::

    cfg = CheckpointPolicyConfig.from_task_params("cpr", {"target_pls": 0.05})  # operator
    plan = plan_checkpoints(cfg, costs)            # master, once a save has been timed
    plan.policy, plan.interval_s, plan.partial_interval_s, plan.reason
    rec = recommend_checkpoint_policy(costs, pls_budget=0.1)
    note = judge_choice(cfg, costs)                 # None, or one line for the log
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

PolicyName = Literal["full", "cpr", "ecrm"]
CprVariant = Literal["vanilla", "mfu", "ssu"]
EcrmCodec = Literal["sum", "xor"]
POLICIES: tuple[str, ...] = ("full", "cpr", "ecrm")
CPR_VARIANTS: tuple[str, ...] = ("vanilla", "mfu", "ssu")
ECRM_CODECS: tuple[str, ...] = ("sum", "xor")

# ECRM paper section 4.3: 2.6% (k=4, Criteo-Original) to 4.2% (880 GB) training-time overhead in
# normal operation, whatever k; and a 6-12% throughput drop while a lost PS is rebuilt (4.2).
ECRM_NORMAL_OVERHEAD = 0.03
ECRM_RECOVERY_DROP = 0.10
# ECRM section 4.4: a much rarer checkpoint stays as a second line of defence against two
# PS lost at once; by default 10x the optimal full-recovery interval.
ECRM_BACKUP_FACTOR = 10.0
_ERROR_TYPE = "checkpoint_policy"


class CheckpointPolicyError(ValueError):
    """A bad checkpoint policy or option; the message names the parameter and what it takes."""


def _invalid(text: str) -> PydanticCustomError:
    return PydanticCustomError(_ERROR_TYPE, "{text}", {"text": text})


def _check_range(
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
    raise _invalid(f"{name}={value!r}: {rule}")


def _check_choice(name: str, value: Any, accepted: tuple[str, ...]) -> Any:
    if value not in accepted:
        raise _invalid(f"{name}={value!r}; accepted: {', '.join(accepted)}")
    return value


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    _section: ClassVar[str] = ""

    @classmethod
    def _name(cls, field_name: str | None) -> str:
        return f"{cls._section}.{field_name}" if cls._section else str(field_name)


class FullOptions(_Options):
    """Full recovery: every PS reloads the last checkpoint on any PS failure."""

    _section: ClassVar[str] = "full"
    interval_s: float | None = Field(
        default=None,
        description="seconds between checkpoints; default sqrt(2*O_save*T_fail) from the "
        "measured save cost and the failure rate (CPR section 2.2)",
    )

    @field_validator("interval_s")
    @classmethod
    def _interval(cls, v: float | None, info: Any) -> float | None:
        return None if v is None else _check_range(cls._name(info.field_name), v, 0.0, None)


class CprOptions(_Options):
    """Partial recovery (CPR): only the failed PS reloads its part; PLS bounds what is lost."""

    _section: ClassVar[str] = "cpr"
    target_pls: float = Field(
        default=0.1, description="portion of lost samples the job may lose (CPR section 4.1)"
    )
    variant: CprVariant = Field(
        default="mfu",
        description="vanilla: save every row every T_save; mfu: the r*N most-accessed rows "
        "every r*T_save (the PS already counts accesses per row); ssu: a sub-sampled list of "
        "r*N rows every r*T_save (less memory than mfu)",
    )
    r: float = Field(default=0.125, description="share of rows one MFU/SSU save writes")
    interval_s: float | None = Field(
        default=None, description="T_save override; default 2*target_pls*N_emb*T_fail"
    )
    ssu_sample_period: int = Field(
        default=2, description="SSU keeps one access in this many (CPR section 5.1 uses 2)"
    )
    min_benefit: float = Field(
        default=0.0,
        description="fall back to full recovery unless partial recovery saves at least this "
        "share of full recovery's estimated overhead (0: it must merely be lower)",
    )
    fallback: bool = Field(
        default=True, description="False: keep partial recovery even when it costs more"
    )

    @field_validator("target_pls", "r")
    @classmethod
    def _unit(cls, v: float, info: Any) -> float:
        return _check_range(cls._name(info.field_name), v, 0.0, 1.0)

    @field_validator("variant", mode="before")
    @classmethod
    def _variant(cls, v: Any, info: Any) -> Any:
        return _check_choice(cls._name(info.field_name), v, CPR_VARIANTS)

    @field_validator("interval_s")
    @classmethod
    def _interval(cls, v: float | None, info: Any) -> float | None:
        return None if v is None else _check_range(cls._name(info.field_name), v, 0.0, None)

    @field_validator("ssu_sample_period")
    @classmethod
    def _period(cls, v: int, info: Any) -> int:
        return int(_check_range(cls._name(info.field_name), v, 1, None, low_open=False))

    @field_validator("min_benefit")
    @classmethod
    def _benefit(cls, v: float, info: Any) -> float:
        if not 0.0 <= v < 1.0:
            raise _invalid(f"{cls._name(info.field_name)}={v!r}: must be in [0, 1)")
        return v


class EcrmOptions(_Options):
    """Erasure coding (ECRM): parity of k rows on another PS, rebuilt without a rollback."""

    _section: ClassVar[str] = "ecrm"
    k: int = Field(default=4, description="rows (from k different PS) per parity row; needs k+1 PS")
    rows_per_lock: int = Field(
        default=65_536,
        description="rows a rebuild decodes per lock: smaller buffers less, switches more",
    )
    codec: EcrmCodec = Field(
        default="sum",
        description="sum: float64 parity (the paper's, 2/k extra memory, a degraded read during "
        "an update is off by that update at most); xor: bit-exact, 1/k extra memory",
    )
    backup_interval_s: float | None = Field(
        default=None,
        description="a rare full checkpoint against two PS lost at once (ECRM section 4.4); "
        "default 10x the optimal full-recovery interval, 0: none",
    )

    @field_validator("k")
    @classmethod
    def _k(cls, v: int, info: Any) -> int:
        if not 2 <= v <= 64:
            raise _invalid(
                f"{cls._name(info.field_name)}={v!r}: must be in [2, 64] "
                "(k=1 would be plain replication)"
            )
        return v

    @field_validator("rows_per_lock")
    @classmethod
    def _rows(cls, v: int, info: Any) -> int:
        if v < 1:
            raise _invalid(f"{cls._name(info.field_name)}={v!r}: must be >= 1")
        return v

    @field_validator("codec", mode="before")
    @classmethod
    def _codec(cls, v: Any, info: Any) -> Any:
        return _check_choice(cls._name(info.field_name), v, ECRM_CODECS)

    @field_validator("backup_interval_s")
    @classmethod
    def _backup(cls, v: float | None, info: Any) -> float | None:
        if v is None:
            return None
        return _check_range(cls._name(info.field_name), v, 0.0, None, low_open=False)


class CheckpointPolicyConfig(_Options):
    """A job's checkpoint policy and its options (the ``checkpoint`` section of the job spec).

    Options of the policies not chosen are kept (and validated) so that a recommendation can
    be compared against them, but only ``policy``'s apply.
    """

    policy: PolicyName = Field(default="full", description="full | cpr | ecrm")
    mtbf_s: float | None = Field(
        default=None,
        description="mean seconds between embedding-PS failures of this job (T_fail); "
        "default: from the job history (mtbf_from_history)",
    )
    full: FullOptions = FullOptions()
    cpr: CprOptions = CprOptions()
    ecrm: EcrmOptions = EcrmOptions()

    @field_validator("policy", mode="before")
    @classmethod
    def _policy(cls, v: Any) -> Any:
        return _check_choice("checkpoint_policy", v, POLICIES)

    @field_validator("mtbf_s")
    @classmethod
    def _mtbf(cls, v: float | None) -> float | None:
        return None if v is None else _check_range("mtbf_s", v, 0.0, None)

    @classmethod
    def parse(cls, value: Any) -> CheckpointPolicyConfig:
        """Validate a dict (or JSON text) into a config; errors as ``CheckpointPolicyError``."""
        try:
            if isinstance(value, str | bytes):
                return cls.model_validate_json(value)
            return cls.model_validate(value)
        except ValidationError as exc:
            raise CheckpointPolicyError(describe_policy_errors(exc)) from None

    @classmethod
    def from_task_params(
        cls, checkpoint_policy: str = "full", options: Mapping[str, Any] | None = None
    ) -> CheckpointPolicyConfig:
        """Build from an operator's ``checkpoint_policy`` and its flat ``options`` dict.

        ``options`` keys are the chosen policy's options (``target_pls``, ``k``, ...) plus
        ``mtbf_s``; anything else is rejected naming the accepted keys.
        """
        if checkpoint_policy not in POLICIES:
            raise CheckpointPolicyError(
                f"checkpoint_policy={checkpoint_policy!r}; accepted: {', '.join(POLICIES)}"
            )
        section = _SECTIONS[checkpoint_policy]
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

    def failure_interval(self, history: Iterable[FailureHistory], num_emb_ps: int) -> float | None:
        """T_fail for this job: ``mtbf_s`` when given, else from the job history (None when
        there is neither: the master keeps its default interval until it knows)."""
        return self.mtbf_s if self.mtbf_s is not None else mtbf_from_history(history, num_emb_ps)

    def check_cluster(self, num_ps: int) -> None:
        """Reject a policy the job's PS count cannot carry (ECRM needs k+1 PS)."""
        if self.policy == "ecrm" and num_ps < self.ecrm.k + 1:
            raise CheckpointPolicyError(
                f"ecrm.k={self.ecrm.k}: needs at least k+1={self.ecrm.k + 1} parameter "
                f"servers, the job has {num_ps}; lower ecrm.k or add PS"
            )


_SECTIONS: dict[str, type[_Options]] = {"full": FullOptions, "cpr": CprOptions, "ecrm": EcrmOptions}


def describe_policy_errors(exc: ValidationError) -> str:
    """One clause per error, each naming the option, the value given and what is accepted."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "checkpoint"
        if err["type"] == _ERROR_TYPE:
            parts.append(err["msg"])
        elif err["type"] == "extra_forbidden":
            parent = str(err["loc"][-2]) if len(err["loc"]) > 1 else ""
            model = _SECTIONS.get(parent, CheckpointPolicyConfig)
            accepted = ", ".join(model.model_fields)
            parts.append(f"{where}: unknown option; accepted: {accepted}")
        else:
            parts.append(f"{where}={err.get('input')!r}: {err['msg']}")
    return "; ".join(parts)


# ----------------------------------------------------------------------------- cost models


@dataclass(frozen=True)
class CheckpointCosts:
    """What checkpoints cost this job (measured, or from its history); times in seconds.

    ``save_s`` is the training pause of one full checkpoint; ``load_s`` the pause while one PS
    restores its part (all PS restore in parallel under full recovery, so the pause is the
    same). ``mtbf_s`` is the mean time between embedding-PS failures of the whole job.
    """

    save_s: float
    load_s: float
    mtbf_s: float
    num_emb_ps: int
    reschedule_s: float = 0.0
    partial_save_s: float | None = None  # one MFU/SSU save of r*N rows; default r * save_s
    embedding_rows: int = 0
    embedding_bytes: int = 0  # rows + optimizer state on all PS (ECRM parity memory)
    memory_headroom_bytes: int | None = None  # free PS memory for parity; None: not checked
    ecrm_normal_overhead: float = ECRM_NORMAL_OVERHEAD
    ecrm_recovery_drop: float = ECRM_RECOVERY_DROP
    ecrm_rebuild_s: float | None = None  # time to rebuild one PS by decoding; default k*load_s

    def __post_init__(self) -> None:
        for name in ("load_s", "reschedule_s", "ecrm_normal_overhead"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value!r}: must be a finite number >= 0")
        _positive(save_s=self.save_s, mtbf_s=self.mtbf_s)
        if self.num_emb_ps < 1:
            raise ValueError(f"num_emb_ps={self.num_emb_ps!r}: must be >= 1")
        if not 0 <= self.ecrm_recovery_drop <= 1:
            raise ValueError(f"ecrm_recovery_drop={self.ecrm_recovery_drop!r}: in [0, 1]")
        for name in ("partial_save_s", "ecrm_rebuild_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}={value!r}: must be a finite number >= 0")


@dataclass(frozen=True)
class Overhead:
    """Expected overhead as a share of failure-free training time, by cause (CPR section 2.2)."""

    save: float = 0.0  # O_save / T_save (+ partial saves)
    load: float = 0.0  # O_load / T_fail
    lost: float = 0.0  # (T_save / 2) / T_fail: work redone after a rollback
    reschedule: float = 0.0  # O_res / T_fail
    running: float = 0.0  # ECRM: parity updates in normal operation
    recovery: float = 0.0  # ECRM: slower training while a lost PS is rebuilt

    @property
    def total(self) -> float:
        return self.save + self.load + self.lost + self.reschedule + self.running + self.recovery


def optimal_full_interval(save_s: float, mtbf_s: float) -> float:
    """``sqrt(2*O_save*T_fail)``: the interval minimising eq. 1 (CPR section 2.2)."""
    if save_s <= 0 or mtbf_s <= 0:
        raise ValueError(f"save_s={save_s!r} and mtbf_s={mtbf_s!r} must be > 0")
    return math.sqrt(2.0 * save_s * mtbf_s)


def full_overhead(
    save_s: float, load_s: float, mtbf_s: float, interval_s: float, reschedule_s: float = 0.0
) -> Overhead:
    """Eq. 1 divided by T_total: ``O_save/T_save + (O_load + T_save/2 + O_res)/T_fail``."""
    _positive(interval=interval_s, mtbf=mtbf_s)
    return Overhead(
        save=save_s / interval_s,
        load=load_s / mtbf_s,
        lost=0.5 * interval_s / mtbf_s,
        reschedule=reschedule_s / mtbf_s,
    )


def partial_overhead(
    save_s: float,
    load_s: float,
    mtbf_s: float,
    interval_s: float,
    reschedule_s: float = 0.0,
    *,
    r: float = 1.0,
    partial_save_s: float | None = None,
) -> Overhead:
    """Eq. 2 divided by T_total: ``O_save/T_save + (O_load + O_res)/T_fail``.

    With MFU/SSU (``r < 1``) a save of ``r*N`` rows (``partial_save_s``, default ``r*save_s``)
    happens every ``r*T_save`` instead of a full save every ``T_save`` (CPR section 4.2).
    """
    _positive(interval=interval_s, mtbf=mtbf_s)
    per_save = save_s if r >= 1.0 else (r * save_s if partial_save_s is None else partial_save_s)
    return Overhead(
        save=per_save / (r * interval_s) if r < 1.0 else save_s / interval_s,
        load=load_s / mtbf_s,
        reschedule=reschedule_s / mtbf_s,
    )


def cpr_interval(target_pls: float, num_emb_ps: int, mtbf_s: float) -> float:
    """``T_save = 2*PLS*N_emb*T_fail``: the interval whose expected PLS is the target (eq. 4)."""
    _positive(target_pls=target_pls, num_emb_ps=num_emb_ps, mtbf=mtbf_s)
    return 2.0 * target_pls * num_emb_ps * mtbf_s


def expected_pls(interval_s: float, mtbf_s: float, num_emb_ps: int) -> float:
    """``E[PLS] = 0.5*T_save/(T_fail*N_emb)`` (CPR eq. 4): failures uniform in time, each
    losing the updates of one of N_emb PS since its last save."""
    _positive(interval=interval_s, mtbf=mtbf_s, num_emb_ps=num_emb_ps)
    return 0.5 * interval_s / (mtbf_s * num_emb_ps)


def ecrm_parity_fraction(k: int, codec: str = "sum") -> float:
    """Parity memory as a share of the encoded rows and optimizer state: one parity row per k
    rows, float64 for ``sum`` (twice a float32 row), the rows' own width for ``xor``."""
    return (2.0 if codec == "sum" else 1.0) / k


def ecrm_overhead(
    costs: CheckpointCosts, k: int, backup_interval_s: float | None = None
) -> Overhead:
    """ECRM's expected overhead: parity updates all the time, a slower phase per failure.

    Per failure: rescheduling plus ``drop * T_rebuild`` (training goes on at ``1 - drop`` of
    its throughput while the replacement decodes, ECRM section 3.4), ``T_rebuild`` default
    ``k * load_s`` (decoding reads k rows per lost row, section 3.6). Plus the rare backup
    checkpoint, if any.
    """
    rebuild = costs.ecrm_rebuild_s if costs.ecrm_rebuild_s is not None else k * costs.load_s
    backup = 0.0
    if backup_interval_s:
        backup = costs.save_s / backup_interval_s
    return Overhead(
        save=backup,
        reschedule=costs.reschedule_s / costs.mtbf_s,
        running=costs.ecrm_normal_overhead,
        recovery=costs.ecrm_recovery_drop * rebuild / costs.mtbf_s,
    )


def _positive(**values: float) -> None:
    for name, value in values.items():
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name}={value!r}: must be a finite number > 0")


# ----------------------------------------------------------------------------- history


@dataclass(frozen=True)
class FailureHistory:
    """One past run: how long it trained, with how many embedding PS, how many PS failed."""

    seconds: float
    num_ps: int
    ps_failures: int


def mtbf_from_history(runs: Iterable[FailureHistory], num_emb_ps: int) -> float | None:
    """Mean seconds between PS failures for a job with ``num_emb_ps`` PS, from past runs.

    Failures are counted per PS-second (CPR section 3.1: MTBF falls linearly with the node
    count), then scaled to this job. A history without any failure counts one, a conservative
    guess rather than an infinite MTBF. None without any history.
    """
    ps_seconds = 0.0
    failures = 0
    for run in runs:
        if run.seconds < 0 or run.num_ps < 1 or run.ps_failures < 0:
            raise ValueError(f"invalid history entry {run!r}")
        ps_seconds += run.seconds * run.num_ps
        failures += run.ps_failures
    if ps_seconds <= 0:
        return None
    return ps_seconds / max(failures, 1) / num_emb_ps


# ----------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class CheckpointPlan:
    """What the master runs: the policy in effect, its save intervals and why.

    ``policy`` may differ from ``requested`` (CPR fell back to full recovery). ``interval_s``
    is T_save (full saves; for ECRM the backup interval, None: none); ``partial_interval_s``
    is the MFU/SSU save interval ``r*T_save`` (None otherwise).
    """

    requested: PolicyName
    policy: PolicyName
    interval_s: float | None
    partial_interval_s: float | None
    overhead: Overhead
    expected_pls: float
    reason: str
    variant: CprVariant | None = None
    r: float | None = None
    k: int | None = None
    alternatives: dict[str, float] = field(default_factory=dict)  # overhead of the others


def _pct(x: float) -> str:
    return f"{100.0 * x:.2f}%"


def _dur(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def _full_plan(cfg: CheckpointPolicyConfig, costs: CheckpointCosts) -> CheckpointPlan:
    if cfg.full.interval_s is not None:
        interval, how = cfg.full.interval_s, "set"
    else:
        interval, how = optimal_full_interval(costs.save_s, costs.mtbf_s), "sqrt(2*O_save*T_fail)"
    over = full_overhead(costs.save_s, costs.load_s, costs.mtbf_s, interval, costs.reschedule_s)
    return CheckpointPlan(
        requested="full",
        policy="full",
        interval_s=interval,
        partial_interval_s=None,
        overhead=over,
        expected_pls=0.0,
        reason=f"full recovery, T_save={_dur(interval)} ({how}), expected overhead "
        f"{_pct(over.total)}",
    )


def _cpr_plan(cfg: CheckpointPolicyConfig, costs: CheckpointCosts) -> CheckpointPlan:
    opts = cfg.cpr
    interval = opts.interval_s or cpr_interval(opts.target_pls, costs.num_emb_ps, costs.mtbf_s)
    r = 1.0 if opts.variant == "vanilla" else opts.r
    part = partial_overhead(
        costs.save_s,
        costs.load_s,
        costs.mtbf_s,
        interval,
        costs.reschedule_s,
        r=r,
        partial_save_s=costs.partial_save_s,
    )
    full = _full_plan(cfg.model_copy(update={"full": FullOptions()}), costs)
    pls = expected_pls(interval, costs.mtbf_s, costs.num_emb_ps)
    label = f"cpr ({opts.variant}, T_save={_dur(interval)}, expected PLS {pls:.3g})"
    benefit = full.overhead.total - part.total
    needed = opts.min_benefit * full.overhead.total
    kept = ""
    if benefit <= needed and not opts.fallback:
        kept = "; costs more than full recovery, kept (cpr.fallback=False)"
    elif benefit <= needed:
        why = (
            f"{label} would cost {_pct(part.total)} vs full recovery {_pct(full.overhead.total)} "
            f"(T_save={_dur(full.interval_s or 0.0)}): no benefit"
            + (f" of at least {_pct(opts.min_benefit)} of it" if opts.min_benefit else "")
            + ", falling back to full recovery"
        )
        return CheckpointPlan(
            requested="cpr",
            policy="full",
            interval_s=full.interval_s,
            partial_interval_s=None,
            overhead=full.overhead,
            expected_pls=0.0,
            reason=why,
            alternatives={"cpr": part.total},
        )
    return CheckpointPlan(
        requested="cpr",
        policy="cpr",
        interval_s=interval,
        partial_interval_s=None if opts.variant == "vanilla" else opts.r * interval,
        overhead=part,
        expected_pls=pls,
        reason=f"{label}: {_pct(part.total)} vs full recovery {_pct(full.overhead.total)}{kept}",
        variant=opts.variant,
        r=None if opts.variant == "vanilla" else opts.r,
        alternatives={"full": full.overhead.total},
    )


def _ecrm_backup(cfg: CheckpointPolicyConfig, costs: CheckpointCosts) -> float | None:
    if cfg.ecrm.backup_interval_s is not None:
        return cfg.ecrm.backup_interval_s or None
    return ECRM_BACKUP_FACTOR * optimal_full_interval(costs.save_s, costs.mtbf_s)


def _ecrm_plan(cfg: CheckpointPolicyConfig, costs: CheckpointCosts) -> CheckpointPlan:
    cfg.check_cluster(costs.num_emb_ps)
    k = cfg.ecrm.k
    backup = _ecrm_backup(cfg, costs)
    over = ecrm_overhead(costs, k, backup)
    memory = ecrm_parity_fraction(k, cfg.ecrm.codec)
    backup_text = f"backup checkpoint every {_dur(backup)}" if backup else "no backup checkpoint"
    return CheckpointPlan(
        requested="ecrm",
        policy="ecrm",
        interval_s=backup,
        partial_interval_s=None,
        overhead=over,
        expected_pls=0.0,
        reason=f"ecrm (k={k}, {cfg.ecrm.codec} parity, +{memory:.0%} memory, {backup_text}), "
        f"expected overhead {_pct(over.total)}",
        k=k,
    )


def plan_checkpoints(cfg: CheckpointPolicyConfig, costs: CheckpointCosts) -> CheckpointPlan:
    """The save schedule of ``cfg`` for a job with ``costs``, CPR's benefit check included."""
    if cfg.policy == "full":
        return _full_plan(cfg, costs)
    if cfg.policy == "cpr":
        return _cpr_plan(cfg, costs)
    return _ecrm_plan(cfg, costs)


# ----------------------------------------------------------------------------- recommendation


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
    full = _full_plan(full_cfg, costs)
    plans["full"] = full
    options.append(PolicyOption("full", full_cfg, full.overhead.total, 0.0, True, full.reason))

    for variant in ("mfu", "ssu", "vanilla"):
        label = f"cpr-{variant}"
        if pls_budget <= 0:
            cfg = CheckpointPolicyConfig(policy="cpr", mtbf_s=costs.mtbf_s)
            options.append(
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
        plan = _cpr_plan(cfg, costs)
        ok = plan.policy == "cpr"
        over = plan.overhead.total if ok else plan.alternatives["cpr"]
        why = plan.reason if ok else f"no benefit: {_pct(over)} vs full {_pct(full.overhead.total)}"
        options.append(PolicyOption(label, cfg, over, plan.expected_pls, ok, why))
        if ok:
            plans[label] = plan

    options.extend(_ecrm_options(costs, ecrm_codec, ecrm_k, plans))

    feasible = [o for o in options if o.feasible]
    best = min(
        feasible,
        key=lambda o: (round(o.overhead, 12), _PREFERENCE.index(o.label.split("(")[0])),
    )
    plan = plans[best.label]
    others = ", ".join(
        f"{o.label} {_pct(o.overhead)}" if o.feasible else f"{o.label} out ({o.reason})"
        for o in options
        if o is not best
    )
    reason = f"{best.label}: lowest expected overhead {_pct(best.overhead)}; {others}"
    return Recommendation(best.config, plan, tuple(options), reason)


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
        cfg = CheckpointPolicyConfig(
            policy="ecrm", mtbf_s=costs.mtbf_s, ecrm=EcrmOptions(k=k, codec=codec)
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
        plan = _ecrm_plan(cfg, costs)
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
        else (cfg.cpr.target_pls if cfg.policy == "cpr" else 0.0)
    )
    mine = plan_checkpoints(cfg, costs)
    rec = recommend_checkpoint_policy(
        costs, budget, ecrm_codec=cfg.ecrm.codec, ecrm_k=_user_k(cfg, costs)
    )
    gap = mine.overhead.total - rec.overhead
    if gap <= min_gap or gap <= tolerance * rec.overhead:
        return None
    return (
        f"checkpoint_policy={cfg.policy!r} is expected to cost {_pct(mine.overhead.total)} of "
        f"training time ({mine.reason}); recommended: {rec.reason}"
    )


def _user_k(cfg: CheckpointPolicyConfig, costs: CheckpointCosts) -> list[int] | None:
    if cfg.policy != "ecrm":
        return None
    cap = costs.num_emb_ps - 1
    return sorted({cfg.ecrm.k, *([min(4, cap)] if cap >= 2 else [])})
