"""The measured world (``bench/worlds/measured.py``) serves the committed table of the real
runtime's speed (``bench/worlds/measured.json``): it loads, every measured plan has positive
figures, it satisfies the simulator's ``World`` protocol, the job is sized for the scaling to
matter, and bad tables or unmeasured plans are refused with the reason named."""

from __future__ import annotations

import copy
import inspect
import json
import sys
from pathlib import Path
from typing import Any, get_type_hints

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench._simcore import Config  # noqa: E402
from bench._world import World  # noqa: E402
from bench.worlds.measured import ORACLE_JCT_S, TABLE, MeasuredWorld, load, worlds  # noqa: E402


@pytest.fixture(scope="module")
def record() -> dict[str, Any]:
    return dict(json.loads(TABLE.read_text()))


def test_the_table_names_what_was_measured_and_where(record: dict[str, Any]) -> None:
    assert record["machine"]["cpu_count"] >= 1 and record["machine"]["cpu_model"]
    assert record["measured_at"][:4].isdigit()
    assert record["software"]["tensorflow"]
    assert record["dataset"]["num_train"] > 0
    models = {w["model"] for w in record["workloads"]}
    assert "wide_deep" in models  # the reference model


def test_one_world_per_workload_with_every_measured_plan(record: dict[str, Any]) -> None:
    found = worlds()
    assert [w.name for w in found] == [f"measured/{w['name']}" for w in record["workloads"]]
    for world, workload in zip(found, record["workloads"], strict=True):
        assert len(world.plans()) == len(workload["plans"])
        for cfg in world.plans():
            worker, ps = world.cpu_used(cfg)
            assert world.iteration_s(cfg) > 0 and worker > 0
            assert len(ps) == cfg.num_ps and all(c > 0 for c in ps)
            assert cfg.cores <= world.budget
        assert world.noise > 0 and world.pod_start_s > 0 and world.init_s > 0
        print(
            f"\n{world.name}: {len(world.plans())} plans, noise {world.noise:.3f}, pod start "
            f"{world.pod_start_s:.1f} s, init {world.init_s:.1f} s, budget {world.budget:g}"
        )


def test_the_best_plan_trains_the_job_in_the_oracle_time() -> None:
    for world in worlds():
        best = max(c.workers / world.iteration_s(c) for c in world.plans())
        jct = world.pod_start_s + world.init_s + world.total_steps / best
        assert 20 * 60 <= jct <= 60 * 60
        assert jct == pytest.approx(ORACLE_JCT_S, rel=1e-3)


def test_a_world_satisfies_the_protocol() -> None:
    for world in worlds():
        for name, kind in get_type_hints(World).items():
            value = getattr(world, name)
            assert isinstance(value, float | int if kind is float else kind), name
        assert all(world.runs(c) for c in world.plans())
        for name in ("plans", "runs", "iteration_s", "cpu_used"):
            assert inspect.signature(getattr(MeasuredWorld, name)).parameters.keys() == (
                inspect.signature(getattr(World, name)).parameters.keys()
            )


def test_an_unmeasured_plan_is_refused_naming_the_plans_it_runs() -> None:
    world = worlds()[0]
    assert not world.runs(Config(9, 1.0, (1.0,)))
    with pytest.raises(ValueError, match=r"cfg: 9w x 1c \+ 1ps x 1c was not measured.*runs only"):
        world.iteration_s(Config(9, 1.0, (1.0,)))
    with pytest.raises(ValueError, match="was not measured"):
        world.cpu_used(Config(9, 1.0, (1.0,)))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("iteration_s", None, "plan 0: iteration_s is missing"),
        ("iteration_s", 0.0, "plan 0: iteration_s must be a positive number, got 0.0"),
        ("ps_cpu_used", [0.5, 0.5, 0.5], "ps_cpu_used has 3 entries for"),
        ("worker_init_s", [], "worker_init_s must be a non-empty list"),
    ],
)
def test_a_bad_table_is_refused_naming_the_field(
    record: dict[str, Any], tmp_path: Path, field: str, value: Any, message: str
) -> None:
    bad = copy.deepcopy(record)
    row = bad["workloads"][0]["plans"][0]
    if value is None:
        del row[field]
    else:
        row[field] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=f"bad.json: workload 0.*{message}"):
        load(path)
