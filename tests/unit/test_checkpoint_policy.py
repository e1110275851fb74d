"""Checkpoint policies: validation messages, the CPR formulas by hand, plans and the
recommendation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import BaseModel, ValidationError

from airflow_rover.core.policies import (
    CheckpointCosts,
    CheckpointPolicyConfig,
    CheckpointPolicyError,
    FailureHistory,
    cpr_interval,
    ecrm_overhead,
    ecrm_parity_fraction,
    expected_pls,
    full_overhead,
    judge_choice,
    mtbf_from_history,
    optimal_full_interval,
    partial_overhead,
    plan_checkpoints,
    recommend_checkpoint_policy,
)

# A production-like job (CPR section 3): 20 h between PS failures, 5-minute saves and loads,
# 10 minutes to reschedule, 8 embedding PS.
PROD = CheckpointCosts(
    save_s=300.0, load_s=300.0, mtbf_s=72_000.0, num_emb_ps=8, reschedule_s=600.0
)
# Failures every hour, saves as expensive, 2 PS: partial recovery at a small PLS cannot pay.
FLAKY = CheckpointCosts(save_s=300.0, load_s=60.0, mtbf_s=3600.0, num_emb_ps=2)


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("policy", "options", "message"),
    [
        ("foo", {}, "checkpoint_policy='foo'; accepted: full, cpr, ecrm"),
        ("cpr", {"r": 2.0}, "cpr.r=2.0: must be in (0, 1]"),
        ("cpr", {"target_pls": 0}, "cpr.target_pls=0.0: must be in (0, 1]"),
        ("cpr", {"variant": "lfu"}, "cpr.variant='lfu'; accepted: vanilla, mfu, ssu"),
        ("cpr", {"min_benefit": 1.0}, "cpr.min_benefit=1.0: must be in [0, 1)"),
        ("cpr", {"ssu_sample_period": 0}, "cpr.ssu_sample_period=0: must be >= 1"),
        ("full", {"interval_s": -5}, "full.interval_s=-5.0: must be > 0"),
        ("full", {"interval_s": math.inf}, "full.interval_s=inf: must be > 0"),
        ("ecrm", {"k": 1}, "ecrm.k=1: must be in [2, 64] (k=1 would be plain replication)"),
        ("ecrm", {"rows_per_lock": 0}, "ecrm.rows_per_lock=0: must be >= 1"),
        ("ecrm", {"codec": "rs"}, "ecrm.codec='rs'; accepted: sum, xor"),
        ("ecrm", {"mtbf_s": 0}, "mtbf_s=0.0: must be > 0"),
        ("cpr", {"r": "abc"}, "cpr.r='abc': Input should be a valid number"),
    ],
)
def test_bad_options_name_the_parameter_and_what_is_accepted(policy, options, message):
    with pytest.raises(CheckpointPolicyError) as err:
        CheckpointPolicyConfig.from_task_params(policy, options)
    assert str(err.value).startswith(message)


def test_unknown_options_list_the_accepted_ones():
    with pytest.raises(CheckpointPolicyError) as err:
        CheckpointPolicyConfig.from_task_params("ecrm", {"target_pls": 0.1})
    assert str(err.value) == (
        "checkpoint_options: unknown option(s) ['target_pls'] for checkpoint_policy='ecrm'; "
        "accepted: k, rows_per_lock, codec, backup_interval_s, mtbf_s"
    )
    with pytest.raises(CheckpointPolicyError) as err:
        CheckpointPolicyConfig.parse({"policy": "cpr", "cpr": {"foo": 1, "r": 3}})
    assert str(err.value) == (
        "cpr.r=3.0: must be in (0, 1]; cpr.foo: unknown option; accepted: target_pls, variant, "
        "r, interval_s, ssu_sample_period, min_benefit, fallback"
    )
    with pytest.raises(CheckpointPolicyError, match=r"^bogus: unknown option; accepted: policy"):
        CheckpointPolicyConfig.parse({"bogus": 1})
    with pytest.raises(CheckpointPolicyError, match=r"^checkpoint_policy='x'; accepted"):
        CheckpointPolicyConfig.parse({"policy": "x"})


def test_defaults_and_json_round_trip():
    cfg = CheckpointPolicyConfig()
    assert cfg.policy == "full" and cfg.full.interval_s is None
    assert (cfg.cpr.target_pls, cfg.cpr.variant, cfg.cpr.r) == (0.1, "mfu", 0.125)
    assert (cfg.ecrm.k, cfg.ecrm.rows_per_lock, cfg.ecrm.codec) == (4, 65_536, "sum")
    for c in [
        cfg,
        CheckpointPolicyConfig.from_task_params("cpr", {"variant": "ssu", "mtbf_s": 3600}),
        CheckpointPolicyConfig.from_task_params("ecrm", {"k": 2, "codec": "xor"}),
        CheckpointPolicyConfig.from_task_params("full", {"interval_s": 120}),
    ]:
        text = c.model_dump_json()
        assert CheckpointPolicyConfig.parse(text) == c
        assert CheckpointPolicyConfig.parse(c.model_dump()) == c
    with pytest.raises(ValidationError):
        cfg.policy = "cpr"  # type: ignore[misc]  # frozen, like the rest of the job spec


def test_config_nests_in_a_job_spec_model():
    """What JobSpec will do: a ``checkpoint`` field; errors carry their own clear message."""

    class Spec(BaseModel):
        checkpoint: CheckpointPolicyConfig = CheckpointPolicyConfig()

    spec = Spec.model_validate({"checkpoint": {"policy": "ecrm", "ecrm": {"k": 2}}})
    assert spec.checkpoint.ecrm.k == 2
    assert Spec.model_validate_json(spec.model_dump_json()) == spec
    with pytest.raises(ValidationError, match=r"cpr\.r=2\.0: must be in \(0, 1\]"):
        Spec.model_validate({"checkpoint": {"cpr": {"r": 2.0}}})


def test_ecrm_needs_k_plus_one_ps():
    cfg = CheckpointPolicyConfig.from_task_params("ecrm", {"k": 4})
    cfg.check_cluster(5)
    with pytest.raises(CheckpointPolicyError, match=r"ecrm.k=4: needs at least k\+1=5 .* has 3"):
        cfg.check_cluster(3)
    CheckpointPolicyConfig(policy="cpr").check_cluster(1)  # only ECRM cares


def test_costs_are_validated():
    with pytest.raises(ValueError, match="save_s=0"):
        CheckpointCosts(save_s=0.0, load_s=1.0, mtbf_s=1.0, num_emb_ps=1)
    with pytest.raises(ValueError, match="mtbf_s=-1"):
        CheckpointCosts(save_s=1.0, load_s=1.0, mtbf_s=-1.0, num_emb_ps=1)
    with pytest.raises(ValueError, match="num_emb_ps=0"):
        CheckpointCosts(save_s=1.0, load_s=1.0, mtbf_s=1.0, num_emb_ps=0)
    with pytest.raises(ValueError, match="load_s=nan"):
        CheckpointCosts(save_s=1.0, load_s=math.nan, mtbf_s=1.0, num_emb_ps=1)


# ----------------------------------------------------------------------------- formulas


def test_formulas_match_hand_computed_numbers():
    # sqrt(2 * 300 * 72000) = sqrt(43.2e6)
    assert optimal_full_interval(300, 72_000) == pytest.approx(6572.6707, abs=1e-4)
    full = full_overhead(300, 300, 72_000, 6572.6707, 600)
    assert full.save == pytest.approx(0.0456435, abs=1e-7)  # 300 / 6572.67
    assert full.lost == pytest.approx(0.0456435, abs=1e-7)  # 3286.34 / 72000 (= save at optimum)
    assert full.load == pytest.approx(300 / 72_000) and full.reschedule == pytest.approx(
        600 / 72_000
    )
    assert full.total == pytest.approx(0.1037870, abs=1e-7)
    assert cpr_interval(0.1, 8, 72_000) == pytest.approx(115_200)  # 2 * 0.1 * 8 * 72000 = 32 h
    assert expected_pls(115_200, 72_000, 8) == pytest.approx(0.1)  # 0.5 * 115200 / (72000 * 8)
    part = partial_overhead(300, 300, 72_000, 115_200, 600)
    assert part.lost == 0 and part.total == pytest.approx(300 / 115_200 + 900 / 72_000)
    mfu = partial_overhead(300, 300, 72_000, 115_200, 600, r=0.125)  # 37.5 s every 4 h
    assert mfu.save == pytest.approx(37.5 / 14_400)
    measured = partial_overhead(300, 300, 72_000, 115_200, 600, r=0.125, partial_save_s=60)
    assert measured.save == pytest.approx(60 / 14_400)
    assert ecrm_parity_fraction(4, "sum") == 0.5 and ecrm_parity_fraction(4, "xor") == 0.25
    ecrm = ecrm_overhead(PROD, 4, backup_interval_s=65_726.707)
    # 3% running + 600/72000 reschedule + 0.1 * 4 * 300 / 72000 rebuild + 300 / 65726.7 backup
    assert ecrm.total == pytest.approx(0.03 + 600 / 72_000 + 120 / 72_000 + 300 / 65_726.707)


def test_optimal_interval_minimises_full_recovery_overhead():
    rng = np.random.default_rng(0)
    for _ in range(50):
        save, load, mtbf = rng.uniform(1, 600), rng.uniform(0, 600), rng.uniform(600, 1e6)
        best = optimal_full_interval(save, mtbf)
        at = full_overhead(save, load, mtbf, best).total
        for factor in (0.5, 0.9, 0.99, 1.01, 1.1, 2.0):
            assert full_overhead(save, load, mtbf, best * factor).total > at


def test_plans_give_each_policy_its_intervals():
    full = plan_checkpoints(CheckpointPolicyConfig(), PROD)
    assert full.policy == "full" and full.interval_s == pytest.approx(6572.6707, abs=1e-4)
    assert full.overhead.total == pytest.approx(0.103787, abs=1e-6)
    assert "sqrt(2*O_save*T_fail)" in full.reason
    fixed = plan_checkpoints(
        CheckpointPolicyConfig.from_task_params("full", {"interval_s": 600}), PROD
    )
    assert fixed.interval_s == 600 and "(set)" in fixed.reason

    cpr = plan_checkpoints(CheckpointPolicyConfig.from_task_params("cpr"), PROD)
    assert (cpr.policy, cpr.variant, cpr.r) == ("cpr", "mfu", 0.125)
    assert cpr.interval_s == pytest.approx(115_200) and cpr.partial_interval_s == pytest.approx(
        14_400
    )
    assert cpr.expected_pls == pytest.approx(0.1)
    assert cpr.overhead.total == pytest.approx(0.0151042, abs=1e-6)
    assert cpr.alternatives["full"] == pytest.approx(full.overhead.total)
    vanilla = plan_checkpoints(
        CheckpointPolicyConfig.from_task_params("cpr", {"variant": "vanilla"}), PROD
    )
    assert vanilla.partial_interval_s is None and vanilla.r is None

    ecrm = plan_checkpoints(CheckpointPolicyConfig(policy="ecrm"), PROD)
    assert ecrm.policy == "ecrm" and ecrm.k == 4 and ecrm.expected_pls == 0
    assert ecrm.interval_s == pytest.approx(10 * 6572.6707, abs=1e-3)  # the rare backup
    none = plan_checkpoints(
        CheckpointPolicyConfig.from_task_params("ecrm", {"backup_interval_s": 0}), PROD
    )
    assert none.interval_s is None and "no backup checkpoint" in none.reason
    with pytest.raises(CheckpointPolicyError, match="needs at least"):
        plan_checkpoints(CheckpointPolicyConfig(policy="ecrm"), FLAKY)


def test_cpr_falls_back_to_full_recovery_and_says_why():
    cfg = CheckpointPolicyConfig.from_task_params("cpr", {"target_pls": 0.02})
    plan = plan_checkpoints(cfg, FLAKY)
    # T_save = 2*0.02*2*3600 = 288 s: 300/288 + 60/3600 = 105.8% vs full at 1469.7 s: 42.5%
    assert plan.requested == "cpr" and plan.policy == "full"
    assert plan.alternatives["cpr"] == pytest.approx(300 / 288 + 60 / 3600)
    assert plan.overhead.total == pytest.approx(0.42492, abs=1e-5)
    assert plan.reason == (
        "cpr (mfu, T_save=4.8 min, expected PLS 0.02) would cost 105.83% vs full recovery "
        "42.49% (T_save=24.5 min): no benefit, falling back to full recovery"
    )
    kept = plan_checkpoints(
        CheckpointPolicyConfig.from_task_params("cpr", {"target_pls": 0.02, "fallback": False}),
        FLAKY,
    )
    assert kept.policy == "cpr" and "kept (cpr.fallback=False)" in kept.reason
    # A real but too small benefit falls back when min_benefit asks for more.
    picky = CheckpointPolicyConfig.from_task_params("cpr", {"min_benefit": 0.9})
    assert plan_checkpoints(picky, PROD).policy == "full"
    assert "of at least 90.00% of it" in plan_checkpoints(picky, PROD).reason


# ----------------------------------------------------------------------------- recommendation


def test_recommends_cpr_when_failures_are_rare_and_saves_costly():
    rec = recommend_checkpoint_policy(PROD, pls_budget=0.1)
    assert rec.config.policy == "cpr" and rec.config.cpr.variant == "mfu"
    assert rec.config.cpr.target_pls == 0.1
    assert rec.plan.interval_s == pytest.approx(115_200)
    assert rec.overhead == pytest.approx(0.0151042, abs=1e-6)
    by_label = {o.label: o for o in rec.options}
    assert by_label["full"].overhead == pytest.approx(0.103787, abs=1e-6)
    assert by_label["ecrm(k=4)"].feasible
    assert rec.reason.startswith("cpr-mfu: lowest expected overhead 1.51%; full 10.38%")
    assert "\n" not in rec.reason


def test_recommends_full_when_the_benefit_check_fails():
    rec = recommend_checkpoint_policy(FLAKY, pls_budget=0.02)
    assert rec.config.policy == "full"
    assert rec.plan.interval_s == pytest.approx(math.sqrt(2 * 300 * 3600))
    by_label = {o.label: o for o in rec.options}
    assert not by_label["cpr-mfu"].feasible
    assert by_label["cpr-mfu"].reason == "no benefit: 105.83% vs full 42.49%"
    assert rec.reason == (
        "full: lowest expected overhead 42.49%; cpr-mfu out (no benefit: 105.83% vs full "
        "42.49%), cpr-ssu out (no benefit: 105.83% vs full 42.49%), cpr-vanilla out (no "
        "benefit: 105.83% vs full 42.49%), ecrm(k=4) out (needs 5 PS, the job has 2)"
    )
    assert not by_label["ecrm(k=4)"].feasible and "needs 5 PS" in by_label["ecrm(k=4)"].reason


def test_recommends_ecrm_when_no_update_may_be_lost():
    rec = recommend_checkpoint_policy(PROD, pls_budget=0.0)
    assert rec.config.policy == "ecrm" and rec.config.ecrm.k == 4
    assert all(not o.feasible for o in rec.options if o.label.startswith("cpr"))
    assert "no PLS budget" in rec.reason


def test_ecrm_k_follows_memory_headroom():
    gib = 2**30
    roomy = CheckpointCosts(
        save_s=300.0,
        load_s=300.0,
        mtbf_s=7200.0,
        num_emb_ps=10,
        embedding_bytes=100 * gib,
        memory_headroom_bytes=60 * gib,
    )
    rec = recommend_checkpoint_policy(roomy, pls_budget=0.0)
    # sum parity: k=2 needs 100 GiB (no), k=4 50 GiB (yes, cheaper rebuild than k=8)
    assert rec.config.ecrm.k == 4
    by_label = {o.label: o for o in rec.options}
    assert not by_label["ecrm(k=2)"].feasible and "GiB free" in by_label["ecrm(k=2)"].reason
    assert by_label["ecrm(k=8)"].overhead > by_label["ecrm(k=4)"].overhead
    xor = recommend_checkpoint_policy(roomy, pls_budget=0.0, ecrm_codec="xor")
    assert xor.config.ecrm.k == 2 and xor.config.ecrm.codec == "xor"  # 50 GiB fits
    tight = CheckpointCosts(**{**roomy.__dict__, "memory_headroom_bytes": 1 * gib})
    assert recommend_checkpoint_policy(tight, pls_budget=0.0).config.policy == "full"


def test_recommendation_never_exceeds_the_pls_budget_and_is_the_cheapest():
    rng = np.random.default_rng(11)
    for _ in range(200):
        costs = CheckpointCosts(
            save_s=float(rng.uniform(1, 900)),
            load_s=float(rng.uniform(1, 900)),
            mtbf_s=float(rng.uniform(600, 200_000)),
            num_emb_ps=int(rng.integers(1, 12)),
            reschedule_s=float(rng.uniform(0, 600)),
        )
        budget = float(rng.choice([0.0, 0.01, 0.1, 0.3]))
        rec = recommend_checkpoint_policy(costs, budget)
        assert rec.plan.expected_pls <= budget + 1e-12
        feasible = [o.overhead for o in rec.options if o.feasible]
        assert rec.overhead == pytest.approx(min(feasible))
        assert judge_choice(rec.config, costs, budget) is None  # the recommendation itself


def test_judge_choice_flags_a_clearly_worse_choice_only():
    full = CheckpointPolicyConfig(policy="full")
    note = judge_choice(full, PROD, pls_budget=0.1)
    assert note is not None
    assert note.startswith("checkpoint_policy='full' is expected to cost 10.38% of training time")
    assert "recommended: cpr-mfu: lowest expected overhead 1.51%" in note
    # A user who chose full asked for no lost update: compared with ECRM only.
    assert "recommended: ecrm(k=4)" in (judge_choice(full, PROD) or "")
    assert judge_choice(CheckpointPolicyConfig(policy="cpr"), PROD) is None
    assert judge_choice(CheckpointPolicyConfig(policy="ecrm"), PROD) is None
    assert judge_choice(full, FLAKY, pls_budget=0.02) is None


def test_mtbf_from_history_scales_with_the_ps_count():
    runs = [FailureHistory(36_000, 4, 2), FailureHistory(72_000, 8, 6)]
    # 720,000 PS-seconds, 8 failures (+ 1/2, the prior): 84,706 s per PS; 6 PS fail 6 times
    # as often
    assert mtbf_from_history(runs, 6) == pytest.approx(720_000 / 8.5 / 6)
    assert mtbf_from_history([FailureHistory(3600, 2, 0)], 2) == pytest.approx(7200)
    assert mtbf_from_history([], 4) is None
    assert CheckpointPolicyConfig().failure_interval(runs, 6) == pytest.approx(720_000 / 8.5 / 6)
    assert CheckpointPolicyConfig(mtbf_s=99.0).failure_interval(runs, 6) == 99.0
    with pytest.raises(ValueError, match="invalid history entry"):
        mtbf_from_history([FailureHistory(-1, 1, 0)], 1)
