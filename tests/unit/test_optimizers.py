"""PS optimizers: SGD, Adagrad and (lazy, per-row) Adam against float64 NumPy and Keras."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from airflow_rover.core import training_optimizers
from airflow_rover.core.hashing import INIT_SCALE, initial_rows
from airflow_rover.core.id_probe import NumpyProbe
from airflow_rover.core.training_optimizers import (
    ADAGRAD_INITIAL_ACCUMULATOR,
    ADAM_BETA_1,
    ADAM_BETA_2,
    EPSILON,
    Optimizer,
)
from airflow_rover.ps import tables
from airflow_rover.ps.tables import DenseStore, EmbeddingTable

# Adam's bias correction runs in float32 as in Keras (0.999 rounds to 0.99900001), about 6e-6
# relative per step against float64; a smaller Adam rate keeps 6 steps well inside 1e-6.
LRS = {"sgd": 0.1, "adagrad": 0.1, "adam": 0.01}
ADAM_LR = LRS["adam"]
SEED = 7
NAMES = ("sgd", "adagrad", "adam")
STEPS = 6


def _grads(shape: tuple[int, ...], steps: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0.0, 1.0, size=shape).astype(np.float32) for _ in range(steps)]


def _reference(name: str, param: np.ndarray, grads: list[np.ndarray], lr: float) -> np.ndarray:
    """The Keras 3 update rules written out independently, in float64, with literal constants.

    Every element here sees every gradient, so one step counter serves rows and dense alike.
    """
    p = np.array(param, dtype=np.float64)
    accum = np.full_like(p, 0.1)
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t, g32 in enumerate(grads, start=1):
        g = g32.astype(np.float64)
        if name == "sgd":
            p = p - lr * g
        elif name == "adagrad":
            accum = accum + g * g
            p = p - lr * g / np.sqrt(accum + 1e-7)
        else:
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            alpha = lr * np.sqrt(1.0 - 0.999**t) / (1.0 - 0.9**t)
            p = p - alpha * m / (np.sqrt(v) + 1e-7)
    return p


@pytest.fixture(scope="module")
def keras() -> Iterator[ModuleType]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
        yield pytest.importorskip("keras")


def _keras_optimizer(keras: ModuleType, name: str, lr: float) -> Any:
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=lr)
    if name == "adagrad":
        return keras.optimizers.Adagrad(
            learning_rate=lr, initial_accumulator_value=0.1, epsilon=1e-7
        )
    return keras.optimizers.Adam(learning_rate=lr, epsilon=1e-7)


# -- constants and state layout ----------------------------------------------------------------
def test_constants_match_keras_defaults() -> None:
    """Initial accumulator, epsilon and Adam betas are Keras' defaults."""
    assert np.isclose(ADAGRAD_INITIAL_ACCUMULATOR, 0.1)
    assert np.isclose(EPSILON, 1e-7, rtol=1e-9, atol=0)
    assert (ADAM_BETA_1, ADAM_BETA_2) == (0.9, 0.999)


@pytest.mark.parametrize(
    ("name", "expected"), [("sgd", ()), ("adagrad", ("accum",)), ("adam", ("m", "v", "step"))]
)
def test_state_names(name: str, expected: tuple[str, ...]) -> None:
    """Each optimizer names its state slots; init_state creates exactly those."""
    opt = Optimizer(name, LRS[name])  # type: ignore[arg-type]
    assert opt.state_names() == expected
    assert set(opt.init_state((3, 4), rows=True)) == set(expected)
    assert set(opt.init_state((3, 4), rows=False)) == set(expected)


@pytest.mark.parametrize("n", [0, 5])
def test_init_state_shapes_for_rows(n: int) -> None:
    """Rows: accum/m/v are (n, dim); Adam's step is one counter per row, (n, 1)."""
    accum = Optimizer("adagrad", ADAM_LR).init_state((n, 4), rows=True)["accum"]
    assert accum.shape == (n, 4) and accum.dtype == np.float32
    np.testing.assert_array_equal(accum, np.float32(0.1))
    adam = Optimizer("adam", ADAM_LR).init_state((n, 4), rows=True)
    assert adam["m"].shape == adam["v"].shape == (n, 4)
    assert adam["step"].shape == (n, 1)
    for value in adam.values():
        assert value.dtype == np.float32
        assert not value.any()


@pytest.mark.parametrize("shape", [(3, 4), (7,), ()], ids=str)
def test_init_state_shapes_for_dense(shape: tuple[int, ...]) -> None:
    """Dense: accum/m/v have the variable's shape; Adam's step is a single 0-d counter."""
    accum = Optimizer("adagrad", ADAM_LR).init_state(shape, rows=False)["accum"]
    assert accum.shape == shape
    np.testing.assert_array_equal(accum, np.float32(0.1))
    adam = Optimizer("adam", ADAM_LR).init_state(shape, rows=False)
    assert adam["m"].shape == adam["v"].shape == shape
    assert adam["step"].shape == ()
    assert Optimizer("sgd", ADAM_LR).init_state(shape, rows=False) == {}


# -- apply against the float64 reference -------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_apply_on_rows_matches_reference(name: str) -> None:
    """Several in-place steps on (n, dim) rows with per-row state equal the float64 reference."""
    opt = Optimizer(name, LRS[name])  # type: ignore[arg-type]
    init = np.random.default_rng(1).uniform(-0.05, 0.05, size=(6, 3)).astype(np.float32)
    param = init.copy()
    state = opt.init_state(param.shape, rows=True)
    grads = _grads(param.shape, STEPS, seed=2)
    for g in grads:
        opt.apply(param, state, g)  # in place
        assert param.dtype == np.float32
        assert all(s.dtype == np.float32 for s in state.values())
    np.testing.assert_allclose(param, _reference(name, init, grads, LRS[name]), rtol=0, atol=1e-6)
    if name == "adagrad":
        ref_accum = 0.1 + sum(np.square(g.astype(np.float64)) for g in grads)
        np.testing.assert_allclose(state["accum"], ref_accum, rtol=1e-6)
    if name == "adam":
        np.testing.assert_array_equal(state["step"], np.full((6, 1), STEPS, np.float32))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(4, 3), ()], ids=["matrix", "scalar"])
def test_apply_on_dense_matches_reference(name: str, shape: tuple[int, ...]) -> None:
    """Several in-place steps on a dense variable (0-d included) equal the float64 reference."""
    opt = Optimizer(name, LRS[name])  # type: ignore[arg-type]
    init = np.asarray(np.random.default_rng(3).uniform(-1, 1, size=shape), dtype=np.float32)
    param = init.copy()
    state = opt.init_state(shape, rows=False)
    grads = _grads(shape, STEPS, seed=4)
    for g in grads:
        opt.apply(param, state, g)
    assert param.shape == shape and param.dtype == np.float32
    np.testing.assert_allclose(param, _reference(name, init, grads, LRS[name]), rtol=0, atol=1e-6)
    if name == "adam":
        assert state["step"].shape == () and float(state["step"]) == STEPS


@pytest.mark.parametrize("name", NAMES)
def test_dense_store_applies_the_optimizer(name: str) -> None:
    """DenseStore keeps per-variable state and steps each variable with its own gradient."""
    store = DenseStore(Optimizer(name, LRS[name]))  # type: ignore[arg-type]
    init = {"w": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), "b": np.float32(0.5)}
    store.initialize({k: np.asarray(v) for k, v in init.items()})
    grads = {"w": _grads((2, 3), 4, seed=5), "b": _grads((), 4, seed=6)}
    for step in range(4):
        store.apply_gradients({k: g[step] for k, g in grads.items()})
    values = store.read()
    for k in init:
        ref = _reference(name, np.asarray(init[k]), grads[k], LRS[name])
        np.testing.assert_allclose(values[k], ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["sgd", "adagrad"])
@pytest.mark.parametrize("rows", [True, False])
def test_zero_gradient_is_a_no_op(name: str, rows: bool) -> None:
    """SGD and Adagrad: a zero gradient changes neither the parameter nor the state."""
    opt = Optimizer(name, LRS[name])  # type: ignore[arg-type]
    param = np.random.default_rng(0).normal(size=(3, 2)).astype(np.float32)
    state = opt.init_state(param.shape, rows=rows)
    before_param = param.copy()
    before_state = {k: v.copy() for k, v in state.items()}
    opt.apply(param, state, np.zeros_like(param))
    np.testing.assert_array_equal(param, before_param)
    for k, v in before_state.items():
        np.testing.assert_array_equal(state[k], v)


# -- Keras ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_dense_updates_match_keras(keras: ModuleType, name: str) -> None:
    """5 steps on a dense variable equal keras.optimizers.{SGD, Adagrad, Adam} (Keras defaults,
    Adagrad initial_accumulator_value=0.1, epsilon=1e-7)."""
    opt = Optimizer(name, LRS[name])  # type: ignore[arg-type]
    init = np.random.default_rng(8).uniform(-0.5, 0.5, size=(4, 3)).astype(np.float32)
    grads = _grads(init.shape, steps=5, seed=9)
    ours = init.copy()
    state = opt.init_state(ours.shape, rows=False)
    for g in grads:
        opt.apply(ours, state, g)

    var = keras.Variable(init.copy(), dtype="float32")
    reference = _keras_optimizer(keras, name, LRS[name])
    for g in grads:
        reference.apply_gradients([(keras.ops.convert_to_tensor(g), var)])
    np.testing.assert_allclose(ours, np.asarray(var.numpy()), rtol=0, atol=1e-6)


# -- lazy Adam in an EmbeddingTable ------------------------------------------------------------
def _single_adam_step(row: np.ndarray, g: np.ndarray, lr: float) -> np.ndarray:
    """One Adam step from fresh state (t = 1), in float64."""
    return _reference("adam", row, [g], lr)


def test_adam_rows_keep_their_own_step_counts() -> None:
    """Row A updated 3 times, row B once: B ends exactly one fresh Adam step from its init."""
    dim = 3
    a, b = 2, 7
    table = EmbeddingTable("t", dim, vocab_size=10, seed=SEED, optimizer=Optimizer("adam", ADAM_LR))
    grads_a = _grads((1, dim), steps=3, seed=10)
    grad_b = np.array([[0.3, -2.0, 0.01]], np.float32)
    table.apply_gradients(np.array([a]), grads_a[0])
    table.apply_gradients(np.array([a]), grads_a[1])
    table.apply_gradients(np.array([a, b]), np.concatenate([grads_a[2], grad_b]))

    init = initial_rows("t", np.array([a, b]), dim, SEED, INIT_SCALE)
    rows = table.lookup(np.array([a, b]), create=False)
    np.testing.assert_allclose(rows[0], _reference("adam", init[0], grads_a, ADAM_LR)[0], atol=1e-6)
    expected_b = _single_adam_step(init[1:], grad_b, ADAM_LR)
    np.testing.assert_allclose(rows[1:], expected_b, rtol=0, atol=1e-6)

    # Bias-corrected for B's one update, not for the table's three pushes (non-lazy Adam).
    g = grad_b.astype(np.float64)
    global_step = init[1:] - ADAM_LR * np.sqrt(1 - 0.999**3) / (1 - 0.9**3) * (0.1 * g) / (
        np.sqrt(0.001 * g * g) + 1e-7
    )
    assert np.abs(rows[1:] - global_step).max() > 0.2 * ADAM_LR

    # The same update on a table that only ever saw B gives the same row.
    fresh = EmbeddingTable("t", dim, vocab_size=10, seed=SEED, optimizer=Optimizer("adam", ADAM_LR))
    fresh.apply_gradients(np.array([b]), grad_b)
    np.testing.assert_array_equal(fresh.lookup(np.array([b]), create=False), rows[1:])

    snap = table.snapshot()
    steps = dict(zip(snap["ids"].tolist(), snap["state/step"][:, 0].tolist(), strict=True))
    assert steps == {a: 3.0, b: 1.0}
    assert snap["state/m"].shape == snap["state/v"].shape == (2, dim)


def test_adam_rows_created_by_lookup_start_with_fresh_state() -> None:
    """A row first pulled, then pushed, starts from zero moments and step 0."""
    table = EmbeddingTable("t", 2, vocab_size=5, seed=SEED, optimizer=Optimizer("adam", ADAM_LR))
    ids = np.array([0, 4])
    init = table.lookup(ids)
    snap = table.snapshot()
    for key in ("state/m", "state/v", "state/step"):
        assert not snap[key].any()
    g = np.array([[1.0, -1.0], [0.5, 2.0]], np.float32)
    table.apply_gradients(ids, g)
    np.testing.assert_allclose(
        table.lookup(ids, create=False), _single_adam_step(init, g, ADAM_LR), rtol=0, atol=1e-6
    )


@pytest.mark.parametrize("name", NAMES)
def test_table_rows_match_reference_after_growth(name: str) -> None:
    """Optimizer state survives the table's array growth: 1,500 rows stepped twice."""
    opt = Optimizer(name, LRS[name])  # type: ignore[arg-type]
    table = EmbeddingTable("t", 2, vocab_size=2000, seed=SEED, optimizer=opt)
    ids = np.random.default_rng(11).permutation(2000)[:1500]
    grads = _grads((ids.size, 2), steps=2, seed=12)
    table.apply_gradients(ids[:700], grads[0][:700])  # first 1024-row capacity ...
    table.apply_gradients(ids[700:], grads[0][700:])  # ... then grown
    table.apply_gradients(ids, grads[1])
    init = initial_rows("t", ids, 2, SEED, INIT_SCALE)
    np.testing.assert_allclose(
        table.lookup(ids, create=False), _reference(name, init, grads, LRS[name]), rtol=0, atol=1e-6
    )


@pytest.mark.parametrize("twin", [False, True], ids=["compiled", "numpy-twin"])
def test_adagrad_in_place_is_bit_identical_to_its_float32_formula(
    twin: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-place Adagrad (one C pass, or its numpy twin with two temporaries) gives the
    very bits of the plain float32 expression, so the update is the same whichever way a
    process computes it."""
    if twin:
        monkeypatch.setattr(training_optimizers, "PROBE", NumpyProbe())
    rng = np.random.default_rng(8)
    opt = Optimizer("adagrad", 0.2)
    for shape in [(300, 16), (257,), (5, 1)]:
        param = rng.uniform(-1, 1, shape).astype(np.float32)
        state = opt.init_state(shape, rows=True)
        ref_param, ref_accum = param.copy(), state["accum"].copy()
        for g in _grads(shape, STEPS, seed=9):
            opt.apply(param, state, g)
            ref_accum += g * g
            ref_param -= np.float32(0.2) * g / np.sqrt(ref_accum + np.float32(1e-7))
        np.testing.assert_array_equal(param, ref_param)
        np.testing.assert_array_equal(state["accum"], ref_accum)


@pytest.mark.parametrize("twin", [False, True], ids=["compiled", "numpy-twin"])
@pytest.mark.parametrize("dim", [1, 16, 7])
def test_table_adagrad_push_is_bit_identical_to_the_optimizer(
    dim: int, twin: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table's Adagrad push (one C pass over its rows in place, or the numpy twin without
    a compiler) gives the very bits ``Optimizer.apply`` gives on copies of the rows, for
    the table dims the C loop copies whole and any other."""
    if twin:
        monkeypatch.setattr(tables, "PROBE", NumpyProbe())
    rng = np.random.default_rng(dim)
    opt = Optimizer("adagrad", 0.2)
    table = EmbeddingTable("t", dim, vocab_size=5000, seed=SEED, optimizer=opt)
    ids = np.sort(rng.choice(5000, 900, replace=False))
    param = table.lookup(ids)
    accum = opt.init_state(param.shape, rows=True)
    for step, g in enumerate(_grads((ids.size, dim), STEPS, seed=dim)):
        some = np.arange(ids.size) % (step + 2) != 0  # a different subset of rows each step
        table.apply_gradients(ids[some], g[some])
        p, state = param[some], {"accum": accum["accum"][some]}
        opt.apply(p, state, g[some])
        param[some], accum["accum"][some] = p, state["accum"]
    np.testing.assert_array_equal(table.lookup(ids, create=False), param)
    np.testing.assert_array_equal(table.fields(ids)["state/accum"], accum["accum"])


def test_adagrad_refuses_to_write_a_read_only_array_as_numpy_does() -> None:
    """A read-only accumulator (a view of a received message) is not written through the C
    loop's pointer: the update fails as numpy's in-place update fails."""
    opt = Optimizer("adagrad", 0.2)
    param = np.ones(8, np.float32)
    accum = np.full(8, 0.1, np.float32)
    accum.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        opt.apply(param, {"accum": accum}, np.ones(8, np.float32))
    np.testing.assert_array_equal(accum, np.full(8, 0.1, np.float32))
