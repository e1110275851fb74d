"""``bench/simulator.py --quick``: it runs, fast, and prints every table it promises (the goals'
outcomes are the full run's business, not this test's). Plus the simulated world's invariants:
with an even split it is exactly the throughput model, a hot PS is fixed by bigger PS more
than by more PS, and a run is a function of its seed."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from airflow_rover.core.spec import ResourcePlan  # noqa: E402
from airflow_rover.core.throughput import Coefficients, JobShape, ThroughputModel  # noqa: E402
from bench._policies import ElasticScheduler, Setting, oracle_config  # noqa: E402
from bench._simcore import (  # noqa: E402
    TIME_UNIT_S,
    Config,
    Workload,
    iteration_time,
    simulate,
    steps_per_s,
)

POLICIES = (
    "oracle",
    "airflow-rover (warm)",
    "airflow-rover (cold)",
    "dlrover-heuristic",
    "optimus",
    "es",
)
SHAPE = JobShape(batch_size=1, model_size=0.25, bandwidth=1.0, embedding_dim=1)
PAPER = Coefficients.paper()


@pytest.fixture(scope="module")
def quick_run() -> tuple[str, float]:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "simulator.py"), "--quick", "--seed", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, elapsed


def test_quick_run_is_fast(quick_run: tuple[str, float]) -> None:
    assert quick_run[1] < 20.0


def test_quick_run_prints_a_table_per_workload(quick_run: tuple[str, float]) -> None:
    out = quick_run[0]
    sections = re.split(r"^== ", out, flags=re.M)[1:]
    workloads = [s for s in sections if s.startswith(("Wide&Deep-like", "xDeepFM-like"))]
    assert len(workloads) == 2
    for section in workloads:
        lines = section.splitlines()
        header = next(line for line in lines if line.startswith("policy"))
        for column in ("JCT s", "/oracle", "/Optimus", "/ES", "time-to-final-plan s"):
            assert column in header
        for policy in POLICIES:
            row = next(line for line in lines if line.startswith(policy + " "))
            cells = row[len(policy) :].split()
            jct, vs_oracle, vs_optimus, vs_es, final_s = map(float, cells[:5])
            assert jct > 0 and final_s >= 0
            assert vs_oracle > 0 and vs_optimus > 0 and vs_es > 0
        oracle_row = next(line for line in lines if line.startswith("oracle "))
        assert oracle_row.split()[2] == "1.000"


def test_quick_run_prints_the_trace_and_the_goals(quick_run: tuple[str, float]) -> None:
    out = quick_run[0]
    trace = out[out.index("== Trace") : out.index("== Goals")]
    for allocation in ("fifo", "arbiter"):
        row = next(line for line in trace.splitlines() if line.startswith(allocation + " "))
        assert all(float(x) >= 0 for x in row.split()[1:])
    goals = [line for line in out[out.index("== Goals") :].splitlines()[1:] if line.strip()]
    goals = [g for g in goals if not g.startswith("(")]
    assert len(goals) == 15  # 2 workloads x (2 variants x 3 + warm start) + the trace
    assert all(re.match(r"^(MET|NOT MET) ", g) for g in goals)
    assert re.search(r"^\(seed 0, quick run, [\d.]+ s\)$", out, flags=re.M)


def test_even_split_is_exactly_the_throughput_model() -> None:
    truth = Coefficients(*(PAPER.as_array() * [2.0, 5.0, 1.0, 1.5, 1.0]))
    wl = Workload("even", truth, SHAPE)
    model = ThroughputModel(truth, SHAPE)
    for plan in (
        ResourcePlan(num_workers=1, num_ps=1, worker_cpu=1.0, ps_cpu=1.0),
        ResourcePlan(num_workers=24, num_ps=8, worker_cpu=3.0, ps_cpu=16.0),
    ):
        assert iteration_time(wl, Config.of(plan)) == pytest.approx(model.iteration_time(plan))
        expected = model.throughput(plan) / TIME_UNIT_S
        assert steps_per_s(wl, Config.of(plan)) == pytest.approx(expected)


def test_hot_ps_is_fixed_by_bigger_ps_more_than_by_more_ps() -> None:
    truth = Coefficients(*(PAPER.as_array() * [1.0, 24.0, 1.0, 1.0, 1.0]))
    hot = Workload("hot", truth, SHAPE, hot_share=0.3)
    even = Workload("even", truth, SHAPE)
    base = Config(24, 2.0, (8.0,) * 4)
    bigger = Config(24, 2.0, (16.0,) * 4)  # twice the PS cores in bigger PS
    more = Config(24, 2.0, (8.0,) * 8)  # twice the PS cores in more PS
    assert steps_per_s(even, bigger) == pytest.approx(steps_per_s(even, more), rel=0.1)
    assert steps_per_s(hot, base) < steps_per_s(even, base)
    gain_bigger = steps_per_s(hot, bigger) / steps_per_s(hot, base)
    gain_more = steps_per_s(hot, more) / steps_per_s(hot, base)
    assert gain_bigger > gain_more > 1.0


def test_a_run_is_a_function_of_its_seed() -> None:
    truth = Coefficients(*(PAPER.as_array() * [12.0, 1.0, 1.0, 1.0, 1.0]))
    wl = Workload("xdeepfm", truth, SHAPE, total_steps=20_000)
    setting = Setting()
    best = oracle_config(wl, setting)

    class Recording(ElasticScheduler):
        seen: list[float]

        def decide(self, view):  # type: ignore[no-untyped-def]
            self.seen = [r.iteration_s for r in view.reports]
            return super().decide(view)

    def run(seed: int) -> tuple[float, list[tuple[float, Config]], list[float]]:
        policy = Recording(best, 1, setting)
        result = simulate(wl, policy, setting.budget, seed)
        return result.jct_s, result.changes, policy.seen

    assert run(3) == run(3)
    assert run(3)[2] != run(4)[2]  # other noise in what the policy observes
