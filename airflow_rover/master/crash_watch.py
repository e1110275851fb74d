"""Failures no restart can fix: the crash records nodes report before they exit, the verdict
that the same exception keeps coming back (``core.crashes``), a job left with nothing it can
train, and the words that tell the user which (``docs/fault-tolerance.md``)."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

from airflow_rover.core.crashes import Crash, Death, RepeatedFailures, Verdict
from airflow_rover.core.shards import ShardQueue

TAIL_LINES = 15
HTTP_REQUEST_LINE = " httpx HTTP Request: "  # how httpx logs each request at INFO


class CrashWatch:
    """Holds each node's crash record until its exit is seen, judges the deaths, and keeps the
    job's non-retryable ``failure`` (None while there is none) for its status."""

    def __init__(self, threshold: int) -> None:
        self.repeated = RepeatedFailures(threshold)
        self.failure: dict[str, Any] | None = None
        self._reported: dict[str, Crash] = {}
        self._shard_deaths: dict[int, str] = {}  # shard -> what last killed its worker

    def reported(self, node_id: str, crash: Crash, shard_id: int | None) -> Verdict | None:
        """``node_id`` says it is about to die of ``crash`` (``shard_id``: the shard it was
        training): counted now, not once its process is gone (a dying TensorFlow process
        took seconds to exit); the verdict if the job's failure is deterministic."""
        self._reported[node_id] = crash
        return self.repeated.record(Death(node_id, crash, shard_id))

    def take(self, node_id: str) -> Crash | None:
        """The crash record of a node that exited (None: it reported none, e.g. killed)."""
        return self._reported.pop(node_id, None)

    def died(self, crash: Crash | None, shard_id: int | None, cause: str) -> None:
        """A node's process ended (``cause``: how) while training ``shard_id``."""
        if shard_id is not None:
            self._shard_deaths[shard_id] = crash.summary() if crash is not None else cause

    def deterministic(self, verdict: Verdict, queue: ShardQueue) -> str:
        """Record the failure of ``verdict``; returns the job's message."""
        quarantined = queue.quarantined_shards()
        self.failure = {
            "kind": "deterministic",
            "retryable": False,
            "signature": verdict.signature,
            "exception": verdict.crash.summary(),
            "nodes": verdict.nodes,
            "shards": verdict.shards,
            "quarantined": quarantined,
        }
        places = [
            d.node_id if d.shard_id is None else f"{d.node_id} on {_range(queue, d.shard_id)}"
            for d in verdict.deaths
        ]
        return (
            f"deterministic failure, not retried: the same exception struck "
            f"{len(verdict.deaths)} times ({'; '.join(places)}), so no restart can fix it: "
            f"{verdict.crash.summary()}{_quarantine_note(quarantined)}; "
            f"{_progress(queue)}.\nTraceback of {verdict.deaths[-1].node_id}:\n"
            f"{_last_lines(verdict.crash.tail)}"
        )

    def nothing_left_to_train(self, queue: ShardQueue) -> str | None:
        """The job's message when every shard not trained is quarantined and none was trained
        (the job would go on to score and save an untrained model); else None."""
        counts = queue.counts()
        if counts["todo"] or counts["doing"] or not counts["quarantined"] or counts["done"]:
            return None
        quarantined = queue.quarantined_shards()
        causes = collections.Counter(
            self._shard_deaths.get(q["shard_id"], "unknown") for q in quarantined
        )
        self.failure = {
            "kind": "no_trainable_shard",
            "retryable": False,
            "exception": causes.most_common(1)[0][0],
            "quarantined": quarantined,
        }
        which = ", ".join(f"{q['shard_id']} (samples {q['start']}-{q['end']})" for q in quarantined)
        killed = "; ".join(f"{cause} ({n} shard(s))" for cause, n in causes.most_common())
        return (
            f"no trainable shard left, not retried: all {len(quarantined)} shard(s) not trained "
            f"are quarantined after repeated worker deaths and no sample was trained: {which}. "
            f"Their workers died of: {killed}"
        )


def last_words(node_id: str, crash: Crash | None, log_file: Path) -> str:
    """What a dead node said last: its exception's traceback where it reported one, else the
    last lines of its own log (not the HTTP client's request lines)."""
    if crash is not None:
        return f"Its traceback:\n{_last_lines(crash.tail)}"
    try:
        with open(log_file, errors="replace") as fh:
            own = (line for line in fh if HTTP_REQUEST_LINE not in line)
            return f"Last lines of {node_id}'s log:\n" + "".join(
                collections.deque(own, maxlen=TAIL_LINES)
            )
    except OSError:
        return "(no log)"


def _last_lines(text: str) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-TAIL_LINES:])


def _range(queue: ShardQueue, shard_id: int) -> str:
    shard = queue.static(shard_id)
    return f"shard {shard_id} (samples {shard.start}-{shard.end})"


def _quarantine_note(quarantined: list[dict[str, int]]) -> str:
    if not quarantined:
        return ""
    which = [(q["shard_id"], q["start"], q["end"]) for q in quarantined]
    return f"; {len(quarantined)} shard(s) quarantined: {which}"


def _progress(queue: ShardQueue) -> str:
    counts = queue.counts()
    return (
        f"{counts['done']} of {len(queue.shards())} shard(s) trained ({queue.done_samples} samples)"
    )
