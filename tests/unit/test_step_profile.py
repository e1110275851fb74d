"""Step profiles: phase totals that survive the PS's Stats reply, and the steady-state rate
of concurrent trainers from their step timelines."""

from __future__ import annotations

import numpy as np

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.spec import FeatureConfig, TableConfig
from airflow_rover.core.step_profile import StepProfile, phases_from_arrays, steady_rate
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc.ps_client import PSClient

TOKEN = "profile-token"
KEYS = iter(range(1, 1000))  # a fresh batch key per push: the ledger turns repeats away
FEATURES = FeatureConfig(
    num_dense=2, tables=(TableConfig(name="a", column="C1", vocab_size=100, dim=4),)
)


def test_phases_add_up_and_round_trip_through_arrays() -> None:
    profile = StepProfile()
    profile.add("x", 5)
    profile.add("x", 7)
    with profile.phase("y"):
        sum(range(1000))
    back = phases_from_arrays(profile.to_arrays())
    assert back["ns"]["x"] == 12 and back["calls"] == {"x": 2, "y": 1}
    assert back["ns"]["y"] > 0
    assert phases_from_arrays({}) == {"ns": {}, "calls": {}}


def test_steady_rate_counts_the_window_every_trainer_is_past_warm_up() -> None:
    s = 1_000_000_000
    fast = ([s * t for t in range(1, 11)], [100] * 10)  # steps end at 1..10 s
    slow = ([s * t for t in (3, 5, 7, 9, 11)], [100] * 5)  # 3..11 s
    # window (5 s, 10 s]: fast's steps at 6..10 (5), slow's at 7 and 9 (2): 700 samples / 5 s
    assert steady_rate([fast, slow], warmup_steps=2) == 700 / 5
    assert steady_rate([fast], warmup_steps=0) == 900 / 9
    assert steady_rate([slow], warmup_steps=5) is None  # no step after warm-up
    assert steady_rate([], warmup_steps=2) is None


def test_a_ps_reports_where_its_push_pulls_went_and_the_client_where_it_waited() -> None:
    optimizer = Optimizer("adagrad", 0.1)
    ps = ParameterServer(0, 1, EmbeddingPlacement.from_features(FEATURES), optimizer, 0)
    server, port = start_server(ps, TOKEN, threads=2)
    client = PSClient([f"127.0.0.1:{port}"], TOKEN)
    try:
        client.init_dense({"w": np.ones((2, 2), np.float32)})
        ids = {"dim4": np.array([1, 5, 9], dtype=np.int64)}
        push = (ids, {"dim4": np.ones((3, 4), np.float32)}, {"w": np.ones((2, 2), np.float32)})
        for pending in (None, push, push):
            client.push_pull_async(pending, ids, [-1], push_key=next(KEYS)).result()
        (stats,) = client.stats()
    finally:
        client.close()
        server.stop(0)
    phases = phases_from_arrays(stats)
    assert phases["calls"]["ps/PushPull/handle"] == 3
    assert phases["calls"]["ps/push/apply"] == 2 and phases["calls"]["ps/pull"] == 3
    assert all(phases["ns"][k] > 0 for k in ("ps/PushPull/decode", "ps/PushPull/encode"))
    assert client.profile.calls["rpc/PushPull/wait"] == 3
    assert client.profile.calls["rpc/PushPull/encode"] == 3
