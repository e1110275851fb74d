"""Dynamic data sharding: the master's queue of small index-range shards.

A shard holds sample indices, never data. Workers lease shards (TODO -> DOING) with a deadline
and report them done (DOING -> DONE). A shard whose worker died or whose lease expired goes
back to the *front* of TODO, so it is trained next and epochs finish in order, and resumes after
the last batch whose gradients reached every PS (``resume_from``, from the PS batch ledgers).
Each batch has a key (``BatchKeys``) that its gradient push carries. A shard whose holder died
``max_failures`` times is quarantined: never dropped silently, reported by id and sample range.
Completions are counted per shard, so "every shard done exactly once" is a fact the queue can
prove.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Container, Iterable
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
class BatchKeys:
    """Batch ``k`` of shard ``s`` (samples ``start + k * batch_size`` on) has key
    ``s * per_shard + k``: unique over the whole job, epochs included, and stable when a shard
    is resumed in the middle."""

    shard_size: int
    batch_size: int

    @property
    def per_shard(self) -> int:
        return -(-self.shard_size // self.batch_size)

    def key(self, shard: Shard, sample: int) -> int:
        """Key of the batch that begins at ``sample`` (a batch boundary of ``shard``)."""
        index, rest = divmod(sample - shard.start, self.batch_size)
        if rest or not shard.start <= sample < shard.end:
            raise ValueError(f"sample {sample} is not a batch start of shard {shard.shard_id}")
        return shard.shard_id * self.per_shard + index

    def keys(self, shard: Shard, start: int | None = None) -> range:
        """Keys of the shard's batches from ``start`` (default: its first sample) on."""
        first = shard.start if start is None else start
        lo = shard.shard_id * self.per_shard + (first - shard.start) // self.batch_size
        return range(lo, shard.shard_id * self.per_shard + -(-shard.size // self.batch_size))

    def start_of(self, shard: Shard, key: int) -> int:
        return shard.start + (key - shard.shard_id * self.per_shard) * self.batch_size


@dataclass(frozen=True)
class Lease:
    worker: str
    deadline: float
    end: int | None = None  # a slice of the shard: it ends here (straggler mitigation)


class ShardQueue:
    """TODO / DOING / DONE bookkeeping for ``epochs`` passes over ``num_samples`` samples."""

    def __init__(
        self,
        num_samples: int,
        shard_size: int,
        epochs: int = 1,
        batch_size: int | None = None,
        max_failures: int = 3,
    ) -> None:
        if num_samples <= 0:
            raise ValueError(f"num_samples must be > 0, got {num_samples}")
        if shard_size <= 0:
            raise ValueError(f"shard_size must be > 0, got {shard_size}")
        if epochs <= 0:
            raise ValueError(f"epochs must be > 0, got {epochs}")
        if batch_size is not None and batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        if max_failures <= 0:
            raise ValueError(f"max_failures must be > 0, got {max_failures}")
        self.num_samples = num_samples
        self.shard_size = shard_size
        self.epochs = epochs
        self.batch_size = batch_size or shard_size
        self.max_failures = max_failures
        self.batch_keys = BatchKeys(shard_size, self.batch_size)
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
        self._resume: dict[int, int] = {}  # shard id -> first sample still to train
        self.failures: collections.Counter[int] = collections.Counter()
        self.quarantined: set[int] = set()
        self.completions: collections.Counter[int] = collections.Counter()
        self.leases: collections.Counter[int] = collections.Counter()  # given, per shard
        self.requeues = 0

    # -- transitions -------------------------------------------------------------------------
    def lease(
        self, worker: str, now: float, lease_s: float, max_batches: int | None = None
    ) -> Shard | None:
        """Hand the next TODO shard to ``worker`` (from its resume point); None when nothing
        is left to hand out. ``max_batches``: a slow worker gets only the first batches of it
        (a slice); when it reports the slice done, the rest goes back to the front of TODO."""
        if not self._todo:
            return None
        sid = self._todo.popleft()
        self.leases[sid] += 1
        shard = self.remaining(sid)
        end = None
        if max_batches is not None and shard.start + max_batches * self.batch_size < shard.end:
            end = shard.start + max(1, max_batches) * self.batch_size
            shard = Shard(sid, shard.epoch, shard.start, end)
        self._doing[sid] = Lease(worker, now + lease_s, end)
        return shard

    def remaining(self, shard_id: int) -> Shard:
        """The part of a shard still to train: the whole shard unless it was resumed."""
        shard = self._shards[shard_id]
        start = self._resume.get(shard_id, shard.start)
        return Shard(shard_id, shard.epoch, start, shard.end) if start != shard.start else shard

    def first_key(self, shard: Shard) -> int:
        """Batch key of the first batch of ``shard`` (a whole shard or its remaining part)."""
        return self.batch_keys.key(self._shards[shard.shard_id], shard.start)

    def renew(self, worker: str, now: float, lease_s: float) -> int:
        """Extend every lease ``worker`` holds (its heartbeat); returns how many."""
        renewed = 0
        for sid, lease in self._doing.items():
            if lease.worker == worker:  # a slice stays a slice
                self._doing[sid] = Lease(worker, now + lease_s, lease.end)
                renewed += 1
        return renewed

    def complete(self, shard_id: int, worker: str) -> bool:
        """Mark a shard DONE; a report from a worker that no longer holds it is rejected."""
        lease = self._doing.get(shard_id)
        if lease is None or lease.worker != worker:
            return False
        del self._doing[shard_id]
        if lease.end is not None:  # a slice: the rest of the shard is next in line
            self._resume[shard_id] = lease.end
            self._todo.appendleft(shard_id)
            return True
        self._done.add(shard_id)
        self.completions[shard_id] += 1
        return True

    def release_worker(self, worker: str, failed: bool = False) -> list[Shard]:
        """Return a dead or removed worker's shards to the front of TODO. ``failed``: the
        worker died, which counts against the shard it was training: the first it leased (it
        leases the next one ahead, while training). A shard that reaches ``max_failures`` is
        quarantined instead of requeued (see ``quarantined_shards``)."""
        held = [sid for sid, lease in self._doing.items() if lease.worker == worker]
        if failed and held:
            training = held[0]  # leases are kept in the order they were given
            self.failures[training] += 1
            if self.failures[training] >= self.max_failures:
                del self._doing[training]
                self.quarantined.add(training)
                held = held[1:]
        return self._requeue(held)

    def expire(self, now: float) -> list[Shard]:
        """Return shards whose lease deadline has passed."""
        return self._requeue([sid for sid, lease in self._doing.items() if lease.deadline < now])

    def resume_from(self, shard_id: int, sample: int) -> None:
        """Train a TODO shard from ``sample`` on (its earlier batches reached every PS)."""
        if shard_id in self._doing or shard_id in self._done:
            raise ValueError(f"shard {shard_id} is not in TODO")
        self._check_resume(shard_id, sample)
        self._resume[shard_id] = sample

    def _check_resume(self, shard_id: int, sample: int) -> None:
        """A shard resumes at one of its batch starts (a shard with nothing left is settled)."""
        shard = self._shards[shard_id]
        if not shard.start <= sample < shard.end or (sample - shard.start) % self.batch_size:
            raise ValueError(
                f"sample {sample} is not a batch start of shard {shard_id} "
                f"[{shard.start}, {shard.end})"
            )

    def reopen(self, shard_id: int, sample: int) -> None:
        """Put a DONE shard back at the front of TODO from ``sample`` on: a PS restored from a
        checkpoint lost the updates of its batches from there."""
        if shard_id not in self._done:
            raise ValueError(f"shard {shard_id} is not done")
        self._check_resume(shard_id, sample)
        self._done.discard(shard_id)
        self.completions[shard_id] -= 1  # that completion no longer holds on every PS
        self._todo.appendleft(shard_id)
        self.resume_from(shard_id, sample)
        self.requeues += 1

    def settle(self, shard_id: int) -> None:
        """A TODO shard all of whose batches already reached every PS (its worker died after its
        last push, before reporting it) is DONE without training it again."""
        if shard_id not in self._todo:
            raise ValueError(f"shard {shard_id} is not in TODO")
        self._todo.remove(shard_id)
        self._done.add(shard_id)
        self.completions[shard_id] += 1

    def reconcile(self, shards: Iterable[Shard], applied: Container[int]) -> None:
        """Set where each given TODO or DONE shard resumes, from the batch keys ``applied`` on
        every PS: at its first batch not applied. A DONE shard missing one is reopened (a PS
        restored from a checkpoint lost it); a TODO shard missing none is settled."""
        keys = self.batch_keys
        for shard in shards:
            sid = shard.shard_id
            if sid in self.quarantined:
                continue
            static = self._shards[sid]
            missing = next((k for k in keys.keys(static) if k not in applied), None)
            if sid in self._done:
                if missing is not None:
                    self.reopen(sid, keys.start_of(static, missing))
            elif sid in self._todo:
                if missing is None:
                    self.settle(sid)
                else:
                    self.resume_from(sid, keys.start_of(static, missing))

    def expected_keys(self) -> set[int]:
        """Every batch key of every shard that is not quarantined."""
        return {
            k
            for sid, shard in self._shards.items()
            if sid not in self.quarantined
            for k in self.batch_keys.keys(shard)
        }

    def samples_in(self, applied: Container[int]) -> int:
        """How many samples the batches with keys in ``applied`` hold."""
        keys = self.batch_keys
        return sum(
            min(self.batch_size, shard.end - keys.start_of(shard, k))
            for shard in self._shards.values()
            for k in keys.keys(shard)
            if k in applied
        )

    def release_all(self) -> list[Shard]:
        """Return every leased shard to TODO (a restarted master: no lease survives it)."""
        return self._requeue(list(self._doing))

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
        return len(self._done) + len(self.quarantined) == len(self._shards)

    @property
    def total_samples(self) -> int:
        return self.num_samples * self.epochs

    @property
    def done_samples(self) -> int:
        return sum(self._shards[sid].size for sid in self._done)

    def counts(self) -> dict[str, int]:
        return {
            "todo": len(self._todo),
            "doing": len(self._doing),
            "done": len(self._done),
            "quarantined": len(self.quarantined),
        }

    def shards(self) -> list[Shard]:
        return list(self._shards.values())

    def static(self, shard_id: int) -> Shard:
        """The whole shard, wherever it resumes."""
        return self._shards[shard_id]

    def is_done(self, shard_id: int) -> bool:
        return shard_id in self._done

    def is_todo(self, shard_id: int) -> bool:
        return shard_id in self._todo

    def leased(self) -> list[int]:
        """The shards leased now."""
        return list(self._doing)

    def held_by(self, worker: str) -> list[Shard]:
        return [self._shards[s] for s, lease in self._doing.items() if lease.worker == worker]

    def quarantined_shards(self) -> list[dict[str, int]]:
        return [
            {**asdict(self._shards[sid]), "failures": self.failures[sid]}
            for sid in sorted(self.quarantined)
        ]

    def accounting(self) -> dict[str, Any]:
        """Shards trained never, once and more than once: the job's exactly-once proof."""
        once = sum(1 for sid in self._shards if self.completions[sid] == 1)
        twice = sum(1 for sid in self._shards if self.completions[sid] > 1)
        return {
            "shards": len(self._shards),
            "done_once": once,
            "done_more_than_once": twice,
            "never_done": len(self._shards) - once - twice,
            "requeued": self.requeues,
            "quarantined": self.quarantined_shards(),
        }

    # -- persistence -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "num_samples": self.num_samples,
            "shard_size": self.shard_size,
            "epochs": self.epochs,
            "batch_size": self.batch_size,
            "max_failures": self.max_failures,
            "todo": list(self._todo),
            "doing": {str(s): asdict(lease) for s, lease in self._doing.items()},
            "done": sorted(self._done),
            "resume": {str(s): n for s, n in self._resume.items()},
            "failures": {str(s): n for s, n in self.failures.items()},
            "quarantined": sorted(self.quarantined),
            "completions": {str(s): n for s, n in self.completions.items()},
            "requeues": self.requeues,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardQueue:
        queue = cls(
            data["num_samples"],
            data["shard_size"],
            data["epochs"],
            data.get("batch_size"),
            data.get("max_failures", 3),
        )
        queue._todo = collections.deque(int(s) for s in data["todo"])
        queue._doing = {int(s): Lease(**lease) for s, lease in data["doing"].items()}
        queue._done = {int(s) for s in data["done"]}
        queue._resume = {int(s): int(n) for s, n in data.get("resume", {}).items()}
        queue.failures = collections.Counter(
            {int(s): int(n) for s, n in data.get("failures", {}).items()}
        )
        queue.quarantined = {int(s) for s in data.get("quarantined", [])}
        queue.completions = collections.Counter(
            {int(s): int(n) for s, n in data["completions"].items()}
        )
        queue.requeues = int(data["requeues"])
        return queue
