"""GoldMiner's job-level policy for the number of data workers (``core.data_autoscaler``)."""

from __future__ import annotations

import pytest

from airflow_rover.core.data_autoscaler import (
    FULL_WINDOWS,
    REPROBE_WINDOWS,
    DataAutoscaler,
    InputWindow,
)


def window(count: int, rate: float, wait: float, fill: float = 0.5, at: float = 0.0) -> InputWindow:
    return InputWindow(at, count, rate, wait, fill)


def test_steps_up_while_the_trainers_wait_and_each_step_pays() -> None:
    policy = DataAutoscaler(0, 4, 0)
    up = policy.decide(window(0, 1000, 0.5))
    assert up is not None and (up.previous, up.count, up.rule) == (0, 1, "input-wait")
    assert "50%" in up.reason
    assert policy.decide(window(1, 1800, 0.3)) is None  # the step is judged: kept
    up = policy.decide(window(1, 1800, 0.3))
    assert up is not None and up.count == 2


def test_a_step_up_that_does_not_pay_is_taken_back_and_caps_the_count() -> None:
    policy = DataAutoscaler(0, 4, 1)
    assert policy.decide(window(1, 1000, 0.4)).count == 2  # type: ignore[union-attr]
    back = policy.decide(window(2, 1020, 0.35))  # +2%: the cores are the limit now
    assert back is not None and (back.previous, back.count, back.rule) == (2, 1, "revert")
    assert "+2%" in back.reason and "no more than 1" in back.reason
    for _ in range(REPROBE_WINDOWS - 1):  # still waiting, but capped
        assert policy.decide(window(1, 1000, 0.4)) is None
    again = policy.decide(window(1, 1000, 0.4))
    assert again is not None and (again.count, again.rule) == (2, "reprobe")


def test_falls_back_to_the_trainers_when_data_workers_do_not_pay() -> None:
    policy = DataAutoscaler(0, 3, 0)
    assert policy.decide(window(0, 1000, 0.2)).count == 1  # type: ignore[union-attr]
    back = policy.decide(window(1, 900, 0.1))
    assert back is not None and back.count == 0


def test_a_full_queue_with_idle_waits_steps_down_and_a_costly_step_down_is_undone() -> None:
    policy = DataAutoscaler(1, 4, 3)
    for _ in range(FULL_WINDOWS - 1):
        assert policy.decide(window(3, 1000, 0.01, fill=0.95)) is None
    down = policy.decide(window(3, 1000, 0.01, fill=0.95))
    assert down is not None and (down.count, down.rule) == (2, "queue-full")
    back = policy.decide(window(2, 800, 0.2))  # -20%: it was needed
    assert back is not None and (back.count, back.rule) == (3, "revert")
    for _ in range(FULL_WINDOWS + 2):  # the floor holds
        assert policy.decide(window(3, 1000, 0.01, fill=0.95)) is None


def test_never_leaves_its_bounds_and_ignores_windows_of_another_count() -> None:
    policy = DataAutoscaler(1, 2, 2)
    assert policy.decide(window(2, 1000, 0.9)) is None  # at max
    assert policy.decide(window(1, 1000, 0.9)) is None  # measured before a step took effect
    low = DataAutoscaler(1, 2, 1)
    for _ in range(FULL_WINDOWS + 1):
        assert low.decide(window(1, 1000, 0.0, fill=1.0)) is None  # at min


def test_a_window_between_thresholds_changes_nothing() -> None:
    policy = DataAutoscaler(0, 4, 2)
    for _ in range(5):
        assert policy.decide(window(2, 1000, 0.06, fill=0.9)) is None


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="low 2 <= start 1"):
        DataAutoscaler(2, 4, 1)
