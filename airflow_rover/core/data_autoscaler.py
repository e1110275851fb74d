"""How many data workers a job runs: GoldMiner's job-level policy (its §3.4.1), driven by what
the trainers wait for.

The state of the trainers' input queue says who is slower: trainers that wait for their next
batch (enqueue slower than dequeue) would train faster with another data worker; a queue that
stays full with trainers never waiting has data workers to spare. The policy assumes the next
step speeds the job up as the last did (data workers are data-parallel, nothing synchronises
them) and corrects itself from what it measures: a step up that did not raise the trainers'
samples/s by ``MIN_GAIN`` is taken back and sets a ceiling (sublinear speedup: the cores or the
trainers are the bottleneck now); a step down that cost more than ``MIN_GAIN`` is taken back and
sets a floor. A step up that gained under ``MIN_GAIN`` is kept when it left the trainers waiting
no more than ``WAIT_HIGH`` at no real cost (lost under ``MIN_GAIN``, as a step down may):
that is GoldMiner's ideal queue state, where it stops scaling. The first window after a change
is left out (the trainers' queues refill, a new data worker reads its first shard); a step is
then judged by the mean of ``JUDGE_WINDOWS`` windows after it against as many before it: one
window's rate swings by more than ``MIN_GAIN`` on a busy machine. With ``low`` 0 the trainers
prepare their input themselves, GoldMiner's fallback when data workers do not pay, for good. A
ceiling of one or more is probed again after ``REPROBE_WINDOWS`` windows in which the trainers
still waited, since the job's neighbours on the machine change.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

WAIT_HIGH = 0.10  # trainers that wait for input this much of the time need more data workers
WAIT_LOW = 0.03  # ... and this little, with a full queue, have some to spare
FILL_FULL = 0.8  # a queue of ready batches this full (mean over the window) is full
FULL_WINDOWS = 2  # windows in a row the queue must stay full before a step down
MIN_GAIN = 0.05  # a step must change samples/s by this fraction to count
JUDGE_WINDOWS = 3  # a step is judged by the mean of this many windows after it (and before)
REPROBE_WINDOWS = 10


@dataclass(frozen=True)
class InputWindow:
    """What the trainers saw over one interval in which ``data_workers`` served throughout."""

    at: float
    data_workers: int
    samples_per_s: float
    input_wait: float  # fraction of the trainers' time spent waiting for their next batch
    ready_fill: float  # mean fill of their queues of ready batches, 0..1


@dataclass(frozen=True)
class DataWorkerDecision:
    """A change of the number of data workers, and why."""

    at: float
    count: int
    previous: int
    rule: str  # input-wait, queue-full, revert, reprobe
    reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class DataAutoscaler:
    """One step at a time within ``[low, high]``, each judged by the windows after it."""

    def __init__(self, low: int, high: int, start: int) -> None:
        if not 0 <= low <= start <= high:
            raise ValueError(f"data workers: need 0 <= low {low} <= start {start} <= high {high}")
        self.low, self.high = low, high
        self.count = start
        self.ceiling, self.floor = high, low
        self._recent: list[InputWindow] = []  # the last windows at this count, oldest first
        self._before: list[InputWindow] | None = None  # windows before the step being judged
        self._after: list[InputWindow] = []  # ... and after it, so far
        self._full = 0  # windows in a row with a full queue and trainers not waiting
        self._capped = 0  # windows in a row waiting at the ceiling
        self.budget_cap: int | None = None  # the most a shared cluster budget leaves room for
        self._settling = False  # the first window after a change is not measured

    def decide(self, window: InputWindow) -> DataWorkerDecision | None:
        """The next count after ``window``, or None to keep it. A window measured with another
        count than the current one (a step not yet in effect) is ignored."""
        if window.data_workers != self.count:
            return None
        if self._settling:  # the queues refill, a new data worker reads its first shard
            self._settling = False
            return None
        if self._before is not None:
            self._after.append(window)
            return self._judge() if len(self._after) >= JUDGE_WINDOWS else None
        self._recent = [*self._recent, window][-JUDGE_WINDOWS:]
        if window.input_wait > WAIT_HIGH:
            self._full = 0
            return self._step_up(window)
        self._capped = 0
        if window.input_wait < WAIT_LOW and window.ready_fill >= FILL_FULL:
            self._full += 1
            if self._full >= FULL_WINDOWS and self.count > self.floor:
                self._full = 0
                return self._step(
                    window,
                    -1,
                    "queue-full",
                    f"the trainers waited {window.input_wait:.0%} of the time with their ready "
                    f"queues {window.ready_fill:.0%} full: trying one data worker fewer",
                )
        else:
            self._full = 0
        return None

    def _step_up(self, window: InputWindow) -> DataWorkerDecision | None:
        waited = f"the trainers waited {window.input_wait:.0%} of the time for input"
        if self.budget_cap is not None and self.count >= self.budget_cap:
            return None  # no room in the cluster budget: the status says so
        if self.count < self.ceiling:
            self._capped = 0
            return self._step(window, +1, "input-wait", f"{waited}: adding a data worker")
        self._capped += 1
        if 0 < self.ceiling < self.high and self._capped >= REPROBE_WINDOWS:
            self._capped = 0
            self.ceiling += 1
            return self._step(
                window,
                +1,
                "reprobe",
                f"{waited} for {REPROBE_WINDOWS} windows at the ceiling: trying again",
            )
        return None

    def _step(self, window: InputWindow, delta: int, rule: str, reason: str) -> DataWorkerDecision:
        previous = self.count
        self.count += delta
        self._before, self._after, self._recent = self._recent or [window], [], []
        self._settling = True
        return DataWorkerDecision(window.at, self.count, previous, rule, reason)

    def _judge(self) -> DataWorkerDecision | None:
        """Keep the last step, or take it back and remember the bound it found."""
        before, after = self._before, self._after
        assert before is not None and after
        self._before, self._after, self._recent = None, [], after
        window = after[-1]
        rate_before = sum(w.samples_per_s for w in before) / len(before)
        rate_after = sum(w.samples_per_s for w in after) / len(after)
        if rate_before <= 0:
            return None
        gain = rate_after / rate_before - 1
        went_up = window.data_workers > before[-1].data_workers
        speeds = (
            f"{before[-1].data_workers} -> {window.data_workers} data workers: "
            f"{rate_before:,.0f} -> {rate_after:,.0f} samples/s ({gain:+.0%}, mean of "
            f"{len(before)} and {len(after)} windows)"
        )
        waits = sum(w.input_wait for w in after) / len(after)
        if went_up and gain < MIN_GAIN and waits <= WAIT_HIGH and gain > -MIN_GAIN:
            return None  # GoldMiner's ideal state: the trainers hardly wait, at no real cost
        if went_up and gain < MIN_GAIN:
            self.ceiling = before[-1].data_workers
            return self._revert(window, before, f"{speeds}; back, no more than {self.ceiling}")
        if not went_up and gain < -MIN_GAIN:
            self.floor = before[-1].data_workers
            return self._revert(window, before, f"{speeds}; back, no fewer than {self.floor}")
        return None

    def _revert(
        self, window: InputWindow, before: list[InputWindow], reason: str
    ) -> DataWorkerDecision:
        previous, self.count = self.count, before[-1].data_workers
        self._recent, self._settling = [], True
        return DataWorkerDecision(window.at, self.count, previous, "revert", reason)
