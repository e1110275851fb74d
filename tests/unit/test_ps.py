"""Parameter server: optimizers on lazily created fused groups, real gRPC servers, PSClient."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.hashing import INIT_SCALE, initial_rows, owner_of, partition_of
from airflow_rover.core.spec import FeatureConfig, TableConfig
from airflow_rover.core.training_optimizers import ADAGRAD_INITIAL_ACCUMULATOR, EPSILON, Optimizer
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.ps.tables import DenseStore, EmbeddingTable
from airflow_rover.rpc import frames, ps_service
from airflow_rover.rpc.ps_client import PSClient

TOKEN = "s3cret-job-token"
LR = 0.1
SEED = 7
ADAGRAD = Optimizer("adagrad", LR)
FEATURES = FeatureConfig(
    num_dense=2,
    tables=(
        TableConfig(name="a", column="C1", vocab_size=1000, dim=4),
        TableConfig(name="b", column="C2", vocab_size=500, dim=2, pooling="mean"),
        TableConfig(name="c_wide", column="C1", vocab_size=50, dim=1),
        # A second dim-4 table: group dim4 fuses a (fused ids 0..999) and a2 (1000..1299).
        TableConfig(name="a2", column="C2", vocab_size=300, dim=4),
    ),
)
LAYOUT = EmbeddingPlacement.from_features(FEATURES)
DIMS = {g.name: g.dim for g in LAYOUT.groups}  # {"dim4": 4, "dim2": 2, "dim1": 1}
VOCAB = {g.name: g.vocab_size for g in LAYOUT.groups}


def test_layout_used_here_fuses_two_tables() -> None:
    """The fixture layout: three groups, dim4 holding a then a2 (stacked offsets)."""
    assert DIMS == {"dim4": 4, "dim2": 2, "dim1": 1}
    assert VOCAB == {"dim4": 1300, "dim2": 500, "dim1": 50}
    assert [(t.name, t.offset) for t in LAYOUT.group("dim4").tables] == [("a", 0), ("a2", 1000)]


# -- Adagrad -----------------------------------------------------------------------------------
def _reference_adagrad(
    param: np.ndarray, grads: list[np.ndarray], lr: float
) -> tuple[np.ndarray, np.ndarray]:
    """Adagrad as Keras writes it (lr * g / sqrt(accum + eps)), independently, in float64."""
    p = np.array(param, dtype=np.float64)
    acc = np.full_like(p, 0.1)
    for g in grads:
        acc = acc + np.square(g.astype(np.float64))
        p = p - lr * g / np.sqrt(acc + 1e-7)
    return p, acc


def _grads(shape: tuple[int, ...], steps: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 1.0, size=shape).astype(np.float32) for _ in range(steps)]


def test_adagrad_constants_match_keras_defaults() -> None:
    """The PS uses Keras' default initial accumulator and epsilon."""
    assert np.isclose(ADAGRAD_INITIAL_ACCUMULATOR, 0.1)
    assert np.isclose(EPSILON, 1e-7, rtol=1e-9, atol=0)


def test_adagrad_matches_numpy_reference_over_steps() -> None:
    """Several in-place Adagrad steps equal the float64 reference within float32 precision."""
    param = np.random.default_rng(1).uniform(-0.05, 0.05, size=(6, 3)).astype(np.float32)
    state = ADAGRAD.init_state(param.shape, rows=True)
    np.testing.assert_array_equal(state["accum"], np.float32(ADAGRAD_INITIAL_ACCUMULATOR))
    grads = _grads(param.shape, steps=6)
    p = param.copy()
    for g in grads:
        ADAGRAD.apply(p, state, g)
        assert p.dtype == np.float32 and state["accum"].dtype == np.float32
    ref_p, ref_a = _reference_adagrad(param, grads, LR)
    np.testing.assert_allclose(p, ref_p, rtol=0, atol=1e-6)
    np.testing.assert_allclose(state["accum"], ref_a, rtol=1e-6)


def test_adagrad_updates_in_place() -> None:
    """apply mutates the given parameter and state arrays (the table writes them back)."""
    param = np.ones((2, 2), np.float32)
    state = ADAGRAD.init_state(param.shape, rows=True)
    accum = state["accum"]
    ADAGRAD.apply(param, state, np.ones((2, 2), np.float32))
    assert state["accum"] is accum
    np.testing.assert_allclose(accum, 1.1, rtol=1e-6)
    np.testing.assert_allclose(param, 1 - LR / np.sqrt(1.1 + 1e-7), rtol=1e-6)


def test_adagrad_zero_gradient_is_a_no_op() -> None:
    """A zero gradient changes neither the parameter nor the accumulator."""
    param = np.ones((2, 2), np.float32)
    state = ADAGRAD.init_state(param.shape, rows=True)
    ADAGRAD.apply(param, state, np.zeros((2, 2), np.float32))
    np.testing.assert_array_equal(param, np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(state["accum"], np.float32(0.1))


def test_adagrad_matches_keras(monkeypatch: pytest.MonkeyPatch) -> None:
    """Table updates equal keras.optimizers.Adagrad(initial_accumulator_value=0.1, eps=1e-7)."""
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    keras = pytest.importorskip("keras")
    ids = np.array([3, 11, 42, 7], dtype=np.int64)
    dim = 5
    init = initial_rows("emb", ids, dim, SEED, INIT_SCALE)
    grads = _grads((ids.size, dim), steps=5, seed=3)

    table = EmbeddingTable("emb", dim, vocab_size=100, seed=SEED, optimizer=ADAGRAD)
    for g in grads:
        table.apply_gradients(ids, g)
    ours = table.lookup(ids, create=False)

    var = keras.Variable(init.copy(), dtype="float32")
    opt = keras.optimizers.Adagrad(learning_rate=LR, initial_accumulator_value=0.1, epsilon=1e-7)
    for g in grads:
        opt.apply_gradients([(keras.ops.convert_to_tensor(g), var)])
    np.testing.assert_allclose(ours, np.asarray(var.numpy()), rtol=0, atol=1e-6)


# -- EmbeddingTable and DenseStore (in-process) -----------------------------------------------
def test_table_rows_are_created_lazily_with_the_seeded_init() -> None:
    """Nothing exists before first touch; a created row equals core.hashing's initial row."""
    table = EmbeddingTable("a", 4, vocab_size=1000, seed=SEED, optimizer=ADAGRAD)
    assert table.size == 0
    ids = np.array([5, 900, 17], dtype=np.int64)
    rows = table.lookup(ids)
    assert table.size == 3
    np.testing.assert_array_equal(rows, initial_rows("a", ids, 4, SEED, INIT_SCALE))
    table.lookup(np.array([17, 5]))
    assert table.size == 3  # existing rows are reused, not re-created
    snap = table.snapshot()
    assert set(snap) == {"ids", "rows", "counts", "seen", "state/accum"}
    assert snap["ids"].tolist() == [5, 900, 17]
    np.testing.assert_array_equal(snap["state/accum"], np.float32(ADAGRAD_INITIAL_ACCUMULATOR))


def test_lookup_without_create_reads_but_does_not_insert() -> None:
    """create=False returns stored rows for seen ids and the seeded init for unseen ones."""
    table = EmbeddingTable("a", 4, vocab_size=1000, seed=SEED, optimizer=ADAGRAD)
    seen = np.array([1, 2], dtype=np.int64)
    table.apply_gradients(seen, np.ones((2, 4), np.float32))
    stored = table.lookup(seen, create=False)
    assert not np.array_equal(stored, initial_rows("a", seen, 4, SEED, INIT_SCALE))

    mixed = np.array([2, 500, 1, 999], dtype=np.int64)
    out = table.lookup(mixed, create=False)
    assert table.size == 2
    np.testing.assert_array_equal(out[[0, 2]], stored[[1, 0]])
    np.testing.assert_array_equal(
        out[[1, 3]], initial_rows("a", np.array([500, 999]), 4, SEED, INIT_SCALE)
    )
    # The returned rows are copies: writing to them does not change the table.
    out[:] = 123.0
    np.testing.assert_array_equal(table.lookup(seen, create=False), stored)


def test_access_counters() -> None:
    """Each creating lookup bumps its rows' counters; reads without create do not."""
    table = EmbeddingTable("a", 2, vocab_size=100, seed=SEED, optimizer=ADAGRAD)
    table.lookup(np.array([1, 2, 3]))
    table.lookup(np.array([2, 3]))
    table.lookup(np.array([3]))
    table.lookup(np.array([1, 2, 3, 4]), create=False)
    snap = table.snapshot()
    counts = dict(zip(snap["ids"].tolist(), snap["counts"].tolist(), strict=True))
    assert counts == {1: 1, 2: 2, 3: 3}
    assert snap["counts"].dtype == np.uint32


def test_table_grows_past_its_initial_capacity_without_losing_rows() -> None:
    """Creating thousands of rows in batches keeps every earlier row and its slot."""
    table = EmbeddingTable("a", 3, vocab_size=10_000, seed=SEED, optimizer=ADAGRAD)
    ids = np.random.default_rng(0).permutation(10_000)[:5000]
    for chunk in np.array_split(ids, 7):
        table.lookup(chunk)
    assert table.size == 5000
    np.testing.assert_array_equal(
        table.lookup(ids, create=False), initial_rows("a", ids, 3, SEED, INIT_SCALE)
    )
    assert sorted(table.snapshot()["ids"].tolist()) == sorted(ids.tolist())


@pytest.mark.parametrize(
    ("ids", "grads", "match"),
    [
        (np.array([-1, 2]), np.zeros((2, 4), np.float32), r"ids must lie in \[0, 1000\)"),
        (np.array([1, 1000]), np.zeros((2, 4), np.float32), r"ids must lie in \[0, 1000\)"),
        (np.array([1, 2]), np.zeros((2, 3), np.float32), "gradient shape"),
        (np.array([1, 2]), np.zeros((3, 4), np.float32), "gradient shape"),
        (np.array([1, 2]), np.zeros(8, np.float32), "gradient shape"),
        (np.array([1, 2]), np.array([[0, 0, 0, np.nan]] * 2, np.float32), "non-finite"),
        (np.array([1, 2]), np.array([[np.inf, 0, 0, 0]] * 2, np.float32), "non-finite"),
    ],
)
def test_bad_updates_are_rejected_and_change_nothing(
    ids: np.ndarray, grads: np.ndarray, match: str
) -> None:
    """Out-of-range ids, wrong gradient shapes and NaN/inf are refused before any write."""
    table = EmbeddingTable("a", 4, vocab_size=1000, seed=SEED, optimizer=ADAGRAD)
    table.lookup(np.array([1, 2]))
    before = table.snapshot()
    with pytest.raises(ValueError, match=match):
        table.apply_gradients(ids, grads)
    after = table.snapshot()
    for key in before:
        np.testing.assert_array_equal(after[key], before[key])


def test_lookup_rejects_out_of_range_ids() -> None:
    """Both lookup modes refuse ids outside [0, vocab_size) and create nothing."""
    table = EmbeddingTable("a", 4, vocab_size=10, seed=SEED, optimizer=ADAGRAD)
    for create in (True, False):
        with pytest.raises(ValueError, match="ids must lie"):
            table.lookup(np.array([3, 10]), create=create)
        with pytest.raises(ValueError, match="ids must lie"):
            table.lookup(np.array([-2]), create=create)
    assert table.size == 0


def test_dense_store_first_initialisation_wins_and_updates_validate() -> None:
    """initialize keeps the first value; bad dense gradients are refused whole."""
    store = DenseStore(ADAGRAD)
    store.initialize({"w": np.ones((2, 2)), "b": np.zeros(2)})
    store.initialize({"w": np.full((2, 2), 9.0), "v": np.ones(1)})
    values = store.read()
    np.testing.assert_array_equal(values["w"], np.ones((2, 2)))
    assert values["w"].dtype == np.float32 and set(values) == {"w", "b", "v"}
    for grads, match in (
        ({"w": np.ones((2, 2)), "nope": np.ones(1)}, "not initialised"),
        ({"w": np.ones((2, 2)), "b": np.ones(3)}, "gradient shape"),
        ({"w": np.ones((2, 2)), "b": np.array([0.0, np.nan])}, "non-finite"),
    ):
        with pytest.raises(ValueError, match=match):
            store.apply_gradients(grads)
        np.testing.assert_array_equal(store.read()["w"], np.ones((2, 2)))
        np.testing.assert_array_equal(store.state["w"]["accum"], np.float32(0.1))
    g = np.array([[1.0, -1.0], [0.5, 0.0]], np.float32)
    store.apply_gradients({"w": g})
    ref, _ = _reference_adagrad(np.ones((2, 2)), [g], LR)
    np.testing.assert_allclose(store.read()["w"], ref, atol=1e-6)


def test_server_holds_one_table_per_group() -> None:
    """ParameterServer keys its tables by group name, sized to the fused id space."""
    ps = ParameterServer(0, 1, LAYOUT, ADAGRAD, SEED)
    assert {name: t.dim for name, t in ps.tables.items()} == DIMS
    assert all(t.name == name and t.optimizer == ADAGRAD for name, t in ps.tables.items())
    ps.pull({"ids/dim4": np.array([0, 1299])})  # the last row of a2 exists
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 1300\)"):
        ps.pull({"ids/dim4": np.array([1300])})
    with pytest.raises(ValueError, match="unknown table 'a'"):  # table names are not groups
        ps.pull({"ids/a": np.array([1])})


# -- real gRPC servers -------------------------------------------------------------------------
class Cluster:
    """``n`` ParameterServers serving on 127.0.0.1 with the job token."""

    def __init__(self, n: int, optimizer: Optimizer = ADAGRAD) -> None:
        self.ps = [ParameterServer(i, n, LAYOUT, optimizer, SEED) for i in range(n)]
        self.servers: list[grpc.Server] = []
        self.addresses: list[str] = []
        for ps in self.ps:
            server, port = start_server(ps, TOKEN, threads=4)
            assert port > 0
            self.servers.append(server)
            self.addresses.append(f"127.0.0.1:{port}")

    def client(self, token: str = TOKEN) -> PSClient:
        return PSClient(self.addresses, token, timeout_s=10)

    def snapshots(self) -> list[dict]:
        return [
            {
                "tables": {name: t.snapshot() for name, t in ps.tables.items()},
                "dense": ps.dense.read(),
                "pushes": ps.pushes,
            }
            for ps in self.ps
        ]

    def stop(self) -> None:
        for server in self.servers:
            server.stop(None)


@pytest.fixture
def one_ps() -> Iterator[Cluster]:
    cluster = Cluster(1)
    yield cluster
    cluster.stop()


@pytest.fixture
def three_ps() -> Iterator[Cluster]:
    cluster = Cluster(3)
    yield cluster
    cluster.stop()


def _raw_call(address: str, method: str, request: dict, token: str | None = TOKEN) -> dict:
    with grpc.insecure_channel(address, options=ps_service.CHANNEL_OPTIONS) as channel:
        stub = channel.unary_unary(ps_service.method_path(method))
        metadata = ps_service.auth_metadata(token) if token is not None else None
        return frames.decode(stub(frames.encode(request), metadata=metadata, timeout=10))


def _raw_bytes_call(address: str, method: str, payload: bytes) -> bytes:
    with grpc.insecure_channel(address) as channel:
        stub = channel.unary_unary(ps_service.method_path(method))
        return stub(payload, metadata=ps_service.auth_metadata(TOKEN), timeout=10)


def _assert_snapshots_equal(before: list[dict], after: list[dict]) -> None:
    for b, a in zip(before, after, strict=True):
        assert a["pushes"] == b["pushes"]
        assert set(a["dense"]) == set(b["dense"])
        for name in b["dense"]:
            np.testing.assert_array_equal(a["dense"][name], b["dense"][name])
        for name, snap in b["tables"].items():
            assert set(a["tables"][name]) == set(snap)
            for key, value in snap.items():
                np.testing.assert_array_equal(a["tables"][name][key], value, err_msg=name + key)


DENSE_INIT: dict[str, np.ndarray] = {
    "tower/kernel": np.arange(12, dtype=np.float32).reshape(4, 3) / 10,
    "tower/bias": np.zeros(3, np.float32),
    "out/kernel": np.ones((3, 1), np.float32),
    "out/bias": np.array(0.5, np.float32),  # a 0-d variable
}


def _workload(client: PSClient) -> list[np.ndarray]:
    """A fixed sequence of pulls and pushes; returns everything the client saw."""
    rng = np.random.default_rng(2024)
    seen: list[np.ndarray] = []
    client.init_dense(DENSE_INIT)
    client.init_dense({k: v + 100 for k, v in DENSE_INIT.items()})  # ignored: first offer wins
    for step in range(4):
        ids = {
            # Fused ids of both dim-4 tables (a: 0..999, a2: 1000..1299).
            "dim4": rng.choice(1300, size=40, replace=False).astype(np.int64),
            "dim2": rng.choice(500, size=25, replace=False).astype(np.int64),
            # Few ids: with 3 PS some servers own none of this group's ids in a request.
            "dim1": rng.choice(50, size=1 + step, replace=False).astype(np.int64),
        }
        rows, dense = client.pull(ids)
        for name, value in rows.items():
            assert value.shape == (ids[name].size, DIMS[name])
            seen.append(value.copy())
        assert set(dense) == set(DENSE_INIT)
        assert dense["out/bias"].shape == ()
        seen.extend(dense[k].copy() for k in sorted(dense))
        grads = {n: rng.normal(size=(i.size, DIMS[n])).astype(np.float32) for n, i in ids.items()}
        dgrads = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in DENSE_INIT.items()}
        client.push(ids, grads, dgrads)
    probe = {
        "dim4": np.arange(0, 1300, 7, dtype=np.int64),
        "dim2": np.array([0, 499], dtype=np.int64),
    }
    rows, dense = client.pull(probe, dense=False, create=False)
    assert dense == {}
    seen.extend(rows[k].copy() for k in sorted(rows))
    return seen


@pytest.mark.parametrize("optimizer", ["adagrad", "adam", "sgd"])
def test_single_and_three_ps_give_identical_results(optimizer: str) -> None:
    """Partitioning is invisible: 3 PS return exactly what 1 PS returns for the same calls."""
    opt = Optimizer(optimizer, LR)  # type: ignore[arg-type]
    one_ps, three_ps = Cluster(1, opt), Cluster(3, opt)
    with_one, with_three = one_ps.client(), three_ps.client()
    try:
        ref, got = _workload(with_one), _workload(with_three)
        assert len(ref) == len(got)
        for r, g in zip(ref, got, strict=True):
            np.testing.assert_array_equal(g, r)
        # Same rows exist in total, each on the PS partition_of names, dense on its owner.
        single = one_ps.ps[0]
        for name, table in single.tables.items():
            assert sum(ps.tables[name].size for ps in three_ps.ps) == table.size
            for i, ps in enumerate(three_ps.ps):
                ids = ps.tables[name].snapshot()["ids"]
                assert (partition_of(name, ids, 3) == i).all()
        for name in DENSE_INIT:
            owner = owner_of(name, 3)
            assert [name in ps.dense.values for ps in three_ps.ps] == [i == owner for i in range(3)]
        assert all(ps.pushes == 4 for ps in three_ps.ps)
    finally:
        with_one.close()
        with_three.close()
        one_ps.stop()
        three_ps.stop()


def test_rows_follow_the_numpy_reference_through_the_server(one_ps: Cluster) -> None:
    """Pull then push over gRPC: stored rows are seeded init plus Adagrad steps."""
    client = one_ps.client()
    ids = {"dim4": np.array([10, 3, 1299], dtype=np.int64)}  # 1299: a2's last row
    grads = _grads((3, 4), steps=3, seed=11)
    try:
        rows, dense = client.pull(ids, dense=False)
        assert dense == {}
        init = initial_rows("dim4", ids["dim4"], 4, SEED, INIT_SCALE)
        np.testing.assert_array_equal(rows["dim4"], init)
        for g in grads:
            client.push(ids, {"dim4": g}, {})
        rows, _ = client.pull(ids, dense=False, create=False)
    finally:
        client.close()
    ref, _ = _reference_adagrad(init, grads, LR)
    np.testing.assert_allclose(rows["dim4"], ref, rtol=0, atol=1e-6)


def test_fused_ids_of_two_tables_are_distinct_rows(three_ps: Cluster) -> None:
    """a and a2 share group dim4: the same raw id in both tables is two rows, updated apart."""
    group = LAYOUT.group("dim4")
    column_index = {"C1": 0, "C2": 1}
    raw = np.array([[5, 5], [7, 7], [299, 299], [5, 7]], dtype=np.int64)  # same ids in a and a2
    fused = group.fused_ids(raw, column_index)
    unique = np.unique(fused)
    assert unique.tolist() == [5, 7, 299, 1005, 1007, 1299]
    client = three_ps.client()
    try:
        rows, _ = client.pull({"dim4": unique}, dense=False)
        assert len({tuple(r) for r in rows["dim4"].tolist()}) == unique.size
        np.testing.assert_array_equal(
            rows["dim4"], initial_rows("dim4", unique, 4, SEED, INIT_SCALE)
        )
        # Push to table a's rows only: a2's rows with the same raw ids stay as they were.
        a_ids = unique[group.split(unique)[0] == 0]
        client.push({"dim4": a_ids}, {"dim4": np.ones((a_ids.size, 4), np.float32)}, {})
        after, _ = client.pull({"dim4": unique}, dense=False, create=False)
    finally:
        client.close()
    assert sum(ps.tables["dim4"].size for ps in three_ps.ps) == unique.size
    ref, _ = _reference_adagrad(rows["dim4"][:3], [np.ones((3, 4), np.float32)], LR)
    np.testing.assert_allclose(after["dim4"][:3], ref, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(after["dim4"][3:], rows["dim4"][3:])


def test_bad_gradient_in_one_group_rejects_the_whole_push(one_ps: Cluster) -> None:
    """A NaN in group dim2's gradient: INVALID_ARGUMENT, and neither dim4 nor dense changed."""
    client = one_ps.client()
    try:
        client.init_dense({"w": np.ones(3, np.float32)})
        ids = {"dim4": np.array([1, 1002], dtype=np.int64), "dim2": np.array([3], dtype=np.int64)}
        client.pull(ids)
        before = one_ps.snapshots()
        grads = {
            "dim4": np.ones((2, 4), np.float32),
            "dim2": np.array([[0.0, np.nan]], np.float32),
        }
        with pytest.raises(grpc.RpcError) as err:
            client.push(ids, grads, {"w": np.ones(3, np.float32)})
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "non-finite" in err.value.details()
        _assert_snapshots_equal(before, one_ps.snapshots())
    finally:
        client.close()


@pytest.mark.parametrize(
    ("request_", "detail"),
    [
        ({"ids/dim4": np.array([1]), "grad/dim4": np.ones((1, 3), np.float32)}, "gradient shape"),
        (
            {"ids/dim4": np.array([1300]), "grad/dim4": np.ones((1, 4), np.float32)},
            r"ids must lie in [0, 1300)",
        ),
        ({"ids/zz": np.array([1]), "grad/zz": np.ones((1, 4), np.float32)}, "unknown table"),
        ({"ids/a": np.array([1]), "grad/a": np.ones((1, 4), np.float32)}, "unknown table"),
        ({"ids/dim4": np.array([1])}, "grad/dim4"),
        ({"dgrad/never": np.ones(2, np.float32)}, "not initialised"),
        (
            {
                "ids/dim4": np.array([1, 1002]),
                "grad/dim4": np.ones((2, 4), np.float32),
                "ids/dim2": np.array([4]),
                "grad/dim2": np.ones((1, 2), np.float32),
                "dgrad/w": np.ones(4, np.float32),  # wrong shape: (3,)
            },
            "gradient shape",
        ),
    ],
)
def test_malformed_pushes_are_invalid_argument_and_change_nothing(
    one_ps: Cluster, request_: dict, detail: str
) -> None:
    """Wrong shapes, bad ids, unknown groups/variables, missing keys: rejected, nothing applied."""
    address = one_ps.addresses[0]
    _raw_call(address, "InitDense", {"dense/w": np.ones(3, np.float32)})
    _raw_call(address, "Pull", {"ids/dim4": np.array([1, 1002]), "ids/dim2": np.array([4])})
    before = one_ps.snapshots()
    with pytest.raises(grpc.RpcError) as err:
        _raw_call(address, "Push", request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in err.value.details()
    _assert_snapshots_equal(before, one_ps.snapshots())


def test_garbage_frame_is_invalid_argument(one_ps: Cluster) -> None:
    """A request that is not a tensor frame is refused, not crashed on."""
    for payload in (b"", b"hello", b"RVT1\x01\x00\x00\x00"):
        with pytest.raises(grpc.RpcError) as err:
            _raw_bytes_call(one_ps.addresses[0], "Push", payload)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert one_ps.ps[0].pushes == 0


@pytest.mark.parametrize(
    "bad_ids", [np.array([1.0, 2.0]), np.array([[1], [2]], dtype=np.int64)], ids=["float", "2d"]
)
def test_ids_that_are_not_a_1d_integer_array_reject_the_whole_push(
    one_ps: Cluster, bad_ids: np.ndarray
) -> None:
    """Float or 2-D ids in one group: INVALID_ARGUMENT and no other group touched."""
    address = one_ps.addresses[0]
    before = one_ps.snapshots()
    request = {
        "ids/dim4": np.array([1, 2], dtype=np.int64),
        "grad/dim4": np.ones((2, 4), np.float32),
        "ids/dim2": bad_ids,
        "grad/dim2": np.ones((2, 2), np.float32),
    }
    with pytest.raises(grpc.RpcError) as err:
        _raw_call(address, "Push", request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    _assert_snapshots_equal(before, one_ps.snapshots())


def test_repeated_ids_in_one_request_are_rejected(one_ps: Cluster) -> None:
    """A push repeating an id is refused and creates no rows."""
    request = {
        "ids/dim4": np.array([5, 5], dtype=np.int64),
        "grad/dim4": np.ones((2, 4), np.float32),
    }
    with pytest.raises(grpc.RpcError) as err:
        _raw_call(one_ps.addresses[0], "Push", request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert one_ps.ps[0].tables["dim4"].size == 0


@pytest.mark.parametrize("token", ["wrong", TOKEN + "x", "", None], ids=repr)
def test_wrong_or_missing_token_is_unauthenticated(three_ps: Cluster, token: str | None) -> None:
    """Every method refuses calls without the job token, before reading the request."""
    if token is not None and token:
        client = three_ps.client(token)
        try:
            with pytest.raises(grpc.RpcError) as err:
                client.pull({"dim4": np.arange(30, dtype=np.int64)})
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        finally:
            client.close()
    for method in ps_service.METHODS:
        with pytest.raises(grpc.RpcError) as err:
            _raw_call(three_ps.addresses[0], method, {"ids/dim4": np.array([1])}, token=token)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, method
    assert all(t.size == 0 for ps in three_ps.ps for t in ps.tables.values())


def test_an_unknown_method_without_the_token_is_unauthenticated(one_ps: Cluster) -> None:
    """The token is checked for every call, before its method is looked up."""
    with grpc.insecure_channel(one_ps.addresses[0]) as channel:
        stub = channel.unary_unary(f"/{ps_service.SERVICE}/Nope")
        with pytest.raises(grpc.RpcError) as err:
            stub(b"", timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            stub(b"", metadata=ps_service.auth_metadata(TOKEN), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_ps_takes_requests_up_to_what_its_job_needs() -> None:
    """A batch's rows (every id distinct) plus a piece of a hand-over plus the dense weights;
    capped at what any message may carry."""
    features = FeatureConfig(
        num_dense=13,
        tables=(
            TableConfig(name="a", column="a", vocab_size=10, dim=16),
            TableConfig(name="b", column="b", vocab_size=10, dim=1),
        ),
    )
    fixed = ps_service.PIECE_BYTES + ps_service.DENSE_BYTES
    assert ps_service.receive_limit(features, 512) == 512 * (24 + 192 + 24 + 12) + fixed
    wide = FeatureConfig(
        num_dense=0, tables=(TableConfig(name="w", column="w", vocab_size=10, dim=256),)
    )
    assert ps_service.receive_limit(wide, 1 << 20) == ps_service.MAX_MESSAGE_BYTES


def test_a_request_over_the_limit_is_refused(one_ps: Cluster) -> None:
    """With the token, a request over the server's limit is RESOURCE_EXHAUSTED, unread."""
    server, port = start_server(one_ps.ps[0], TOKEN, threads=2, receive_bytes=1024)
    try:
        address = f"127.0.0.1:{port}"
        assert _raw_call(address, "Stats", {})["rows"][0] == 0
        with pytest.raises(grpc.RpcError) as err:
            _raw_call(address, "Pull", {"ids/dim4": np.arange(200, dtype=np.int64)})
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert one_ps.ps[0].tables["dim4"].size == 0
    finally:
        server.stop(None)


def test_stats_counts_rows_and_pushes(one_ps: Cluster) -> None:
    """Stats reports created rows over all groups and accepted pushes."""
    address = one_ps.addresses[0]
    _raw_call(address, "Pull", {"ids/dim4": np.array([1, 2, 1003]), "ids/dim2": np.array([9])})
    _raw_call(
        address, "Push", {"ids/dim4": np.array([4]), "grad/dim4": np.ones((1, 4), np.float32)}
    )
    stats = _raw_call(address, "Stats", {})
    assert int(stats["rows"][0]) == 5
    assert int(stats["pushes"][0]) == 1


def test_save_writes_every_touched_row(three_ps: Cluster, tmp_path: Path) -> None:
    """save() writes ps-<i>.npz per PS; together they hold exactly the touched rows and dense."""
    client = three_ps.client()
    rng = np.random.default_rng(5)
    touched: dict[str, set[int]] = {name: set() for name in DIMS}
    try:
        client.init_dense({"w": np.ones((2, 2), np.float32), "bias": np.zeros(2, np.float32)})
        for _ in range(3):
            ids = {
                "dim4": rng.choice(1300, 30, replace=False).astype(np.int64),
                "dim2": rng.choice(500, 12, replace=False).astype(np.int64),
            }
            client.pull(ids)
            grads = {n: np.ones((v.size, DIMS[n]), np.float32) for n, v in ids.items()}
            client.push(ids, grads, {"w": np.ones((2, 2), np.float32)})
            for n, v in ids.items():
                touched[n].update(v.tolist())
        # Read-only probes do not create rows, so they are not saved.
        client.pull({"dim4": np.arange(1300, dtype=np.int64)}, create=False)
        total = client.save(tmp_path / "model")
        expected_rows = {
            n: client.pull({n: np.array(sorted(t), dtype=np.int64)}, dense=False, create=False)[0][
                n
            ]
            for n, t in touched.items()
            if t
        }
        _, dense = client.pull({}, dense=True)
    finally:
        client.close()

    assert total == sum(len(t) for t in touched.values())
    files = sorted(p.name for p in (tmp_path / "model").iterdir())
    assert files == ["ps-0.npz", "ps-1.npz", "ps-2.npz"]  # no temporary files left behind
    saved_ids: dict[str, list[np.ndarray]] = {n: [] for n in DIMS}
    saved_rows: dict[str, list[np.ndarray]] = {n: [] for n in DIMS}
    saved_dense: dict[str, np.ndarray] = {}
    for i in range(3):
        with np.load(tmp_path / "model" / f"ps-{i}.npz") as npz:
            for name in DIMS:
                part = npz[f"table/{name}/ids"]
                assert (partition_of(name, part, 3) == i).all()
                assert npz[f"table/{name}/rows"].shape == (part.size, DIMS[name])
                assert npz[f"table/{name}/state/accum"].shape == (part.size, DIMS[name])
                assert npz[f"table/{name}/counts"].shape == (part.size,)
                assert (npz[f"table/{name}/counts"] >= 1).all()
                saved_ids[name].append(part)
                saved_rows[name].append(npz[f"table/{name}/rows"])
            saved_dense.update({k[6:]: npz[k] for k in npz.files if k.startswith("dense/")})
    for name in DIMS:
        all_ids = np.concatenate(saved_ids[name])
        assert sorted(all_ids.tolist()) == sorted(touched[name])
        if touched[name]:
            rows = np.concatenate(saved_rows[name])[np.argsort(all_ids)]
            np.testing.assert_array_equal(rows, expected_rows[name])
    assert set(saved_dense) == {"w", "bias"}
    for k, v in dense.items():
        np.testing.assert_array_equal(saved_dense[k], v)


def test_save_writes_adam_state_per_row(tmp_path: Path) -> None:
    """With Adam, a partition file carries m, v and each row's own step count."""
    ps = ParameterServer(0, 1, LAYOUT, Optimizer("adam", LR), SEED)
    g = np.ones((2, 4), np.float32)
    ps.push({"ids/dim4": np.array([3, 1003]), "grad/dim4": g})
    ps.push({"ids/dim4": np.array([3]), "grad/dim4": g[:1]})
    reply = ps.save({"path": np.frombuffer(str(tmp_path / "ps-0.npz").encode(), dtype=np.uint8)})
    assert int(reply["rows"][0]) == 2
    with np.load(tmp_path / "ps-0.npz") as npz:
        prefix = "table/dim4/"
        keys = {k[len(prefix) :] for k in npz.files if k.startswith(prefix)}
        assert keys == {"ids", "rows", "counts", "seen", "state/m", "state/v", "state/step"}
        steps = dict(
            zip(
                npz[prefix + "ids"].tolist(), npz[prefix + "state/step"][:, 0].tolist(), strict=True
            )
        )
        assert npz[prefix + "state/m"].shape == npz[prefix + "state/v"].shape == (2, 4)
    assert steps == {3: 2.0, 1003: 1.0}


# -- batch ledger: exactly-once pushes --------------------------------------------------------
def _keyed_push(key: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {
        "key": np.array([key], dtype=np.int64),
        "ids/dim4": np.array([3, 1003], dtype=np.int64),
        "grad/dim4": np.full((2, 4), scale, np.float32),
        "dgrad/w": np.full(3, scale, np.float32),
    }


def test_keyed_push_is_applied_once_and_its_retry_turned_away() -> None:
    """The same batch key twice: the second push changes no row, no dense weight, no version."""
    ps = ParameterServer(0, 1, LAYOUT, ADAGRAD, SEED)
    ps.init_dense({"dense/w": np.ones(3, np.float32)})
    assert ps.push(_keyed_push(7)) == {}
    rows = ps.tables["dim4"].snapshot()
    dense = ps.dense.snapshot()
    reply = ps.push(_keyed_push(7, scale=5.0))  # a retry (with whatever gradient it carries)
    assert reply.keys() == {"duplicate"}
    for key, value in ps.tables["dim4"].snapshot().items():
        np.testing.assert_array_equal(value, rows[key])
    for key, value in ps.dense.snapshot().items():
        np.testing.assert_array_equal(value, dense[key])
    assert ps.pushes == 1
    assert ps.ledger.applied == {7}
    assert dict(ps.ledger.rejected) == {7: 1}
    # Another key is applied; unkeyed pushes always are and are not recorded.
    assert ps.push(_keyed_push(8)) == {}
    ps.push({k: v for k, v in _keyed_push(0).items() if k != "key"})
    ps.push({k: v for k, v in _keyed_push(0).items() if k != "key"})
    assert ps.pushes == 4
    assert ps.ledger.applied == {7, 8}


def test_malformed_push_does_not_consume_its_key(one_ps: Cluster) -> None:
    """A push refused as invalid records nothing: the valid retry of that batch is applied."""
    address = one_ps.addresses[0]
    bad = {**_keyed_push(3), "grad/dim4": np.full((2, 4), np.nan, np.float32)}
    del bad["dgrad/w"]
    with pytest.raises(grpc.RpcError) as err:
        _raw_call(address, "Push", bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert one_ps.ps[0].ledger.applied == set()
    good = {k: v for k, v in _keyed_push(3).items() if k != "dgrad/w"}
    assert _raw_call(address, "Push", good) == {}
    assert one_ps.ps[0].ledger.applied == {3}


def test_client_push_and_push_pull_carry_the_key(three_ps: Cluster) -> None:
    """Through PSClient every PS records the key (even one that owns none of the ids) and a
    retried push or push_pull is turned away everywhere, leaving the rows as they were."""
    client = three_ps.client()
    ids = {"dim1": np.array([4], dtype=np.int64)}  # one id: two of the three PS own nothing
    grads = {"dim1": np.ones((1, 1), np.float32)}
    try:
        client.pull(ids, dense=False)
        client.push(ids, grads, {}, key=11)
        after_one, _ = client.pull(ids, dense=False, create=False)
        client.push(ids, grads, {}, key=11)
        retried = client.push_pull_async((ids, grads, {}), ids, [-1, -1, -1], push_key=11)
        np.testing.assert_array_equal(retried.result().rows["dim1"], after_one["dim1"])
        client.push_pull_async((ids, grads, {}), ids, [-1, -1, -1], push_key=12).result()
        ledgers = client.ledgers()
    finally:
        client.close()
    assert ledgers == [({11, 12}, 2)] * 3
    assert sum(ps.pushes for ps in three_ps.ps) == 2 * 3


def test_ledger_rpc_returns_applied_keys_and_rejections(one_ps: Cluster) -> None:
    """The Ledger method over a real gRPC server: applied keys (sorted int64), rejected total."""
    address = one_ps.addresses[0]
    assert _raw_call(address, "Ledger", {})["applied"].tolist() == []
    for key in (5, 2, 9, 2, 2):
        push = {k: v for k, v in _keyed_push(key).items() if k != "dgrad/w"}
        _raw_call(address, "Push", push)
    reply = _raw_call(address, "Ledger", {})
    assert reply["applied"].dtype == np.int64
    assert reply["applied"].tolist() == [2, 5, 9]
    assert reply["rejected"].tolist() == [2]
    client = one_ps.client()
    try:
        assert client.ledgers() == [({2, 5, 9}, 2)]
    finally:
        client.close()


# -- snapshot / restore -----------------------------------------------------------------------
def _trained_ps(optimizer: Optimizer, index: int = 0, num_ps: int = 1) -> ParameterServer:
    """A PS after a few keyed pushes of sparse and dense gradients (and one retry)."""
    ps = ParameterServer(index, num_ps, LAYOUT, optimizer, SEED)
    ps.init_dense({f"dense/{k}": v for k, v in DENSE_INIT.items()})
    rng = np.random.default_rng(3)
    for key in range(4):
        ids = {
            "dim4": np.sort(rng.choice(1300, 20, replace=False)).astype(np.int64),
            "dim1": np.sort(rng.choice(50, 5, replace=False)).astype(np.int64),
        }
        push: dict[str, np.ndarray] = {"key": np.array([key], dtype=np.int64)}
        for name, v in ids.items():
            push[f"ids/{name}"] = v
            push[f"grad/{name}"] = rng.normal(size=(v.size, DIMS[name])).astype(np.float32)
        for name, value in DENSE_INIT.items():
            push[f"dgrad/{name}"] = rng.normal(size=value.shape).astype(np.float32)
        ps.push(push)
    ps.push(push)  # a retry of key 3: rejected, and recorded as such
    ps.pull({"ids/dim2": np.array([1, 2], dtype=np.int64)})  # rows created, never updated
    return ps


def _assert_same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("name", ["adam", "adagrad"])
def test_snapshot_restore_gives_an_identical_parameter_server(name: str) -> None:
    """Rows, per-row optimizer state, counts, dense values + state + version and the ledger all
    come back; the restored PS then evolves exactly like the original."""
    optimizer = Optimizer(name, LR)  # type: ignore[arg-type]
    original = _trained_ps(optimizer)
    snapshot = original.snapshot()
    assert "dense_version" in snapshot and int(snapshot["dense_version"][0]) == 4
    assert any(k.startswith("dstate/") for k in snapshot)
    assert snapshot["ledger/applied"].tolist() == [0, 1, 2, 3]

    restored = ParameterServer(0, 1, LAYOUT, optimizer, SEED)
    restored.restore(snapshot)
    _assert_same_arrays(restored.snapshot(), snapshot)
    assert restored.dense.version == original.dense.version
    assert restored.ledger.applied == original.ledger.applied
    assert restored.ledger.rejected == original.ledger.rejected

    # Same future: a retried key is refused by both, a new push changes both identically.
    retry = {"key": np.array([2]), "ids/dim4": np.array([1]), "grad/dim4": np.ones((1, 4))}
    assert restored.push(retry) == original.push(retry) == {"duplicate": np.ones(1, np.uint8)}
    step = {
        "key": np.array([4]),
        "ids/dim4": np.array([1, 1299]),
        "grad/dim4": np.ones((2, 4), np.float32),
        "dgrad/out/bias": np.array(0.25, np.float32),
    }
    original.push(step)
    restored.push(step)
    _assert_same_arrays(restored.snapshot(), original.snapshot())


def test_restore_from_a_saved_file(tmp_path: Path) -> None:
    """save() writes the snapshot; np.load of that file restores the same PS (what a relaunched
    PS does with its checkpoint partition)."""
    original = _trained_ps(Optimizer("adam", LR))
    path = tmp_path / "ckpt" / "ps-0.npz"
    original.save({"path": np.frombuffer(str(path).encode(), dtype=np.uint8)})
    restored = ParameterServer(0, 1, LAYOUT, Optimizer("adam", LR), SEED)
    with np.load(path) as npz:
        restored.restore(dict(npz))
    _assert_same_arrays(restored.snapshot(), original.snapshot())


def test_restore_with_a_different_number_of_ps_is_rejected() -> None:
    """A partition saved by a job with 2 PS does not fit a job with 3: refused, nothing loaded."""
    snapshot = _trained_ps(ADAGRAD, index=0, num_ps=2).snapshot()
    fresh = ParameterServer(0, 3, LAYOUT, ADAGRAD, SEED)
    with pytest.raises(ValueError, match="checkpoint has 2 PS partitions, the job has 3"):
        fresh.restore(snapshot)
    assert all(t.size == 0 for t in fresh.tables.values())
    assert fresh.dense.values == {} and fresh.ledger.applied == set()


def test_restore_needs_empty_tables() -> None:
    """Restoring over rows a PS already has would mix two points in training: refused."""
    snapshot = _trained_ps(ADAGRAD).snapshot()
    busy = ParameterServer(0, 1, LAYOUT, ADAGRAD, SEED)
    busy.pull({"ids/dim4": np.array([1], dtype=np.int64)})
    with pytest.raises(ValueError, match="restore needs an empty table"):
        busy.restore(snapshot)


def test_dense_store_snapshot_restore_keeps_a_0d_adam_step() -> None:
    """Dense Adam state holds a 0-d step; it survives a round trip and keeps counting."""
    adam = Optimizer("adam", LR)
    store = DenseStore(adam)
    store.initialize({"b": np.array(0.5, np.float32)})
    store.apply_gradients({"b": np.array(1.0, np.float32)})
    copy = DenseStore(adam)
    copy.restore(store.snapshot())
    assert copy.state["b"]["step"].shape == ()
    assert copy.version == 1
    for s in (store, copy):
        s.apply_gradients({"b": np.array(-1.0, np.float32)})
    _assert_same_arrays(copy.snapshot(), store.snapshot())
    assert float(copy.state["b"]["step"]) == 2.0


def test_lookup_with_state_returns_rows_and_their_optimizer_state() -> None:
    """A training pull can read some rows' optimizer state together with the rows."""
    table = EmbeddingTable("a", 4, vocab_size=100, seed=SEED, optimizer=ADAGRAD)
    table.apply_gradients(np.array([2, 5]), np.ones((2, 4), np.float32))
    rows, state = table.lookup_with_state(np.array([2, 5, 9]), np.array([5, 9]))
    np.testing.assert_array_equal(rows, table.lookup(np.array([2, 5, 9]), create=False))
    np.testing.assert_allclose(state["accum"][0], 1.1, rtol=1e-6)
    np.testing.assert_array_equal(state["accum"][1], np.float32(ADAGRAD_INITIAL_ACCUMULATOR))
    with pytest.raises(ValueError, match="state_ids must be a subset of ids"):
        table.lookup_with_state(np.array([2]), np.array([50]))


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_apply_with_fields_returns_what_fields_reads_before_and_after_the_step(
    optimizer: str,
) -> None:
    """ECRM's push path takes the fields before and after a step in one pass; they must be
    what ``fields`` reads around ``apply_gradients``, created rows included."""
    rng = np.random.default_rng(8)
    a = EmbeddingTable("t", 4, 50, 3, Optimizer(optimizer, 0.1))
    b = EmbeddingTable("t", 4, 50, 3, Optimizer(optimizer, 0.1))
    for step in range(3):
        ids = np.sort(rng.choice(50, size=12, replace=False))
        grads = rng.normal(size=(12, 4)).astype(np.float32)
        want_old = a.fields(ids)
        a.apply_gradients(ids, grads)
        want_new = a.fields(ids)
        old, new = b.apply_with_fields(ids, grads)
        for name in want_old:
            np.testing.assert_array_equal(old[name], want_old[name], err_msg=f"{name} {step}")
            np.testing.assert_array_equal(new[name], want_new[name], err_msg=f"{name} {step}")
        np.testing.assert_array_equal(b.fields(ids)["row"], want_new["row"])


def test_fields_read_created_rows_and_the_initial_values_of_the_others_without_creating() -> None:
    """``fields`` of ids some of which have rows: those rows as they are, the others their
    seeded initial value and fresh optimizer state (computed outside the table's lock), in
    the order asked, and no row is created."""
    table = EmbeddingTable("t", 4, 50, 3, Optimizer("adagrad", 0.1))
    created = np.array([3, 17, 40])
    table.apply_gradients(created, np.ones((3, 4), np.float32))
    ids = np.array([1, 3, 9, 17, 40, 49])
    got = table.fields(ids)
    assert table.size == 3
    at = np.isin(ids, created)
    np.testing.assert_array_equal(got["row"][at], table.fields(created)["row"])
    initial = table.initial_fields(ids[~at])
    for name, value in initial.items():
        np.testing.assert_array_equal(got[name][~at], value)
    assert (got["state/accum"][at] > ADAGRAD_INITIAL_ACCUMULATOR).all()


def test_a_client_of_a_new_ps_list_keeps_the_channels_both_lists_name(three_ps: Cluster) -> None:
    """A worker back from a lost PS reconnects only to the replacement: the channels to the
    PS that stayed are handed over (still connected), the others closed."""
    old = three_ps.client()
    assert len(old.ledgers()) == 3
    kept, gone = old._channels[:2], old._channels[2]
    new = old.reconnect(three_ps.addresses[:2])
    assert new._channels == kept and old._channels == []
    assert [ledger for ledger, _ in new.ledgers()] == [set(), set()]  # still usable
    with pytest.raises(ValueError, match="closed channel"):
        gone.unary_unary(ps_service.method_path("Pull"))(b"", timeout=1)
    new.close()
