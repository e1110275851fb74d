"""Dynamic data sharding: the master's queue of small index-range shards.

A shard holds sample indices, never data. Workers lease shards (TODO -> DOING) with a deadline
and report them done (DOING -> DONE). A shard whose worker died or whose lease expired goes
back to the *front* of TODO, so it is trained next and epochs finish in order. Completions are
counted per shard, so "every shard done exactly once" is a fact the queue can prove.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Shard:
    """Samples ``[start, end)`` of the dataset, in pass ``epoch``."""

    shard_id: int
    epoch: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Lease:
    worker: str
    deadline: float


class ShardQueue:
    """TODO / DOING / DONE bookkeeping for ``epochs`` passes over ``num_samples`` samples."""

    def __init__(self, num_samples: int, shard_size: int, epochs: int = 1) -> None:
        if num_samples <= 0:
            raise ValueError(f"num_samples must be > 0, got {num_samples}")
        if shard_size <= 0:
            raise ValueError(f"shard_size must be > 0, got {shard_size}")
        if epochs <= 0:
            raise ValueError(f"epochs must be > 0, got {epochs}")
        self.num_samples = num_samples
        self.shard_size = shard_size
        self.epochs = epochs
        per_epoch = math.ceil(num_samples / shard_size)
        self._shards: dict[int, Shard] = {}
        for epoch in range(epochs):
            for i in range(per_epoch):
                start = i * shard_size
                sid = epoch * per_epoch + i
                self._shards[sid] = Shard(sid, epoch, start, min(start + shard_size, num_samples))
        self._todo: collections.deque[int] = collections.deque(self._shards)
        self._doing: dict[int, Lease] = {}
        self._done: set[int] = set()
        self.completions: collections.Counter[int] = collections.Counter()
        self.requeues = 0

    # -- transitions -------------------------------------------------------------------------
    def lease(self, worker: str, now: float, lease_s: float) -> Shard | None:
        """Hand the next TODO shard to ``worker``; None when nothing is left to hand out."""
        if not self._todo:
            return None
        sid = self._todo.popleft()
        self._doing[sid] = Lease(worker, now + lease_s)
        return self._shards[sid]

    def renew(self, worker: str, now: float, lease_s: float) -> int:
        """Extend every lease ``worker`` holds (its heartbeat); returns how many."""
        renewed = 0
        for sid, lease in self._doing.items():
            if lease.worker == worker:
                self._doing[sid] = Lease(worker, now + lease_s)
                renewed += 1
        return renewed

    def complete(self, shard_id: int, worker: str) -> bool:
        """Mark a shard DONE; a report from a worker that no longer holds it is rejected."""
        lease = self._doing.get(shard_id)
        if lease is None or lease.worker != worker:
            return False
        del self._doing[shard_id]
        self._done.add(shard_id)
        self.completions[shard_id] += 1
        return True

    def release_worker(self, worker: str) -> list[Shard]:
        """Return a dead or removed worker's shards to the front of TODO."""
        return self._requeue([sid for sid, lease in self._doing.items() if lease.worker == worker])

    def expire(self, now: float) -> list[Shard]:
        """Return shards whose lease deadline has passed."""
        return self._requeue([sid for sid, lease in self._doing.items() if lease.deadline < now])

    def _requeue(self, shard_ids: Iterable[int]) -> list[Shard]:
        ids = sorted(shard_ids)
        for sid in ids:
            del self._doing[sid]
        self._todo.extendleft(reversed(ids))
        self.requeues += len(ids)
        return [self._shards[sid] for sid in ids]

    # -- views -------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return len(self._done) == len(self._shards)

    @property
    def total_samples(self) -> int:
        return self.num_samples * self.epochs

    @property
    def done_samples(self) -> int:
        return sum(self._shards[sid].size for sid in self._done)

    def counts(self) -> dict[str, int]:
        return {"todo": len(self._todo), "doing": len(self._doing), "done": len(self._done)}

    def held_by(self, worker: str) -> list[Shard]:
        return [self._shards[s] for s, lease in self._doing.items() if lease.worker == worker]

    def accounting(self) -> dict[str, int]:
        """Shards trained never, once and more than once: the job's exactly-once proof."""
        once = sum(1 for sid in self._shards if self.completions[sid] == 1)
        twice = sum(1 for sid in self._shards if self.completions[sid] > 1)
        return {
            "shards": len(self._shards),
            "done_once": once,
            "done_more_than_once": twice,
            "never_done": len(self._shards) - once - twice,
            "requeued": self.requeues,
        }

    # -- persistence -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "num_samples": self.num_samples,
            "shard_size": self.shard_size,
            "epochs": self.epochs,
            "todo": list(self._todo),
            "doing": {str(s): asdict(lease) for s, lease in self._doing.items()},
            "done": sorted(self._done),
            "completions": {str(s): n for s, n in self.completions.items()},
            "requeues": self.requeues,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardQueue:
        queue = cls(data["num_samples"], data["shard_size"], data["epochs"])
        queue._todo = collections.deque(int(s) for s in data["todo"])
        queue._doing = {int(s): Lease(**lease) for s, lease in data["doing"].items()}
        queue._done = {int(s) for s in data["done"]}
        queue.completions = collections.Counter(
            {int(s): int(n) for s, n in data["completions"].items()}
        )
        queue.requeues = int(data["requeues"])
        return queue
