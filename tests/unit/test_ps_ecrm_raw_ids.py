"""ECRM on a table of raw 64-bit ids, between real PS servers (gRPC on loopback): rows are
coded by position from their first push, a lost PS's ids come back from the parity with its
rows, the replacement places them without holes, and losing it again rebuilds it again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from test_ps import ADAGRAD, SEED, TOKEN

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.spec import FeatureConfig, TableConfig
from airflow_rover.core.training_optimizers import ADAGRAD_INITIAL_ACCUMULATOR
from airflow_rover.ps.ecrm import peer as ecrm_peer
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc.ps_client import PSClient

K = 2
NUM_PS = 3
FEATURES = FeatureConfig(
    num_dense=2,
    tables=(
        TableConfig(name="a", column="C1", vocab_size=300, dim=4),
        TableConfig(name="user", column="C2", vocab_size=1000, dim=4, index="ids"),
    ),
)
LAYOUT = EmbeddingPlacement.from_features(FEATURES)
RAW = "ids_user"
DENSE = {"w": np.zeros((2, 1), dtype=np.float32)}


class RawCluster:
    """``NUM_PS`` PS with ECRM on, and what the tests do to them."""

    def __init__(self, rows_per_lock: int, restore_from: list[ParameterServer] = ()) -> None:
        self.rows_per_lock = rows_per_lock
        self.epochs = [0] * NUM_PS
        self.ps: list[ParameterServer] = []
        self.servers: list[grpc.Server] = []
        self.addresses: list[str] = []
        for i in range(NUM_PS):
            self._start(i)
        for ps, source in zip(self.ps, restore_from, strict=False):
            ps.restore(source.snapshot())
        client = self.client()
        client.init_dense(DENSE)
        client.ecrm_setup(K, rows_per_lock, self.addresses, self.epochs, bool(restore_from))

    def _start(self, index: int) -> None:
        ps = ParameterServer(index, NUM_PS, LAYOUT, ADAGRAD, SEED)
        server, port = start_server(ps, TOKEN, threads=4)
        address = f"127.0.0.1:{port}"
        if index < len(self.ps):
            self.ps[index], self.servers[index], self.addresses[index] = ps, server, address
        else:
            self.ps.append(ps)
            self.servers.append(server)
            self.addresses.append(address)

    def client(self) -> PSClient:
        return PSClient(self.addresses, TOKEN, timeout_s=30)

    def drained(self) -> None:
        deadline = time.monotonic() + 10
        while any(ps.ecrm and ps.ecrm.status()["backlog"][0] for ps in self.ps):
            assert time.monotonic() < deadline, "parity channels did not drain"
            time.sleep(0.01)

    def lose_and_rebuild(self, index: int) -> dict[str, np.ndarray]:
        lost = self.ps[index]
        self.servers[index].stop(None)
        assert lost.ecrm is not None
        lost.ecrm.close()
        self.epochs[index] += 1
        self._start(index)
        client = self.client()
        client.ecrm_rebuild(index, K, self.rows_per_lock, self.addresses, self.epochs)
        deadline = time.monotonic() + 60
        while int((status := client.ecrm_status(index))["rebuilding"][0]):
            assert time.monotonic() < deadline, "rebuild did not finish"
            time.sleep(0.02)
        assert "error" not in status, status["error"].tobytes().decode()
        return status

    def stop(self) -> None:
        for ps, server in zip(self.ps, self.servers, strict=True):
            if ps.ecrm is not None:
                ps.ecrm.close()
            server.stop(None)


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[RawCluster]:
    monkeypatch.setattr(ecrm_peer, "DENSE_REPLICA_S", 0.05)
    made = RawCluster(rows_per_lock=16)
    yield made
    made.stop()


def raw_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.unique(rng.integers(-(2**63), 2**63 - 1, size=n, dtype=np.int64))


def push(client: PSClient, rng: np.random.Generator, users: np.ndarray, key: int) -> None:
    ids = {RAW: users, "dim4": np.unique(rng.integers(0, 300, size=20))}
    grads = {n: rng.normal(size=(i.size, 4)).astype(np.float32) for n, i in ids.items()}
    client.push(ids, grads, {}, key=key)


def rows_by_id(ps: ParameterServer) -> dict[int, np.ndarray]:
    snap = ps.tables[RAW].snapshot()
    assert np.unique(snap["ids"]).size == snap["ids"].size, "an id holds two rows"
    return {
        int(i): np.concatenate([snap["rows"][k], snap["state/accum"][k]])
        for k, i in enumerate(snap["ids"])
    }


def test_a_lost_ps_gets_back_its_raw_ids_and_rows_and_again_after_another_loss(
    cluster: RawCluster,
) -> None:
    rng = np.random.default_rng(3)
    pool, never_pushed = raw_ids(rng, 400), raw_ids(rng, 60)
    client = cluster.client()
    for key in range(30):
        # ids only pulled leave positions no push coded: the replacement leaves no holes
        client.pull({RAW: np.unique(rng.choice(never_pushed, 3))}, dense=False)
        push(client, rng, np.unique(rng.choice(pool, 25)), key)
    cluster.drained()
    for round_ in range(2):  # the second loss rebuilds from the parity the first one moved
        lost = cluster.ps[1]
        truth = rows_by_id(lost)
        pushed = {
            i
            for i, row in truth.items()
            if (row[4:] != np.float32(ADAGRAD_INITIAL_ACCUMULATOR)).any()
        }
        status = cluster.lose_and_rebuild(1)
        fresh = cluster.ps[1]
        got = rows_by_id(fresh)
        assert int(status["rows_done"][0]) == int(status["rows_total"][0]) > 0
        assert set(got) == pushed and len(truth) > len(pushed) > 0  # pulled only: not rebuilt
        for i in got:
            np.testing.assert_allclose(got[i], truth[i], atol=1e-5)
        before, after = (list(rows_by_id(ps)) for ps in (lost, fresh))
        moved = [i for i in after if after.index(i) != before.index(i)]
        assert moved or round_  # rows past a hole moved down (and their code with them)
        assert set(fresh.ledger.applied) == set(range(30 + 10 * round_))
        client = cluster.client()
        for key in range(30 + 10 * round_, 40 + 10 * round_):
            client.pull({RAW: np.unique(rng.choice(never_pushed, 3))}, dense=False)
            push(client, rng, np.unique(rng.choice(pool, 25)), key)
        cluster.drained()


def test_pushes_to_a_replacement_wait_until_its_raw_ids_are_rebuilt(cluster: RawCluster) -> None:
    """A replacement takes requests for a raw-id table only once that table is rebuilt; its
    other tables are served (decoding rows not rebuilt yet) meanwhile."""
    rng = np.random.default_rng(5)
    pool = raw_ids(rng, 300)
    client = cluster.client()
    for key in range(20):
        push(client, rng, np.unique(rng.choice(pool, 30)), key)
    cluster.drained()
    truth = rows_by_id(cluster.ps[0])
    replacement_ready = threading.Event()
    original = ecrm_peer.EcrmPeer.wait_ready

    def observed(self: ecrm_peer.EcrmPeer, tables: object) -> None:
        original(self, tables)  # type: ignore[arg-type]
        if self.rebuild is not None:
            replacement_ready.set()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ecrm_peer.EcrmPeer, "wait_ready", observed)
        done = threading.Event()

        def train_on() -> None:
            for key in range(20, 30):
                push(cluster.client(), rng, np.unique(rng.choice(pool, 30)), key)
            done.set()

        cluster.servers[0].stop(None)  # lost: the pushes below wait for its replacement
        assert cluster.ps[0].ecrm is not None
        cluster.ps[0].ecrm.close()
        cluster.epochs[0] += 1
        cluster._start(0)
        pusher = threading.Thread(target=train_on)
        client = cluster.client()
        client.ecrm_rebuild(0, K, cluster.rows_per_lock, cluster.addresses, cluster.epochs)
        pusher.start()
        pusher.join(60)
        assert done.is_set() and replacement_ready.is_set()
    got = rows_by_id(cluster.ps[0])
    assert set(truth) <= set(got)
    assert set(cluster.ps[0].ledger.applied) == set(range(30))


def test_parity_of_raw_ids_is_encoded_again_after_a_restore(cluster: RawCluster) -> None:
    """Rows restored from a checkpoint are coded at their new positions once the holders
    re-encode their parity: a PS lost right after is rebuilt whole."""
    rng = np.random.default_rng(8)
    pool = raw_ids(rng, 300)
    client = cluster.client()
    for key in range(15):
        push(client, rng, np.unique(rng.choice(pool, 30)), key)
    restored = RawCluster(rows_per_lock=16, restore_from=cluster.ps)
    try:
        truth = rows_by_id(restored.ps[2])
        assert truth
        restored.lose_and_rebuild(2)
        got = rows_by_id(restored.ps[2])
        assert set(got) == set(truth)
        for i, row in got.items():
            np.testing.assert_allclose(row, truth[i], atol=1e-5)
    finally:
        restored.stop()
