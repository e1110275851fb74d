"""ECRM between real PS processes' servers (gRPC on loopback): each push's differences reach
the parity holders, and a lost PS's replacement, started empty, is rebuilt from parity while
pushes go on: every row and optimizer state comes back (float tolerance), the batch ledger and
the dense variables too, and a job with a loss ends with the very rows a job without one has.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest
from test_ps import ADAGRAD, DENSE_INIT, DIMS, LAYOUT, SEED, TOKEN, VOCAB, Cluster

from airflow_rover.core.ecrm.degraded import EcrmReads
from airflow_rover.core.ecrm.messages import read_text
from airflow_rover.core.ecrm.propagation import ParityDelta, TableDelta
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.ps.ecrm import channels as ecrm_channels
from airflow_rover.ps.ecrm import holder as ecrm_holder
from airflow_rover.ps.ecrm import peer as ecrm_peer
from airflow_rover.ps.ecrm.channels import Peers
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc import ps_service
from airflow_rover.rpc.ps_client import PSClient

K = 2
NUM_PS = 3


def batch(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "dim4": np.sort(rng.choice(1300, size=60, replace=False)).astype(np.int64),
        "dim2": np.sort(rng.choice(500, size=30, replace=False)).astype(np.int64),
        "dim1": np.sort(rng.choice(50, size=5, replace=False)).astype(np.int64),
    }


def push_batch(clients: list[PSClient], rng: np.random.Generator, key: int) -> None:
    """Batch ``key``'s push, random gradients drawn from ``rng``, to each client's cluster."""
    ids = batch(rng)
    grads = {n: rng.normal(size=(i.size, DIMS[n])).astype(np.float32) for n, i in ids.items()}
    dgrads = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in DENSE_INIT.items()}
    for client in clients:
        client.push(ids, grads, dgrads, key=key)


def push_steps(clients: list[PSClient], first_key: int, count: int, seed: int) -> None:
    """``count`` keyed pushes of the same random gradients to each client's cluster."""
    rng = np.random.default_rng(seed)
    for key in range(first_key, first_key + count):
        push_batch(clients, rng, key)


def on_parity_frames(
    monkeypatch: pytest.MonkeyPatch,
    holder: int,
    act: Callable[[Peers, dict[str, np.ndarray]], None],
) -> None:
    """Every parity frame any PS sends ``holder`` goes through ``act(sender's peers, frame)``
    first, which may delay it or raise (the frame is then not delivered)."""
    call = Peers.call

    def intercepted(
        self: Peers, index: int, arrays: dict[str, np.ndarray], timeout: float = 60
    ) -> dict:
        if index == holder and read_text(arrays["op"]) == "parity":
            act(self, arrays)
        return call(self, index, arrays, timeout)

    monkeypatch.setattr(Peers, "call", intercepted)


def rows_of(servers: list[ParameterServer]) -> dict[tuple[str, int], np.ndarray]:
    """(group, id) -> row and optimizer state, concatenated."""
    out = {}
    for ps in servers:
        for name, table in ps.tables.items():
            snap = table.snapshot()
            for i, row_id in enumerate(snap["ids"]):
                out[name, int(row_id)] = np.concatenate([snap["rows"][i], snap["state/accum"][i]])
    return out


def assert_same_rows(
    got: dict[tuple[str, int], np.ndarray],
    want: dict[tuple[str, int], np.ndarray],
    probe: ParameterServer,
    atol: float = 1e-5,
) -> None:
    """Every row of ``want`` is in ``got`` (within ``atol``); rows only in ``got`` (decoded
    because a group member was updated) hold their seeded initial value."""
    assert set(want) <= set(got)
    worst = max(float(np.abs(got[key] - want[key]).max()) for key in want)
    assert worst < atol, worst
    for name, row_id in set(got) - set(want):
        init = probe.tables[name].initial_fields(np.array([row_id]))
        expected = np.concatenate([init["row"][0], init["state/accum"][0]])
        np.testing.assert_array_equal(got[name, row_id], expected)


def drained(cluster: Cluster) -> None:
    """Wait until every difference sent has been applied by its holder."""
    deadline = time.monotonic() + 10
    while any(ps.ecrm and ps.ecrm.status()["backlog"][0] for ps in cluster.ps):
        assert time.monotonic() < deadline, "parity channels did not drain"
        time.sleep(0.01)


class EcrmCluster(Cluster):
    def __init__(self, rows_per_lock: int = 64) -> None:
        super().__init__(NUM_PS)
        self.rows_per_lock = rows_per_lock
        self.epochs = [0] * NUM_PS

    def setup(self, encode: bool = False) -> None:
        client = self.client()
        client.ecrm_setup(K, self.rows_per_lock, self.addresses, self.epochs, encode)
        client.close()

    def lose(self, index: int) -> None:
        """Stop PS ``index`` (its parity work with it)."""
        lost = self.ps[index]
        self.servers[index].stop(None)
        assert lost.ecrm is not None
        lost.ecrm.close()

    def lose_and_replace(self, index: int) -> ParameterServer:
        """Stop PS ``index`` and start an empty replacement."""
        self.lose(index)
        return self.replace(index)

    def replace(self, index: int) -> ParameterServer:
        """Start an empty replacement of lost PS ``index``."""
        self.epochs[index] += 1
        fresh = ParameterServer(index, NUM_PS, LAYOUT, ADAGRAD, SEED)
        server, port = start_server(fresh, TOKEN, threads=4)
        self.ps[index], self.servers[index] = fresh, server
        self.addresses[index] = f"127.0.0.1:{port}"
        return fresh

    def rebuild(self, index: int) -> None:
        client = self.client()
        reply = client.ecrm_rebuild(index, K, self.rows_per_lock, self.addresses, self.epochs)
        assert int(reply["rebuilding"][0]) == 1 or int(reply["rows_total"][0]) == 0
        client.close()

    def wait_rebuilt(self, index: int) -> dict[str, np.ndarray]:
        client = self.client()
        deadline = time.monotonic() + 60
        while int((status := client.ecrm_status(index))["rebuilding"][0]):
            assert time.monotonic() < deadline, "rebuild did not finish"
            time.sleep(0.02)
        client.close()
        assert "error" not in status, status["error"].tobytes().decode()
        return status

    def stop(self) -> None:
        for ps in self.ps:
            if ps.ecrm is not None:
                ps.ecrm.close()
        super().stop()


@pytest.fixture
def clusters(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[EcrmCluster, Cluster]]:
    """An ECRM cluster and a plain one that get the same pushes."""
    monkeypatch.setattr(ecrm_peer, "DENSE_REPLICA_S", 0.05)
    coded, plain = EcrmCluster(rows_per_lock=64), Cluster(NUM_PS)
    for c in (coded, plain):
        client = c.client()
        client.init_dense(DENSE_INIT)
        client.close()
    coded.setup()
    yield coded, plain
    coded.stop()
    plain.stop()


def test_a_lost_ps_is_rebuilt_exactly_from_parity(clusters: tuple[EcrmCluster, Cluster]) -> None:
    coded, plain = clusters
    clients = [coded.client(), plain.client()]
    push_steps(clients, 0, 25, seed=1)
    drained(coded)
    time.sleep(0.2)  # a dense replica newer than the last push
    lost = coded.ps[1]
    truth = rows_of([lost])
    truth_dense = lost.dense.read()
    truth_ledger = set(lost.ledger.applied)
    coded.lose_and_replace(1)
    coded.rebuild(1)
    status = coded.wait_rebuilt(1)
    fresh = coded.ps[1]
    assert_same_rows(rows_of([fresh]), truth, fresh)
    assert int(status["rows_done"][0]) == int(status["rows_total"][0]) > 0
    assert set(fresh.ledger.applied) == truth_ledger == set(range(25))
    for name, value in truth_dense.items():
        np.testing.assert_array_equal(fresh.dense.read()[name], value)
    # the parity the lost PS held was re-encoded: losing another PS now rebuilds it too
    push_steps([coded.client(), plain.client()], 25, 5, seed=2)
    drained(coded)
    truth2 = rows_of([coded.ps[2]])
    coded.lose_and_replace(2)
    coded.rebuild(2)
    coded.wait_rebuilt(2)
    assert_same_rows(rows_of([coded.ps[2]]), truth2, coded.ps[2])


def test_pushes_go_on_during_the_rebuild_and_nothing_is_lost(
    clusters: tuple[EcrmCluster, Cluster],
) -> None:
    coded, plain = clusters
    coded.rows_per_lock = 8  # many chunks: the pushes below land while it runs
    push_steps([coded.client(), plain.client()], 0, 20, seed=3)
    drained(coded)
    coded.lose_and_replace(0)
    coded.rebuild(0)
    reads = coded.client()
    rng = np.random.default_rng(9)
    push_steps([coded.client(), plain.client()], 20, 15, seed=4)
    ids = batch(rng)
    degraded, _ = reads.pull(ids, dense=False, create=False)
    expected, _ = plain.client().pull(ids, dense=False, create=False)
    for name in ids:  # decoded reads: stale by a difference in flight at most
        np.testing.assert_allclose(degraded[name], expected[name], atol=0.5)
    final = coded.wait_rebuilt(0)
    assert int(final["chunks"][0]) > 50  # 8 rows per lock
    assert int(final["held_rows"][0]) > 0  # pushes to rows not rebuilt yet waited, not failed
    drained(coded)
    assert_same_rows(rows_of(coded.ps), rows_of(plain.ps), coded.ps[0], atol=1e-4)
    assert all(set(ps.ledger.applied) == set(range(35)) for ps in coded.ps)


class _Unreachable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


def test_batches_only_some_holders_got_are_taken_out_and_trained_again(
    clusters: tuple[EcrmCluster, Cluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PS dies while its last batches reached one holder and not the other (each holder has
    its own channel): the rebuilt ledger keeps only what both had, the one that had more takes
    those batches out of its parity, and once the master has them trained again the rebuilt
    rows are those of a job without the loss."""
    monkeypatch.setattr(ecrm_holder, "RECENT_S", 60.0)  # however slow this machine is
    coded, plain = clusters
    push_steps([coded.client(), plain.client()], 0, 10, seed=5)
    drained(coded)
    peer = coded.ps[1].ecrm
    assert peer is not None
    late, early = peer.placement.holders_of(1)
    call = peer.peers.call

    def cut_off(index: int, arrays: dict[str, np.ndarray], timeout: float = 60) -> dict:
        if index == late and read_text(arrays["op"]) == "parity":
            raise _Unreachable()
        return call(index, arrays, timeout)

    monkeypatch.setattr(peer.peers, "call", cut_off)
    push_steps([coded.client(), plain.client()], 10, 3, seed=6)
    deadline = time.monotonic() + 10
    while peer.channels[early].backlog():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert peer.channels[late].backlog() > 0  # batches 10-12: at one holder only
    coded.lose_and_replace(1)
    coded.rebuild(1)
    coded.wait_rebuilt(1)
    assert set(coded.ps[1].ledger.applied) == set(range(10))
    push_steps([coded.client()], 10, 3, seed=6)  # the master requeues them; the others skip
    drained(coded)
    assert_same_rows(rows_of([coded.ps[1]]), rows_of([plain.ps[1]]), coded.ps[1], atol=1e-4)
    assert all(set(ps.ledger.applied) == set(range(13)) for ps in coded.ps)


def test_a_ps_lost_again_before_its_holders_heard_its_ledger_again_keeps_its_batches(
    clusters: tuple[EcrmCluster, Cluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replacement sends its ledger to its holders again. Lost before one of them heard it
    (its channel there cut), its own replacement still finds every batch known to both holders:
    a holder does not forget what a partition applied when its incarnation is fenced. (It did:
    the rebuild then failed, the batches looking like ones to take out, with no message left
    to take out; seen in the ECRM chaos case, a PS killed 0.1 s after its rebuild.)"""
    coded, plain = clusters
    push_steps([coded.client(), plain.client()], 0, 10, seed=7)
    drained(coded)
    peer = coded.ps[1].ecrm
    assert peer is not None
    late = peer.placement.holders_of(1)[0]

    def cut_off(peers: Peers, arrays: dict[str, np.ndarray]) -> None:
        if "source" in arrays and arrays["source"].tolist() == [1, 1]:  # first replacement
            raise _Unreachable()

    on_parity_frames(monkeypatch, late, cut_off)
    coded.lose_and_replace(1)
    coded.rebuild(1)
    coded.wait_rebuilt(1)
    assert coded.ps[1].ecrm.channels[late].backlog() > 0  # type: ignore[union-attr]
    coded.lose_and_replace(1)
    coded.rebuild(1)
    coded.wait_rebuilt(1)
    assert set(coded.ps[1].ledger.applied) == set(range(10))
    drained(coded)
    assert_same_rows(rows_of([coded.ps[1]]), rows_of([plain.ps[1]]), coded.ps[1])


def test_a_replacement_started_after_its_holder_was_replaced_reaches_it(
    clusters: tuple[EcrmCluster, Cluster],
) -> None:
    """A PS's messages carry its holders' incarnations, and a holder drops those addressed to
    an older one. A replacement started after one of its holders had been replaced stamped
    them with incarnation 0 for every holder: that holder dropped all of them, its parity went
    stale, and the replacement's own loss later could not be rebuilt (the ECRM chaos case)."""
    coded, plain = clusters
    push_steps([coded.client(), plain.client()], 0, 10, seed=8)
    drained(coded)
    peer = coded.ps[0].ecrm
    assert peer is not None
    holder = peer.placement.holders_of(0)[0]
    coded.lose_and_replace(holder)  # a holder of PS 0, replaced first
    coded.rebuild(holder)
    coded.wait_rebuilt(holder)
    push_steps([coded.client(), plain.client()], 10, 5, seed=10)
    drained(coded)
    time.sleep(0.2)  # a dense replica at the new holder (sent when the variables change)
    coded.lose_and_replace(0)  # then PS 0: its replacement knows the holder's incarnation
    coded.rebuild(0)
    coded.wait_rebuilt(0)
    push_steps([coded.client(), plain.client()], 15, 10, seed=9)
    drained(coded)
    time.sleep(0.2)
    coded.lose_and_replace(0)  # rebuilt from that holder's parity among others
    coded.rebuild(0)
    coded.wait_rebuilt(0)
    drained(coded)
    assert_same_rows(rows_of([coded.ps[0]]), rows_of([plain.ps[0]]), coded.ps[0], atol=1e-4)
    assert set(coded.ps[0].ledger.applied) == set(range(25))


def push_key(clients: list[PSClient], key: int) -> None:
    """The push of batch ``key``: the same gradients whenever it is pushed again."""
    push_batch(clients, np.random.default_rng([77, key]), key)


def test_a_ps_lost_right_after_a_rebuild_had_its_released_updates_at_every_holder(
    clusters: tuple[EcrmCluster, Cluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member PS releases the pushes a rebuild's lock held without their batch keys. Were
    it lost with those messages at one of its holders only, both holders would still know the
    batches (from the pushes' first messages), nothing would be trained again, and the rows
    of the other holder's groups would be rebuilt without them. So a rebuild is done only once
    they are at every holder: PS 1, its messages to one holder slow, lost as soon as PS 0's
    rebuild is done, comes back with the rows of a job without the losses."""
    monkeypatch.setattr(ecrm_holder, "RECENT_S", 60.0)  # however slow this machine is
    coded, plain = clusters
    for key in range(20):
        push_key([coded.client(), plain.client()], key)
    drained(coded)
    peer = coded.ps[1].ecrm
    assert peer is not None
    slow = peer.placement.holders_of(1)[0]

    def slow_down(peers: Peers, arrays: dict[str, np.ndarray]) -> None:
        if peers is peer.peers:
            time.sleep(0.2)
            if peer._closed.is_set():  # a lost process sends nothing more
                raise _Unreachable()

    on_parity_frames(monkeypatch, slow, slow_down)
    coded.lose_and_replace(0)
    coded.rebuild(0)
    stop, pushed = threading.Event(), list(range(20))

    def pushing() -> None:  # until the rebuild is done: some pushes wait in PS 1's buffer
        clients = [coded.client(), plain.client()]
        while not stop.is_set():
            push_key(clients, len(pushed))
            pushed.append(len(pushed))

    thread = threading.Thread(target=pushing)
    thread.start()
    status = coded.wait_rebuilt(0)
    stop.set()
    thread.join()
    coded.lose(1)  # right away: what it sent the slow holder after the rebuild is lost
    assert int(status["held_rows"][0]) > 0
    coded.replace(1)
    coded.rebuild(1)
    coded.wait_rebuilt(1)
    retrain = sorted(set(pushed) - set(coded.ps[1].ledger.applied))  # the master requeues
    for key in retrain:
        push_key([coded.client()], key)  # the PS that applied them turn them away
    drained(coded)
    assert_same_rows(rows_of(coded.ps), rows_of(plain.ps), coded.ps[1], atol=1e-4)
    assert all(set(ps.ledger.applied) == set(pushed) for ps in coded.ps)


def test_parity_is_encoded_again_after_a_restore(clusters: tuple[EcrmCluster, Cluster]) -> None:
    coded, plain = clusters
    push_steps([coded.client(), plain.client()], 0, 15, seed=5)
    restored = EcrmCluster()
    try:
        for ps, source in zip(restored.ps, plain.ps, strict=True):
            ps.restore(source.snapshot())
        restored.setup(encode=True)
        truth = rows_of([restored.ps[2]])
        restored.lose_and_replace(2)
        restored.rebuild(2)
        restored.wait_rebuilt(2)
        assert_same_rows(rows_of([restored.ps[2]]), truth, restored.ps[2])
    finally:
        restored.stop()


@pytest.mark.parametrize("name", ["adagrad", "adam", "sgd"])
def test_state_off_by_an_update_in_flight_is_put_back_in_range(name: str) -> None:
    """A degraded read can be off by one update (no locks): Adagrad's accumulator or Adam's
    second moment could come out below what any update leaves, and a worker replaying its
    step on it would divide by the root of a negative number."""
    optimizer = Optimizer(name, 0.1)  # type: ignore[arg-type]
    state = optimizer.init_state((4, 3), rows=True)
    for value in state.values():
        value -= 0.3  # as if a member's difference were subtracted twice
    optimizer.clamp_state(state)
    rows = np.ones((4, 3), np.float32)
    optimizer.apply(rows, state, np.full((4, 3), 0.5, np.float32))
    assert np.isfinite(rows).all()
    if name == "adagrad":
        assert (state["accum"] >= 0.1).all()


def test_a_degraded_read_is_exact_while_differences_are_in_flight(
    clusters: tuple[EcrmCluster, Cluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The surviving members' last differences have not reached the holders (their frames
    fail and are retried): a degraded read adds them to the parity it reads (the members send
    what is not acknowledged), so the decoded rows are those of a job without the loss. The
    rebuild waits for the same differences to drain, and ends once they do."""
    coded, plain = clusters
    push_steps([coded.client(), plain.client()], 0, 20, seed=11)
    drained(coded)
    calls = {}
    for index in (1, 2):
        peer = coded.ps[index].ecrm
        assert peer is not None
        calls[index] = call = peer.peers.call

        def held_back(
            to: int, arrays: dict[str, np.ndarray], timeout: float = 60, call=call
        ) -> dict:
            if read_text(arrays["op"]) == "parity":
                raise _Unreachable()
            return call(to, arrays, timeout)

        monkeypatch.setattr(peer.peers, "call", held_back)
    push_steps([coded.client(), plain.client()], 20, 5, seed=12)
    deadline = time.monotonic() + 10
    while coded.ps[0].ecrm is not None and coded.ps[0].ecrm.status()["backlog"][0]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert all(coded.ps[i].ecrm.status()["backlog"][0] for i in (1, 2))  # type: ignore[union-attr]
    coded.lose_and_replace(0)
    coded.rebuild(0)
    ids = batch(np.random.default_rng(13))
    degraded, _ = coded.client().pull(ids, dense=False, create=False)
    expected, _ = plain.client().pull(ids, dense=False, create=False)
    for name in ids:
        np.testing.assert_allclose(degraded[name], expected[name], atol=1e-5)
    status = coded.ps[0].ecrm.status()  # type: ignore[union-attr]
    assert int(status["rebuilding"][0]) == 1 and int(status["degraded_rows"][0]) > 0
    for index, call in calls.items():
        monkeypatch.setattr(coded.ps[index].ecrm.peers, "call", call)  # type: ignore[union-attr]
    coded.wait_rebuilt(0)
    drained(coded)
    assert_same_rows(rows_of(coded.ps), rows_of(plain.ps), coded.ps[0])


def test_a_worker_trains_through_a_lost_ps_and_its_held_pushes_reach_the_replacement(
    clusters: tuple[EcrmCluster, Cluster],
) -> None:
    """Until a replacement is announced, a worker of an ECRM job decodes the lost PS's rows
    itself and holds its part of every push (``LostPS``): with one worker its reads are those
    of a job without the loss, the row state it replays its step on too. Delivered to the
    replacement while it rebuilds, the held pushes leave every row and ledger as that job's,
    including the push that was in flight when the PS died."""
    coded, plain = clusters
    push_steps([coded.client(), plain.client()], 0, 20, seed=21)
    drained(coded)
    worker = PSClient(coded.addresses, TOKEN, ecrm=EcrmReads(K, VOCAB, ADAGRAD))
    reference = plain.client()
    rng = np.random.default_rng(22)
    ids = batch(rng)
    known = worker.push_pull_async(None, ids, [-1] * NUM_PS).result().dense.versions
    coded.lose(1)
    starting = PSClient(coded.addresses, TOKEN, ecrm=EcrmReads(K, VOCAB, ADAGRAD))
    with pytest.raises(grpc.RpcError) as raised:  # no dense weights of PS 1 yet: it waits
        starting.push_pull_async(None, ids, [-1] * NUM_PS).result()
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    starting.close()
    for key in range(20, 27):
        grads = {n: rng.normal(size=(i.size, DIMS[n])).astype(np.float32) for n, i in ids.items()}
        dgrads = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in DENSE_INIT.items()}
        nxt = batch(rng)
        both = {n: np.intersect1d(nxt[n], ids[n]) for n in ids}
        push = (ids, grads, dgrads)
        got, want = (
            c.push_pull_async(push, nxt, versions, state_ids=both, push_key=key).result()
            for c, versions in ((worker, known), (reference, [-1] * NUM_PS))
        )
        for name in nxt:
            np.testing.assert_allclose(got.rows[name], want.rows[name], atol=1e-5)
            np.testing.assert_allclose(
                got.row_state[name]["accum"], want.row_state[name]["accum"], atol=1e-5
            )
        ids = nxt
    worker.push(ids, {n: np.ones((i.size, DIMS[n]), np.float32) for n, i in ids.items()}, {}, 27)
    reference.push(ids, {n: np.ones((i.size, DIMS[n]), np.float32) for n, i in ids.items()}, {}, 27)
    lost = worker.lost
    assert lost is not None and lost.index == 1
    assert [int(r["key"][0]) for r in lost.held] == list(range(20, 28))
    coded.replace(1)
    coded.rebuild(1)
    back = worker.reconnect(coded.addresses)
    assert back.lost is None
    back.deliver(lost, DENSE_INIT)  # offered first: the replacement restored its replica
    coded.wait_rebuilt(1)
    drained(coded)
    assert_same_rows(rows_of(coded.ps), rows_of(plain.ps), coded.ps[1], atol=1e-4)
    assert all(set(ps.ledger.applied) == set(range(28)) for ps in coded.ps)
    back.close()


def test_a_parity_frame_stays_within_a_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backlog of large messages goes in frames of at most ``PIECE_BYTES`` of rows (one
    message over it alone), so a holder's request limit takes every frame; small ones still go
    ``MAX_FRAME_ENTRIES`` at a time."""
    monkeypatch.setattr(ps_service, "PIECE_BYTES", 1000)

    def entry(rows: int) -> ecrm_channels._Entry:
        ids = np.arange(rows, dtype=np.int64)
        part = TableDelta("t", ids, {"row": np.zeros((rows, 4), np.float32)})  # 24 B a row
        return ecrm_channels._Entry(0, ParityDelta(0, 0, 1, 0, 0, (part,)), 0)

    assert [len(ecrm_channels._frame([entry(20)] * n)) for n in (1, 2, 3, 5)] == [1, 2, 2, 2]
    assert len(ecrm_channels._frame([entry(50)] * 3)) == 1  # over a piece alone: it still goes
    keys_only = [ecrm_channels._Entry(0, None, k) for k in range(300)]
    assert len(ecrm_channels._frame(keys_only)) == ecrm_channels.MAX_FRAME_ENTRIES
