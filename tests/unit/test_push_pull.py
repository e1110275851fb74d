"""PushPull: one round trip applies the last gradients and reads the next rows; dense weights
travel back only when another worker changed them, and the worker's mirror stays exact."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import numpy as np
import pytest

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.spec import FeatureConfig, TableConfig
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc.ps_client import PSClient

TOKEN = "push-pull-token"
FEATURES = FeatureConfig(
    num_dense=2, tables=(TableConfig(name="a", column="C1", vocab_size=100, dim=4),)
)
DENSE = {"w": np.ones((3, 2), np.float32), "b": np.zeros(2, np.float32)}


@pytest.fixture(params=[1, 2], ids=["1ps", "2ps"])
def client(request) -> Iterator[PSClient]:
    optimizer = Optimizer("adagrad", 0.1)
    servers, addresses = [], []
    for i in range(request.param):
        ps = ParameterServer(
            i, request.param, EmbeddingPlacement.from_features(FEATURES), optimizer, 0
        )
        server, port = start_server(ps, TOKEN, threads=2)
        servers.append(server)
        addresses.append(f"127.0.0.1:{port}")
    c = PSClient(addresses, TOKEN)
    c.init_dense(DENSE)
    yield c
    c.close()
    for s in servers:
        s.stop(0)


def grads(seed: int) -> tuple[dict, dict, dict]:
    rng = np.random.default_rng(seed)
    ids = {"dim4": np.array([1, 5, 9], dtype=np.int64)}
    rows = {"dim4": rng.normal(size=(3, 4)).astype(np.float32)}
    dense = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in DENSE.items()}
    return ids, rows, dense


def test_rows_read_after_a_push_pull_include_the_pushed_update(client: PSClient) -> None:
    ids = {"dim4": np.array([1, 5, 9], dtype=np.int64)}
    before, reply = client.push_pull(None, ids, [-1] * client.num_ps)
    assert all(reply.fresh) or set(reply.values) == set(DENSE)
    after, _ = client.push_pull(grads(0), ids, [-1] * client.num_ps)
    reference, _ = client.pull(ids, dense=False)
    np.testing.assert_array_equal(after["dim4"], reference["dim4"])
    assert not np.array_equal(after["dim4"], before["dim4"])


def test_dense_values_come_back_only_when_someone_else_pushed(client: PSClient) -> None:
    ids = {"dim4": np.array([2], dtype=np.int64)}
    _, first = client.push_pull(None, ids, [-1] * client.num_ps)
    assert set(first.values) == set(DENSE) and first.state  # everything, the first time
    owners = {client.dense_owner(n) for n in DENSE}
    expected = [v + 1 if i in owners else v for i, v in enumerate(first.versions)]
    _, mine = client.push_pull(grads(1), ids, expected)
    assert mine.values == {} and not any(mine.fresh) and mine.versions == expected
    client.push(*grads(2))  # another worker's update
    _, theirs = client.push_pull(None, ids, mine.versions)
    assert set(theirs.values) == set(DENSE)
    assert [theirs.fresh[i] for i in sorted(owners)] == [True] * len(owners)


def test_the_local_mirror_is_bit_identical_to_the_ps() -> None:
    """Applying one's own update locally gives exactly the PS's values (same code, same bytes)."""
    optimizer = Optimizer("adam", 0.01)
    ps = ParameterServer(0, 1, EmbeddingPlacement.from_features(FEATURES), optimizer, 0)
    ps.dense.initialize(DENSE)
    values = {k: v.copy() for k, v in DENSE.items()}
    state = {k: optimizer.init_state(v.shape, rows=False) for k, v in DENSE.items()}
    for seed in range(5):
        _, _, dense = grads(seed)
        ps.dense.apply_gradients(dense)
        for name, grad in dense.items():
            optimizer.apply(values[name], state[name], grad)
    for name, value in ps.dense.read().items():
        np.testing.assert_array_equal(value, values[name])
    assert ps.dense.version == 5


@pytest.mark.parametrize("name", ["sgd", "adagrad", "adam"])
def test_rows_read_ahead_and_replayed_equal_rows_read_after_the_push(name: str) -> None:
    """The worker reads step k+1's rows before pushing step k; replaying step k's update on
    the rows both steps touch (with the state the PS returned) gives the PS's rows exactly."""
    optimizer = Optimizer(name, 0.05)
    layout = EmbeddingPlacement.from_features(FEATURES)
    servers = [ParameterServer(i, 2, layout, optimizer, 0) for i in range(2)]
    started = [start_server(ps, TOKEN, threads=2) for ps in servers]
    client = PSClient([f"127.0.0.1:{port}" for _, port in started], TOKEN)
    try:
        client.init_dense(DENSE)
        rng = np.random.default_rng(7)
        step_ids = {"dim4": np.array([1, 5, 9, 40, 77], dtype=np.int64)}
        next_ids = {"dim4": np.array([0, 5, 9, 41, 77, 99], dtype=np.int64)}
        client.pull(step_ids)
        for _ in range(3):  # some optimizer state on the shared rows first
            g = {"dim4": rng.normal(size=(5, 4)).astype(np.float32)}
            client.push(step_ids, g, {})
        own = {"dim4": rng.normal(size=(5, 4)).astype(np.float32)}
        common, at_next, at_step = np.intersect1d(
            next_ids["dim4"], step_ids["dim4"], assume_unique=True, return_indices=True
        )
        ahead = client.push_pull_async(
            None, next_ids, [-1, -1], state_ids={"dim4": common}
        ).result()
        assert set(ahead.row_state["dim4"]) == set(optimizer.state_names())
        rows = ahead.rows["dim4"]
        replayed = rows[at_next]
        optimizer.apply(replayed, ahead.row_state["dim4"], own["dim4"][at_step])
        rows[at_next] = replayed

        client.push(step_ids, own, {})
        after, _ = client.pull(next_ids, dense=False)
        np.testing.assert_array_equal(rows, after["dim4"])
    finally:
        client.close()
        for server, _ in started:
            server.stop(0)


def test_row_state_is_only_read_for_ids_being_pulled(client: PSClient) -> None:
    import grpc

    with pytest.raises(grpc.RpcError, match="subset"):
        client.push_pull_async(
            None,
            {"dim4": np.array([1, 2], dtype=np.int64)},
            [-1] * client.num_ps,
            state_ids={"dim4": np.array([3], dtype=np.int64)},
        ).result()


MIRROR_IDS = {"dim4": np.array([1, 2], dtype=np.int64)}
ZERO_ROWS = {"dim4": np.zeros((2, 4), np.float32)}


@contextmanager
def mirrored_ps(refresh_every: int) -> Iterator[tuple[ParameterServer, PSClient, Any]]:
    """A PS serving ``DENSE`` (Adagrad 0.1), a client of it, and a ``DenseMirror`` of its
    dense weights refreshed every ``refresh_every``-th PushPull; the first PushPull done."""
    from types import SimpleNamespace

    from airflow_rover.worker.dense_mirror import DenseMirror

    optimizer = Optimizer("adagrad", 0.1)
    ps = ParameterServer(0, 1, EmbeddingPlacement.from_features(FEATURES), optimizer, 0)
    server, port = start_server(ps, TOKEN, threads=2)
    client = PSClient([f"127.0.0.1:{port}"], TOKEN)
    try:
        client.init_dense(DENSE)
        model = SimpleNamespace(ps=client, var_names=list(DENSE))
        mirror = DenseMirror(model, optimizer, refresh_every=refresh_every)
        expected, dense = mirror.request(False)
        assert dense
        mirror.after_reply(client.push_pull_async(None, MIRROR_IDS, expected).result().dense, None)
        yield ps, client, mirror
    finally:
        client.close()
        server.stop(0)


def test_a_mirror_that_applies_its_update_during_the_round_trip_stays_exact() -> None:
    """``DenseMirror.apply_early`` applies a step's dense gradients before the PushPull's
    reply comes; whether the reply then brings newer weights (another worker pushed) or not,
    the mirror ends bit-identical to the PS's weights with the worker's pending update (it
    asks for them on every PushPull here: ``refresh_every=1``)."""
    ids, zero_rows = MIRROR_IDS, ZERO_ROWS
    with mirrored_ps(refresh_every=1) as (ps, client, mirror):
        optimizer = mirror.optimizer
        pending = None
        early_steps, fresh_steps = 0, 0
        for step in range(8):
            expected, dense = mirror.request(pending is not None)
            call = client.push_pull_async(pending, ids, expected, push_key=step, dense=dense)
            own = grads(100 + step)[2]
            early = mirror.apply_early(own)
            reply = call.result()
            mirror.after_reply(reply.dense, own, early)
            early_steps += early
            fresh_steps += early and any(reply.dense.fresh)
            expected = {k: v.copy() for k, v in ps.dense.values.items()}
            for name, value in expected.items():
                state = {k: v.copy() for k, v in ps.dense.state[name].items()}
                optimizer.apply(value, state, own[name])
                np.testing.assert_array_equal(mirror.values[name], value)
            pending = (ids, zero_rows, own)
            if step in (3, 6):  # another worker pushes: the next reply brings its weights
                client.push(ids, zero_rows, grads(step)[2], key=1000 + step)
        assert early_steps >= 4 and fresh_steps >= 1  # both paths taken


@pytest.mark.parametrize("others", [False, True], ids=["alone", "others-push"])
def test_a_mirror_takes_others_weights_every_refresh_th_step(others: bool) -> None:
    """Another worker pushes between every two of this worker's PushPulls: the mirror asks
    for the PS's weights on every ``refresh_every``-th one only (the others send none), in
    between applies its own updates to its copy, and after each refresh equals the PS's
    weights with its pending update, bit for bit. Alone it equals them after every step."""
    ids, zero_rows = MIRROR_IDS, ZERO_ROWS
    with mirrored_ps(refresh_every=3) as (ps, client, mirror):
        optimizer = mirror.optimizer
        pending = None
        asked = []
        for step in range(9):
            if others:
                client.push(ids, zero_rows, grads(step)[2], key=1000 + step)
            want = {k: v.copy() for k, v in mirror.values.items()}
            state = {n: {k: v.copy() for k, v in s.items()} for n, s in mirror.state.items()}
            expected, dense = mirror.request(pending is not None)
            call = client.push_pull_async(pending, ids, expected, push_key=step, dense=dense)
            own = grads(100 + step)[2]
            early = mirror.apply_early(own)
            reply = call.result()
            if dense and others:  # the PS's weights and state, this step's update on top
                assert all(reply.dense.fresh) and not early
                want = {k: v.copy() for k, v in ps.dense.values.items()}
                state = {n: {k: v.copy() for k, v in s.items()} for n, s in ps.dense.state.items()}
            else:  # its own copy (alone: the PS's), its own update applied during the trip
                assert not any(reply.dense.fresh) and (early or dense)
                assert reply.dense.versions == expected
            mirror.after_reply(reply.dense, own, early)
            for name, value in want.items():
                optimizer.apply(value, state[name], own[name])
                np.testing.assert_array_equal(mirror.values[name], value)
                if not others:  # the PS's weights with the pending update, as ever
                    at_ps = ps.dense.values[name].copy()
                    at_state = {k: v.copy() for k, v in ps.dense.state[name].items()}
                    optimizer.apply(at_ps, at_state, own[name])
                    np.testing.assert_array_equal(mirror.values[name], at_ps)
            asked.append(dense)
            pending = (ids, zero_rows, own)
        # alone: the first reply brought the weights, so it skips until one that asks brings
        # none, then asks on every PushPull
        assert asked == ([False, False, True] * 3 if others else [False, False] + [True] * 7)


def test_a_ps_gone_answers_as_before_and_the_wait_is_counted_as_wait(client: PSClient) -> None:
    """A single PS's call is made blocking (``PSClient._start_all``); it answers as the gRPC
    future did: the reply from ``result()``, a PS gone as the call's ``grpc.RpcError``
    (UNAVAILABLE: the worker waits for its relaunch), and its round trip profiled as the wait,
    not the encode."""
    ids = {"dim4": np.array([1, 5, 9], dtype=np.int64)}
    client.push_pull_async(grads(1), ids, [-1] * client.num_ps).result()
    assert client.profile.ns["rpc/PushPull/wait"] > 0
    gone = PSClient(["127.0.0.1:1"] * client.num_ps, TOKEN, timeout_s=5.0)
    try:
        with pytest.raises(grpc.RpcError) as caught:
            gone.push_pull_async(grads(1), ids, [-1] * gone.num_ps).result()
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        gone.close()
