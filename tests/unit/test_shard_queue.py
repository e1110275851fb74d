"""ShardQueue: the master's TODO / DOING / DONE bookkeeping and its exactly-once accounting."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from airflow_rover.core.shards import Shard, ShardQueue

LEASE_S = 10.0


def _roundtrip(queue: ShardQueue) -> ShardQueue:
    """Persist and reload a queue the way the master would (through JSON)."""
    return ShardQueue.from_dict(json.loads(json.dumps(queue.to_dict())))


def _lease_all(queue: ShardQueue, worker: str, now: float = 0.0) -> list[Shard]:
    shards = []
    while (shard := queue.lease(worker, now, LEASE_S)) is not None:
        shards.append(shard)
    return shards


def test_shards_cover_each_epoch_in_order() -> None:
    """Shards are handed out in id order, epoch by epoch; the last shard of an epoch is short."""
    queue = ShardQueue(num_samples=25, shard_size=10, epochs=2)
    shards = _lease_all(queue, "w0")
    assert [(s.shard_id, s.epoch, s.start, s.end) for s in shards] == [
        (0, 0, 0, 10),
        (1, 0, 10, 20),
        (2, 0, 20, 25),
        (3, 1, 0, 10),
        (4, 1, 10, 20),
        (5, 1, 20, 25),
    ]
    assert [s.size for s in shards] == [10, 10, 5, 10, 10, 5]
    assert queue.lease("w0", 0.0, LEASE_S) is None


def test_every_shard_is_leased_once_across_epochs_and_workers() -> None:
    """Alternating workers never receive the same shard twice while nothing is requeued."""
    queue = ShardQueue(num_samples=1000, shard_size=64, epochs=3)
    seen: list[int] = []
    workers = ["w0", "w1", "w2"]
    i = 0
    while (shard := queue.lease(workers[i % 3], 0.0, LEASE_S)) is not None:
        seen.append(shard.shard_id)
        i += 1
    per_epoch = -(-1000 // 64)
    assert sorted(seen) == list(range(3 * per_epoch))
    assert len(set(seen)) == len(seen)
    assert queue.counts() == {"todo": 0, "doing": 3 * per_epoch, "done": 0, "quarantined": 0}


def test_complete_only_by_the_holder() -> None:
    """A completion from a worker that does not hold the shard is rejected and changes nothing."""
    queue = ShardQueue(num_samples=30, shard_size=10)
    shard = queue.lease("w0", 0.0, LEASE_S)
    assert shard is not None
    assert not queue.complete(shard.shard_id, "w1")
    assert queue.counts() == {"todo": 2, "doing": 1, "done": 0, "quarantined": 0}
    assert queue.complete(shard.shard_id, "w0")
    # A repeated report (the holder retrying, or anyone else) is no longer accepted.
    assert not queue.complete(shard.shard_id, "w0")
    assert not queue.complete(shard.shard_id, "w1")
    # A shard never leased, or an id that does not exist, cannot be completed.
    assert not queue.complete(1, "w0")
    assert not queue.complete(999, "w0")
    assert queue.completions[shard.shard_id] == 1
    assert queue.counts() == {"todo": 2, "doing": 0, "done": 1, "quarantined": 0}


def test_stale_completion_after_requeue_is_rejected() -> None:
    """Once a dead worker's shard went to someone else, the dead worker's late report is void."""
    queue = ShardQueue(num_samples=30, shard_size=10)
    first = queue.lease("w0", 0.0, LEASE_S)
    assert first is not None
    assert queue.release_worker("w0") == [first]
    again = queue.lease("w1", 1.0, LEASE_S)
    assert again == first
    assert not queue.complete(first.shard_id, "w0")
    assert queue.complete(first.shard_id, "w1")
    assert queue.completions[first.shard_id] == 1


def test_release_worker_requeues_at_front_in_id_order() -> None:
    """A removed worker's shards go back to the FRONT of TODO, lowest id first."""
    queue = ShardQueue(num_samples=100, shard_size=10)
    a = [queue.lease(w, 0.0, LEASE_S) for w in ("w0", "w1", "w0", "w1", "w0")]
    assert [s.shard_id for s in a if s] == [0, 1, 2, 3, 4]
    released = queue.release_worker("w0")
    assert [s.shard_id for s in released] == [0, 2, 4]
    assert queue.held_by("w0") == []
    assert [s.shard_id for s in queue.held_by("w1")] == [1, 3]
    assert queue.requeues == 3
    order = [s.shard_id for s in _lease_all(queue, "w2")]
    assert order == [0, 2, 4, 5, 6, 7, 8, 9]
    assert queue.release_worker("nobody") == []


def test_second_release_goes_before_the_first() -> None:
    """Each requeue is put in front of what is already waiting, in id order."""
    queue = ShardQueue(num_samples=100, shard_size=10)
    for w in ("a", "b", "a", "b"):
        queue.lease(w, 0.0, LEASE_S)
    queue.release_worker("b")  # 1, 3
    queue.release_worker("a")  # 0, 2
    assert [s.shard_id for s in _lease_all(queue, "c")][:6] == [0, 2, 1, 3, 4, 5]


def test_expire_after_deadline_only() -> None:
    """expire() returns shards whose deadline has passed (strictly), and requeues them."""
    queue = ShardQueue(num_samples=30, shard_size=10)
    s0 = queue.lease("w0", now=0.0, lease_s=5.0)
    s1 = queue.lease("w1", now=2.0, lease_s=5.0)
    assert s0 is not None and s1 is not None
    assert queue.expire(now=4.9) == []
    assert queue.expire(now=5.0) == []  # exactly at the deadline: still valid
    assert queue.expire(now=5.5) == [s0]
    assert queue.counts() == {"todo": 2, "doing": 1, "done": 0, "quarantined": 0}
    assert not queue.complete(s0.shard_id, "w0")
    assert queue.expire(now=100.0) == [s1]
    assert queue.requeues == 2
    # Each expiry goes to the front: the latest requeue first, all before never-leased shard 2.
    assert [s.shard_id for s in _lease_all(queue, "w2", now=100.0)] == [1, 0, 2]


def test_renew_extends_only_the_callers_leases() -> None:
    """A heartbeat renews every lease of its worker and no one else's."""
    queue = ShardQueue(num_samples=40, shard_size=10)
    queue.lease("w0", 0.0, 5.0)
    queue.lease("w0", 0.0, 5.0)
    queue.lease("w1", 0.0, 5.0)
    assert queue.renew("w0", now=4.0, lease_s=5.0) == 2
    assert queue.renew("ghost", now=4.0, lease_s=5.0) == 0
    expired = queue.expire(now=6.0)
    assert [s.shard_id for s in expired] == [2]
    assert [s.shard_id for s in queue.held_by("w0")] == [0, 1]
    assert [s.shard_id for s in queue.expire(now=9.5)] == [0, 1]


def test_finished_done_samples_and_counts() -> None:
    """Progress views follow completions; finished only when every shard of every epoch is done."""
    queue = ShardQueue(num_samples=25, shard_size=10, epochs=2)
    assert queue.total_samples == 50
    assert queue.done_samples == 0
    assert not queue.finished
    shards = _lease_all(queue, "w0")
    for shard in shards[:-1]:
        assert queue.complete(shard.shard_id, "w0")
    assert queue.done_samples == 45
    assert queue.counts() == {"todo": 0, "doing": 1, "done": 5, "quarantined": 0}
    assert not queue.finished
    assert queue.complete(shards[-1].shard_id, "w0")
    assert queue.finished
    assert queue.done_samples == queue.total_samples == 50


def test_accounting_exactly_once_with_requeues() -> None:
    """After a full run with expiries and removed workers, every shard was done exactly once."""
    queue = ShardQueue(num_samples=500, shard_size=32, epochs=2)
    n = len(queue.to_dict()["todo"])
    now = 0.0
    queue.lease("dead", now, LEASE_S)
    queue.lease("dead", now, LEASE_S)
    queue.release_worker("dead")
    queue.lease("slow", now, 1.0)
    queue.expire(now + 2.0)
    while not queue.finished:
        now += 1.0
        shard = queue.lease("w", now, LEASE_S)
        assert shard is not None
        assert queue.complete(shard.shard_id, "w")
    assert queue.accounting() == {
        "shards": n,
        "done_once": n,
        "done_more_than_once": 0,
        "never_done": 0,
        "requeued": 3,
        "quarantined": [],
    }


def test_accounting_before_any_work() -> None:
    """A fresh queue reports every shard as never done."""
    queue = ShardQueue(num_samples=10, shard_size=3)
    assert queue.accounting() == {
        "shards": 4,
        "done_once": 0,
        "done_more_than_once": 0,
        "never_done": 4,
        "requeued": 0,
        "quarantined": [],
    }


def test_to_dict_from_dict_preserves_behaviour() -> None:
    """A reloaded queue has the same TODO order, leases, deadlines, completions and counters."""
    queue = ShardQueue(num_samples=100, shard_size=10, epochs=2)
    for w in ("a", "b", "a", "c"):
        queue.lease(w, 0.0, 5.0)
    queue.lease("b", 0.0, 50.0)
    assert queue.complete(1, "b")
    queue.release_worker("c")  # shard 3 back to the front
    queue.renew("a", 1.0, 5.0)

    copy = _roundtrip(queue)
    assert copy.to_dict() == queue.to_dict()
    assert copy.counts() == queue.counts()
    assert copy.accounting() == queue.accounting()
    assert copy.done_samples == queue.done_samples
    # Same future: a stale completion is rejected, expiries and lease order agree.
    for q in (queue, copy):
        assert not q.complete(0, "b")
        assert [s.shard_id for s in q.expire(now=10.0)] == [0, 2]
        assert [s.shard_id for s in q.held_by("b")] == [4]
        assert q.complete(4, "b")
        assert [s.shard_id for s in _lease_all(q, "z", now=10.0)][:4] == [0, 2, 3, 5]
    assert copy.to_dict() == queue.to_dict()


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_samples": 0, "shard_size": 1}, "num_samples"),
        ({"num_samples": -5, "shard_size": 1}, "num_samples"),
        ({"num_samples": 10, "shard_size": 0}, "shard_size"),
        ({"num_samples": 10, "shard_size": -1}, "shard_size"),
        ({"num_samples": 10, "shard_size": 1, "epochs": 0}, "epochs"),
    ],
)
def test_constructor_errors_name_the_parameter(kwargs: dict, name: str) -> None:
    """Bad sizes are rejected with a message naming the offending parameter and its value."""
    with pytest.raises(ValueError, match=rf"^{name} must be > 0, got -?\d+"):
        ShardQueue(**kwargs)


def _check_invariants(queue: ShardQueue) -> None:
    state = queue.to_dict()
    todo, doing, done = state["todo"], set(map(int, state["doing"])), set(state["done"])
    assert len(todo) == len(set(todo))
    assert not (set(todo) & doing) and not (set(todo) & done) and not (doing & done)
    assert len(todo) + len(doing) + len(done) == queue.accounting()["shards"]


def _random_run(rng: random.Random) -> None:
    num_samples = rng.randint(1, 400)
    shard_size = rng.randint(1, 60)
    epochs = rng.randint(1, 3)
    queue = ShardQueue(num_samples, shard_size, epochs)
    workers = [f"w{i}" for i in range(rng.randint(1, 4))]
    now = 0.0
    covered: dict[int, list[tuple[int, int]]] = {e: [] for e in range(epochs)}
    accepted = 0
    for _ in range(rng.randint(0, 200)):
        now += rng.random()
        op = rng.random()
        if op < 0.35:
            queue.lease(rng.choice(workers), now, rng.uniform(0.5, 5.0))
        elif op < 0.7:
            doing = queue.to_dict()["doing"]
            if doing:
                sid = int(rng.choice(sorted(doing)))
                holder = doing[str(sid)]["worker"]
                worker = holder if rng.random() < 0.8 else rng.choice(workers)
                shard = next(s for s in queue.held_by(holder) if s.shard_id == sid)
                if queue.complete(sid, worker):
                    assert worker == holder
                    covered[shard.epoch].append((shard.start, shard.end))
                    accepted += 1
                else:
                    assert worker != holder
        elif op < 0.8:
            queue.release_worker(rng.choice(workers))
        elif op < 0.9:
            queue.expire(now)
        elif op < 0.97:
            queue.renew(rng.choice(workers), now, rng.uniform(0.5, 5.0))
        else:
            queue = _roundtrip(queue)
        _check_invariants(queue)
    # Drain: whatever is left in flight comes back and gets trained.
    now += 1e6
    queue.expire(now)
    while not queue.finished:
        worker = rng.choice(workers)
        shard = queue.lease(worker, now, 1.0)
        assert shard is not None
        assert queue.complete(shard.shard_id, worker)
        covered[shard.epoch].append((shard.start, shard.end))
        accepted += 1

    acct = queue.accounting()
    assert acct["done_once"] == acct["shards"] == accepted
    assert acct["never_done"] == 0 and acct["done_more_than_once"] == 0
    assert all(queue.completions[sid] == 1 for sid in range(acct["shards"]))
    assert queue.done_samples == num_samples * epochs
    for ranges in covered.values():
        ranges.sort()
        assert ranges[0][0] == 0 and ranges[-1][1] == num_samples
        for (_, end), (start, _) in itertools.pairwise(ranges):
            assert end == start  # contiguous, no overlap, no gap
    assert sum(e - s for r in covered.values() for s, e in r) == num_samples * epochs


def test_random_interleavings_complete_every_shard_exactly_once() -> None:
    """Any interleaving of lease/complete/release/expire/renew/reload trains each sample once."""
    rng = random.Random(20240611)
    for _ in range(400):
        _random_run(rng)
