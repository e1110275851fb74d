"""Step profiles: phase totals that survive the PS's Stats reply, and the steady-state rate
of concurrent trainers from their step timelines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.spec import FeatureConfig, TableConfig
from airflow_rover.core.step_profile import StepProfile, phases_from_arrays, steady_rate
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc.ps_client import PSClient
from airflow_rover.worker.profile_report import profile_file, write_profile
from airflow_rover.worker.progress import Progress

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


def test_a_worker_writes_its_profile_with_its_ps_s_next_to_its_log(tmp_path: Path) -> None:
    optimizer = Optimizer("adagrad", 0.1)
    ps = ParameterServer(0, 1, EmbeddingPlacement.from_features(FEATURES), optimizer, 0)
    server, port = start_server(ps, TOKEN, threads=2)
    client = PSClient([f"127.0.0.1:{port}"], TOKEN)
    progress = Progress()
    try:
        client.push_pull_async(None, {"dim4": np.array([3], dtype=np.int64)}, [-1]).result()
        progress.profile.add("worker/tf_step", 1000)
        progress.profile.step(512)
        path = profile_file(tmp_path / "logs" / "worker-0.log")
        path.parent.mkdir()
        write_profile(path, progress, client, traces=1)
    finally:
        client.close()
        server.stop(0)
    assert path.name == "worker-0.profile.json"
    report = json.loads(path.read_text())
    assert report["worker"]["ns"]["worker/tf_step"] == 1000
    assert report["worker"]["calls"]["rpc/PushPull/wait"] == 1  # the client's phases too
    assert report["worker"]["step_samples"] == [512] and report["worker"]["tf_traces"] == 1
    assert len(report["worker"]["step_cpu"]) == 1 and report["worker"]["step_cpu"][0] > 0
    assert report["ps"][0]["calls"]["ps/PushPull/handle"] == 1


def test_a_profile_is_written_without_the_ps_when_it_is_gone(tmp_path: Path) -> None:
    client = PSClient(["127.0.0.1:1"], TOKEN, timeout_s=1.0)  # nothing listens there
    try:
        write_profile(tmp_path / "w.profile.json", Progress(), client, traces=1)
    finally:
        client.close()
    report = json.loads((tmp_path / "w.profile.json").read_text())
    assert report["ps"] == [] and report["worker"]["step_ends"] == []
