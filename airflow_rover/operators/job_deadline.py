"""How long the training task stays deferred on its job: until the job's deadline, and a grace.

The master stops the job at its deadline and the trigger's event says so. Airflow's deferral
timeout is only the backstop behind that: it fails the task without calling the operator or the
trigger's ``on_kill``, so it stops nothing and says nothing of the deadline. It therefore falls
after the deadline, late enough for the trigger to see the master's stop first.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow_rover.core.deadline import JobDeadline

DEADLINE_GRACE = timedelta(minutes=1)
GRACE_POLLS = 3  # the trigger sees the stop within a poll; three leave room for a slow one


def deferral_timeout(
    deadline: JobDeadline | None,
    max_runtime: timedelta,
    poll_interval: float,
    now: datetime | None = None,
) -> timedelta:
    """The time left to ``deadline`` plus a grace (a minute, or ``GRACE_POLLS`` polls if that
    is longer); a job without a deadline gets ``max_runtime``."""
    if deadline is None:
        return max_runtime
    grace = max(DEADLINE_GRACE, timedelta(seconds=GRACE_POLLS * poll_interval))
    return max(deadline.remaining(now), timedelta(0)) + grace
