"""Signatures of node crashes and the verdict that a failure is deterministic
(``core.crashes``): the same mistake reads the same wherever it struck, deaths on one shard are
that shard's (poison quarantine), and the same exception on different shards, or from nodes
that held none, fails the job."""

from __future__ import annotations

import numpy as np
import pytest

from airflow_rover.core.crashes import Crash, Death, RepeatedFailures, headline, normalise
from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.spec import FeatureConfig, RecoveryConfig, TableConfig


def crash_of(fn, *args) -> Crash:  # type: ignore[no-untyped-def]
    try:
        fn(*args)
    except Exception as exc:
        return Crash.of(exc)
    raise AssertionError("no exception")


def out_of_vocabulary(bad_id: int) -> None:
    """A batch whose column C1 holds ``bad_id`` in a table of 100 rows (as a worker meets it)."""
    table = TableConfig(name="C1", column="C1", vocab_size=100, dim=4)
    placement = EmbeddingPlacement.from_features(FeatureConfig(num_dense=0, tables=[table]))
    placement.groups[0].fused_ids(np.array([[3], [bad_id]]), {"C1": 0})


def user_code(step: int) -> None:
    np.asarray([1.0, 2.0]).reshape(3, step)  # numpy raises inside itself


def test_the_same_mistake_on_other_rows_has_one_signature() -> None:
    """Ids, counts and addresses differ from node to node; the signature does not."""
    first, second = crash_of(out_of_vocabulary, 150), crash_of(out_of_vocabulary, 4096)
    assert first.message != second.message
    assert first.signature == second.signature
    assert first.exc_type == "ValueError"
    assert first.where.startswith("core/embedding_placement.py:fused_ids:")
    assert "outside [0, 100)" in first.summary()
    assert crash_of(user_code, 7).signature != first.signature


def test_where_is_the_innermost_frame_outside_numpy_and_tensorflow() -> None:
    """numpy raised it, but the place to look is the caller's line."""
    crash = crash_of(user_code, 7)
    assert crash.where.startswith("unit/test_crashes.py:user_code:"), crash.where
    assert "reshape" in crash.tail  # the traceback itself is kept for the message


def test_normalise_keeps_the_first_line_without_numbers_but_names() -> None:
    text = "\n  {{node 12}} id 0x7f3a of C12 out of [0, 1000) at 3.5e-2\nTraceback (most recent)"
    assert normalise(text) == "{{node N}} id N of C12 out of [N, N) at N"


def test_the_python_error_tensorflow_relays_is_the_headline() -> None:
    """A py_function or tf.data generator that raised: TensorFlow's first line says nothing."""
    graph = (
        "Graph execution error:\n\nDetected at node EagerPyFunc defined at (most recent call "
        'last):\n  File "/m.py", line 22, in <module>\n\nZeroDivisionError: scale 0 at run 10\n'
        "Traceback (most recent call last):\n"
    )
    assert headline(graph) == "ZeroDivisionError: scale 0 at run 10"
    pipeline = "{{function_node __wrapped__IteratorGetNext_output_types_1}} ValueError: id 7\n"
    assert headline(pipeline) == "ValueError: id 7"
    assert normalise(pipeline) == "ValueError: id N"


def death(node: str, shard: int | None, crash: Crash) -> Death:
    return Death(node, crash, shard)


def test_deaths_on_one_shard_are_the_shards_not_the_jobs() -> None:
    """A poison shard kills every worker that trains it: the quarantine deals with it."""
    crash = crash_of(out_of_vocabulary, 150)
    failures = RepeatedFailures(2)
    for node in ("worker-0", "worker-0", "worker-1"):
        assert failures.record(death(node, 3, crash)) is None


def test_the_same_exception_on_two_shards_is_deterministic() -> None:
    failures = RepeatedFailures(2)
    assert failures.record(death("worker-0", 3, crash_of(out_of_vocabulary, 150))) is None
    verdict = failures.record(death("worker-1", 5, crash_of(out_of_vocabulary, 999)))
    assert verdict is not None
    assert (verdict.nodes, verdict.shards) == (["worker-0", "worker-1"], [3, 5])
    assert verdict.signature == crash_of(out_of_vocabulary, 100).signature


def test_nodes_without_a_shard_count_each_death() -> None:
    """At start-up, the evaluator, a PS: the same node twice (a restart) is enough."""
    failures = RepeatedFailures(3)
    crash = crash_of(user_code, 7)
    assert failures.record(death("evaluator", None, crash)) is None
    assert failures.record(death("evaluator", None, crash)) is None
    verdict = failures.record(death("evaluator", None, crash))
    assert verdict is not None and verdict.nodes == ["evaluator"] and verdict.shards == []


def test_other_exceptions_and_transient_ones_do_not_add_up() -> None:
    failures = RepeatedFailures(2)
    assert failures.record(death("worker-0", 1, crash_of(user_code, 7))) is None
    assert failures.record(death("worker-1", 2, crash_of(out_of_vocabulary, 150))) is None
    lost = Crash("httpx.ConnectError", "connection refused", "rpc/x.py:f:1", transient=True)
    assert failures.record(death("worker-0", None, lost)) is None
    assert failures.record(death("worker-1", None, lost)) is None


def test_the_threshold_is_a_validated_recovery_setting() -> None:
    assert RecoveryConfig().deterministic_after == 2
    with pytest.raises(ValueError, match="greater than or equal to 2"):
        RecoveryConfig(deterministic_after=1)
    with pytest.raises(ValueError, match="must be >= 2"):
        RepeatedFailures(1)
