"""``bench/simulator.py``: it drives the master's own autoscaler, runs a world plug-in fast and
prints every table and goal it promises (the goals' outcomes are the full run's business), and
its worlds keep their invariants."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
sys.path[:0] = [str(REPO), str(FIXTURES)]

from sim_worlds import worlds as small_worlds  # noqa: E402

import bench.simulator as simulator  # noqa: E402
from airflow_rover.core.spec import ResourcePlan  # noqa: E402
from airflow_rover.core.throughput import JobShape, ThroughputModel  # noqa: E402
from airflow_rover.master import autoscaler as master_autoscaler  # noqa: E402
from bench._master_policy import MasterAutoscaler, config_of  # noqa: E402
from bench._policies import ElasticScheduler, Setting  # noqa: E402
from bench._simcore import Config, simulate, steps_per_s  # noqa: E402
from bench._world import load, oracle  # noqa: E402
from bench.worlds.contention import ContentionWorld, zipf  # noqa: E402
from bench.worlds.dlrover_rm import TIME_UNIT_S, DlroverRmWorld, scaled  # noqa: E402

POLICIES = (
    "oracle",
    "airflow-rover (warm)",
    "airflow-rover (cold)",
    "dlrover-heuristic-brain",
    "dlrover-heuristic",
    "optimus",
    "es",
)


@pytest.fixture(scope="module")
def quick_run() -> str:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "simulator.py"), "--quick", "--no-trace",
         "--world", "sim_worlds:worlds"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(FIXTURES)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_world_plug_in_prints_its_table(quick_run: str) -> None:
    section = quick_run[quick_run.index("== small/compute") : quick_run.index("== Goals")]
    lines = section.splitlines()
    header = next(line for line in lines if line.startswith("policy"))
    for column in ("JCT s", "/oracle", "/Optimus", "/ES", "/DLRover", "final plan at s"):
        assert column in header
    for policy in POLICIES:
        row = next(line for line in lines if line.startswith(policy + " "))
        cells = row[len(policy) :].split()
        jct, *ratios, final_s = map(float, cells[:6])
        assert jct > 0 and final_s >= 0 and all(r > 0 for r in ratios)
    assert next(line for line in lines if line.startswith("oracle ")).split()[2] == "1.000"


def test_every_goal_is_printed_met_or_not(quick_run: str) -> None:
    goals = [g for g in quick_run[quick_run.index("== Goals") :].splitlines()[1:] if g.strip()]
    verdicts = [g for g in goals if re.match(r"^(MET|NOT MET) ", g)]
    assert len(verdicts) == 8  # 2 starts x (oracle, Optimus, ES, DLRover)
    assert re.search(r"^\d+ of 8 goals met \(seed 0, quick run, [\d.]+ s\)$", quick_run, re.M)


def test_the_simulator_drives_the_masters_autoscaler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every plan airflow-rover applies in the simulator is one the master's ``Autoscaler``
    class proposed: patch its ``propose`` and the simulated job follows the patch."""
    proposed: list[ResourcePlan] = []
    real = master_autoscaler.Autoscaler.propose

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        record = real(self, *args, **kwargs)
        if record is not None:
            proposed.append(record.plan)
        return record

    monkeypatch.setattr(master_autoscaler.Autoscaler, "propose", spy)
    (world,) = small_worlds()
    policy = simulator.rover(world, Setting.of(world), [], "airflow-rover (cold)")
    assert type(policy.autoscaler) is master_autoscaler.Autoscaler
    result = simulate(world, policy, seed=0)
    applied = [record.plan for record in policy.applied]
    assert applied and applied == proposed
    assert [cfg for _, cfg in result.changes[1:]] == [
        config_of(plan) for plan in applied if config_of(plan) != result.changes[0][1]
    ][: len(result.changes) - 1]

    monkeypatch.setattr(master_autoscaler.Autoscaler, "propose", lambda *a, **k: None)
    still = simulate(world, simulator.rover(world, Setting.of(world), [], "cold"), seed=0)
    assert len(still.changes) == 1  # the master proposes nothing: the job keeps its first plan


def test_worlds_load_by_module_and_function() -> None:
    assert [w.name for w in load("bench.worlds.contention:worlds")] == [
        "contention/ranker",
        "contention/tower",
    ]
    with pytest.raises(ValueError, match=r"--world 'bench\.worlds\.contention': give it as"):
        load("bench.worlds.contention")


def test_the_dlrover_rm_world_with_an_even_split_is_the_throughput_model() -> None:
    truth = scaled(grad=2.0, upd=5.0, emb=1.5)
    world = DlroverRmWorld("even", "", truth)
    model = ThroughputModel(truth, JobShape(512, 0.25, 1.0, 16))
    for plan in (
        ResourcePlan(num_workers=1, num_ps=1, worker_cpu=1.0, ps_cpu=1.0),
        ResourcePlan(num_workers=24, num_ps=8, worker_cpu=3.0, ps_cpu=16.0),
    ):
        expected = model.iteration_time(plan) * TIME_UNIT_S
        assert world.iteration_s(Config.of(plan)) == pytest.approx(expected)


def test_a_hot_ps_is_fixed_by_a_bigger_hot_ps_more_than_by_more_ps() -> None:
    truth = scaled(upd=24.0)
    hot, even = DlroverRmWorld("hot", "", truth, hot_share=0.3), DlroverRmWorld("even", "", truth)
    base = Config(24, 2.0, (8.0,) * 4)
    bigger = Config(24, 2.0, (16.0,) * 4)  # twice the PS cores in bigger PS
    more = Config(24, 2.0, (8.0,) * 8)  # twice the PS cores in more PS
    hot_alone = Config(24, 2.0, (32.0, 8.0, 8.0, 8.0))  # PS 0 alone bigger, fewer cores
    assert steps_per_s(even, bigger) == pytest.approx(steps_per_s(even, more), rel=0.1)
    assert steps_per_s(hot, base) < steps_per_s(even, base)
    assert steps_per_s(hot, bigger) > steps_per_s(hot, more) > steps_per_s(hot, base)
    assert steps_per_s(hot, hot_alone) > steps_per_s(hot, bigger)
    assert hot_alone in hot.plans() and hot_alone not in even.plans()


def test_the_contention_world_saturates_where_the_model_does_not() -> None:
    """Workers beyond the fabric's share each add less; PS beyond the hottest table's share
    add nothing to the busiest PS."""
    world = ContentionWorld(
        "c", "", compute_s=0.3, serial=0.15, ps_core_s=0.001, tables=zipf(12, 1.1),
        exchange_mb=60.0, total_steps=1.0,
    )  # fmt: skip
    rates = [steps_per_s(world, Config(w, 2.0, (8.0,) * 4)) for w in (6, 12, 24)]
    assert rates[1] / rates[0] < 1.8 and rates[2] / rates[1] < rates[1] / rates[0]
    shares = [world.ps_shares(p)[0] for p in (2, 4, 8)]
    assert shares[2] == pytest.approx(max(zipf(12, 1.1)))
    assert shares[0] > shares[1] >= shares[2]


def test_a_run_is_a_function_of_its_seed() -> None:
    (world,) = small_worlds()
    best = oracle(world)

    class Recording(ElasticScheduler):
        seen: list[float]

        def decide(self, view):  # type: ignore[no-untyped-def]
            self.seen = [r.iteration_s for r in view.reports]
            return super().decide(view)

    def run(seed: int) -> tuple[float, list[tuple[float, Config]], list[float]]:
        policy = Recording(Config(1, best.worker_cpu, best.ps_cpu), 1, Setting.of(world))
        result = simulate(world, policy, seed)
        return result.jct_s, result.changes, policy.seen

    assert run(3) == run(3)
    assert run(3)[2] != run(4)[2]  # other noise in what the policy observes


def test_the_cold_master_policy_starts_small() -> None:
    (world,) = small_worlds()
    policy = MasterAutoscaler(
        "cold", world, Setting.of(world), simulator.cold_plan(Setting.of(world))
    )
    assert policy.initial().workers == 1
