"""GoldMiner's job-level policy for the number of data workers (``core.data_autoscaler``)."""

from __future__ import annotations

import pytest

from airflow_rover.core.data_autoscaler import (
    FULL_WINDOWS,
    JUDGE_WINDOWS,
    REPROBE_WINDOWS,
    DataAutoscaler,
    DataWorkerDecision,
    InputWindow,
)


def window(count: int, rate: float, wait: float, fill: float = 0.5, at: float = 0.0) -> InputWindow:
    return InputWindow(at, count, rate, wait, fill)


def judged(policy: DataAutoscaler, *windows: InputWindow) -> DataWorkerDecision | None:
    """Feed ``windows`` (``JUDGE_WINDOWS`` of them after a step), after a first window that
    is left out (it reads 0 samples/s here: were it counted, every step would be undone): no
    decision until the last, which gives the judgement."""
    assert len(windows) == JUDGE_WINDOWS
    settled(policy, windows[0].data_workers)
    for w in windows[:-1]:
        assert policy.decide(w) is None
    return policy.decide(windows[-1])


def settled(policy: DataAutoscaler, count: int) -> None:
    """The window left out after a change."""
    assert policy.decide(window(count, 0.0, 0.9)) is None


def test_steps_up_while_the_trainers_wait_and_each_step_pays() -> None:
    policy = DataAutoscaler(0, 4, 0)
    up = policy.decide(window(0, 1000, 0.5))
    assert up is not None and (up.previous, up.count, up.rule) == (0, 1, "input-wait")
    assert "50%" in up.reason
    assert judged(policy, *[window(1, 1800, 0.3)] * JUDGE_WINDOWS) is None  # judged: kept
    up = policy.decide(window(1, 1800, 0.3))
    assert up is not None and up.count == 2


def test_a_step_up_that_does_not_pay_is_taken_back_and_caps_the_count() -> None:
    policy = DataAutoscaler(0, 4, 1)
    assert policy.decide(window(1, 1000, 0.4)).count == 2  # type: ignore[union-attr]
    back = judged(policy, *[window(2, 1020, 0.35)] * JUDGE_WINDOWS)  # +2%: the cores are full
    assert back is not None and (back.previous, back.count, back.rule) == (2, 1, "revert")
    assert "+2%" in back.reason and "no more than 1" in back.reason
    settled(policy, 1)
    for _ in range(REPROBE_WINDOWS - 1):  # still waiting, but capped
        assert policy.decide(window(1, 1000, 0.4)) is None
    again = policy.decide(window(1, 1000, 0.4))
    assert again is not None and (again.count, again.rule) == (2, "reprobe")


def test_falls_back_to_the_trainers_when_data_workers_do_not_pay() -> None:
    policy = DataAutoscaler(0, 3, 0)
    assert policy.decide(window(0, 1000, 0.2)).count == 1  # type: ignore[union-attr]
    back = judged(policy, *[window(1, 900, 0.1)] * JUDGE_WINDOWS)
    assert back is not None and back.count == 0


def test_a_full_queue_with_idle_waits_steps_down_and_a_costly_step_down_is_undone() -> None:
    policy = DataAutoscaler(1, 4, 3)
    for _ in range(FULL_WINDOWS - 1):
        assert policy.decide(window(3, 1000, 0.01, fill=0.95)) is None
    down = policy.decide(window(3, 1000, 0.01, fill=0.95))
    assert down is not None and (down.count, down.rule) == (2, "queue-full")
    back = judged(policy, *[window(2, 800, 0.2)] * JUDGE_WINDOWS)  # -20%: it was needed
    assert back is not None and (back.count, back.rule) == (3, "revert")
    settled(policy, 3)
    for _ in range(FULL_WINDOWS + 2):  # the floor holds
        assert policy.decide(window(3, 1000, 0.01, fill=0.95)) is None


def test_a_step_is_judged_by_the_mean_of_windows_not_one_noisy_window() -> None:
    """One window's rate on a busy machine swings by more than MIN_GAIN (4-s windows of one
    fixed count measured 13.5k-17.5k samples/s in bench/data_workers.py): a step that pays is
    kept though the first window after it reads slower than the one before."""
    policy = DataAutoscaler(0, 4, 1)
    assert policy.decide(window(1, 500, 0.5)) is not None  # 1 -> 2
    assert judged(policy, *[window(2, rate, 0.3) for rate in (1100, 900, 1100)]) is None
    step = policy.decide(window(2, 1000, 0.3))  # judged against 900, 1100, 1000: a mean of 1000
    assert step is not None and step.count == 3
    after = [window(3, rate, 0.2) for rate in (950, 1300, 1250)]  # first -5%, mean +17%
    assert judged(policy, *after) is None  # kept
    assert policy.count == 3 and policy.ceiling == 4


def test_a_step_that_does_not_pay_on_average_is_taken_back() -> None:
    policy = DataAutoscaler(0, 4, 2)
    policy.decide(window(2, 1000, 0.3))
    after = [window(3, rate, 0.2) for rate in (1200, 900, 930)]  # first +20%, mean +1%
    back = judged(policy, *after)
    assert back is not None and (back.count, back.rule) == (2, "revert")
    assert "+1%" in back.reason and "mean of 1 and 3 windows" in back.reason


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


def test_a_step_that_ends_the_waiting_at_no_cost_is_kept() -> None:
    """GoldMiner stops at the ideal queue state: trainers that hardly wait. A step up that
    brought the wait under WAIT_HIGH is kept though it gained under MIN_GAIN, unless it cost
    MIN_GAIN or more (what a step down may cost, too)."""
    policy = DataAutoscaler(0, 4, 2)
    policy.decide(window(2, 14_000, 0.19))
    assert judged(policy, *[window(3, 13_720, 0.09)] * JUDGE_WINDOWS) is None  # -2%, 9%: kept
    assert policy.count == 3
    costly = DataAutoscaler(0, 4, 2)
    costly.decide(window(2, 14_000, 0.19))
    back = judged(costly, *[window(3, 13_100, 0.08)] * JUDGE_WINDOWS)  # -6%
    assert back is not None and (back.count, back.rule) == (2, "revert")


def test_a_fallback_to_the_trainers_is_for_good() -> None:
    """Data workers that did not pay at all (a ceiling of 0) are not tried again: each try
    costs the windows it is judged by."""
    policy = DataAutoscaler(0, 3, 0)
    assert policy.decide(window(0, 15_000, 0.55)).count == 1  # type: ignore[union-attr]
    back = judged(policy, *[window(1, 7_000, 0.7)] * JUDGE_WINDOWS)
    assert back is not None and back.count == 0 and policy.ceiling == 0
    for _ in range(3 * REPROBE_WINDOWS):
        assert policy.decide(window(0, 15_000, 0.55)) is None
