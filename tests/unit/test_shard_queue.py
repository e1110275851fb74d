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


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_samples": 10, "shard_size": 5, "batch_size": 0}, "batch_size"),
        ({"num_samples": 10, "shard_size": 5, "max_failures": 0}, "max_failures"),
    ],
)
def test_batch_size_and_max_failures_must_be_positive(kwargs: dict, name: str) -> None:
    """The new knobs are validated like the old ones."""
    with pytest.raises(ValueError, match=rf"^{name} must be > 0, got 0"):
        ShardQueue(**kwargs)


# -- batch keys ------------------------------------------------------------------------------
def test_batch_keys_are_unique_across_shards_and_epochs() -> None:
    """Every batch of every shard of every epoch has its own key, and they tile 0..n-1 with
    gaps only after short shards (keys are per_shard apart so resuming never shifts them)."""
    queue = ShardQueue(num_samples=25, shard_size=10, epochs=3, batch_size=4)
    keys = queue.batch_keys
    assert keys.per_shard == 3  # 4 + 4 + 2 samples
    all_keys = [k for shard in queue.shards() for k in keys.keys(shard)]
    assert len(all_keys) == len(set(all_keys))
    # Shard 2 (samples 20-25) has 2 batches: key 8 (its third slot) is never used.
    assert list(keys.keys(queue.static(2))) == [6, 7]
    assert list(keys.keys(queue.static(3))) == [9, 10, 11]  # epoch 1 starts a new key range
    assert max(all_keys) == 9 * 3 - 2


def test_batch_key_and_start_of_round_trip() -> None:
    """key() of each batch start and start_of() of each key invert each other."""
    queue = ShardQueue(num_samples=100, shard_size=30, epochs=2, batch_size=7)
    keys = queue.batch_keys
    for shard in queue.shards():
        starts = list(range(shard.start, shard.end, 7))
        assert [keys.key(shard, s) for s in starts] == list(keys.keys(shard))
        assert [keys.start_of(shard, k) for k in keys.keys(shard)] == starts
        # keys(shard, start) are the keys from a batch start on, the tail of keys(shard).
        for s in starts:
            assert list(keys.keys(shard, s)) == list(keys.keys(shard))[(s - shard.start) // 7 :]


def test_short_last_batch_has_a_key_and_the_shard_end_has_none() -> None:
    """A shard of 10 samples in batches of 4 has batches at 0, 4 and 8 (2 samples)."""
    queue = ShardQueue(num_samples=10, shard_size=10, batch_size=4)
    shard = queue.static(0)
    assert list(queue.batch_keys.keys(shard)) == [0, 1, 2]
    assert queue.batch_keys.key(shard, 8) == 2
    assert queue.batch_keys.start_of(shard, 2) == 8
    for sample in (3, 9, 10, 11, -4):  # not a batch start, or outside the shard
        with pytest.raises(ValueError, match="not a batch start of shard 0"):
            queue.batch_keys.key(shard, sample)


def test_batch_size_defaults_to_one_batch_per_shard() -> None:
    """Without a batch size a shard is one batch, so keys are shard ids."""
    queue = ShardQueue(num_samples=30, shard_size=10, epochs=2)
    assert queue.batch_size == 10
    shards = _lease_all(queue, "w")
    assert [queue.first_key(s) for s in shards] == [s.shard_id for s in shards]


def test_batch_key_rejects_a_sample_before_the_shard() -> None:
    """Sample 5 is a batch start of shard 0, not of shard 1 (samples 10-20)."""
    queue = ShardQueue(num_samples=20, shard_size=10, batch_size=5)
    with pytest.raises(ValueError, match="not a batch start of shard 1"):
        queue.batch_keys.key(queue.static(1), 5)


# -- resume, reopen, settle ------------------------------------------------------------------
def test_resume_from_leases_the_rest_of_the_shard_with_its_first_key() -> None:
    """A shard resumed mid-way is leased from there, with the key of that batch."""
    queue = ShardQueue(num_samples=40, shard_size=20, batch_size=5)
    queue.resume_from(1, 30)
    assert queue.remaining(1) == Shard(1, 0, 30, 40)
    assert queue.static(1) == Shard(1, 0, 20, 40)
    assert queue.remaining(0) == queue.static(0)
    shards = _lease_all(queue, "w")
    assert shards == [Shard(0, 0, 0, 20), Shard(1, 0, 30, 40)]
    assert [queue.first_key(s) for s in shards] == [0, 6]  # shard 1: keys 4..7, resumes at 6
    # Progress counts whole shards: the resumed one counts in full once done.
    assert queue.complete(1, "w")
    assert queue.done_samples == 20


def test_resume_from_only_a_todo_shard_within_its_range() -> None:
    """A leased or done shard cannot be resumed; a sample outside the shard is refused."""
    queue = ShardQueue(num_samples=40, shard_size=10)
    queue.lease("w", 0.0, LEASE_S)
    queue.lease("w", 0.0, LEASE_S)
    assert queue.complete(1, "w")
    for sid in (0, 1):
        with pytest.raises(ValueError, match=f"shard {sid} is not in TODO"):
            queue.resume_from(sid, 5)
    for sample in (19, 30, 31):  # 30 is the shard's end: nothing left, it would be settled
        with pytest.raises(ValueError, match=f"sample {sample} is not a batch start of shard 2"):
            queue.resume_from(2, sample)
    queue.resume_from(2, 20)  # back to the start is allowed
    assert queue.remaining(2) == queue.static(2)


def test_reopen_puts_a_done_shard_at_the_front_from_the_lost_batch() -> None:
    """A PS restored from a checkpoint lost a done shard's later batches: train those again."""
    queue = ShardQueue(num_samples=30, shard_size=10, batch_size=2)
    first = queue.lease("w", 0.0, LEASE_S)
    assert first is not None and queue.complete(first.shard_id, "w")
    queue.reopen(0, 6)
    assert queue.counts() == {"todo": 3, "doing": 0, "done": 0, "quarantined": 0}
    assert queue.completions[0] == 0 and queue.accounting()["never_done"] == 3
    assert queue.requeues == 1
    again = queue.lease("w", 0.0, LEASE_S)
    assert again == Shard(0, 0, 6, 10)
    assert queue.first_key(again) == 3
    assert queue.complete(0, "w")
    # The lost completion no longer counts: the shard is done once, not twice.
    assert queue.completions[0] == 1
    assert queue.accounting()["done_once"] == 1
    assert queue.accounting()["done_more_than_once"] == 0


def test_reopen_refuses_a_shard_that_is_not_done() -> None:
    """Only DONE shards can be reopened."""
    queue = ShardQueue(num_samples=30, shard_size=10)
    queue.lease("w", 0.0, LEASE_S)
    for sid in (0, 1):  # DOING, TODO
        with pytest.raises(ValueError, match=f"shard {sid} is not done"):
            queue.reopen(sid, 0)
    assert queue.counts() == {"todo": 2, "doing": 1, "done": 0, "quarantined": 0}


def test_refused_reopen_changes_nothing() -> None:
    """A reopen with a sample outside the shard is refused and the shard stays DONE."""
    queue = ShardQueue(num_samples=30, shard_size=10)
    queue.lease("w", 0.0, LEASE_S)
    assert queue.complete(0, "w")
    before = queue.to_dict()
    with pytest.raises(ValueError, match="not a batch start of shard 0"):
        queue.reopen(0, 99)
    assert queue.to_dict() == before


def test_settle_marks_a_todo_shard_done_without_training_it() -> None:
    """A worker died after its last push but before reporting: its shard is DONE, counted once."""
    queue = ShardQueue(num_samples=20, shard_size=10)
    shard = queue.lease("w0", 0.0, LEASE_S)
    assert shard is not None
    queue.release_worker("w0", failed=True)
    queue.settle(shard.shard_id)
    assert queue.is_done(0) and not queue.is_todo(0)
    assert queue.completions[0] == 1
    assert not queue.complete(0, "w0")  # the dead worker's late report is void
    with pytest.raises(ValueError, match="shard 0 is not in TODO"):
        queue.settle(0)
    queue.lease("w1", 0.0, LEASE_S)
    with pytest.raises(ValueError, match="shard 1 is not in TODO"):
        queue.settle(1)  # leased: its holder reports it
    assert queue.complete(1, "w1")
    assert queue.finished
    assert queue.accounting()["done_once"] == 2


def test_release_all_requeues_every_lease() -> None:
    """A restarted master holds no leases: everything in flight goes back, in id order."""
    queue = ShardQueue(num_samples=50, shard_size=10)
    for worker in ("a", "b", "a"):
        queue.lease(worker, 0.0, LEASE_S)
    assert [s.shard_id for s in queue.release_all()] == [0, 1, 2]
    assert queue.counts()["doing"] == 0
    assert [s.shard_id for s in _lease_all(queue, "c")] == [0, 1, 2, 3, 4]
    assert not queue.failures  # not the shards' fault


# -- failures and quarantine -----------------------------------------------------------------
def test_failed_release_counts_against_the_shard_being_trained_only() -> None:
    """release_worker(failed=True) counts a death against the first shard the worker leased
    (the one it was training; the next is leased ahead); a removed worker counts nothing."""
    queue = ShardQueue(num_samples=40, shard_size=10)
    queue.lease("a", 0.0, LEASE_S)
    queue.lease("a", 0.0, LEASE_S)
    assert [s.shard_id for s in queue.release_worker("a", failed=True)] == [0, 1]
    queue.lease("b", 0.0, LEASE_S)
    queue.release_worker("b")
    assert dict(queue.failures) == {0: 1}
    assert queue.to_dict()["todo"][:2] == [0, 1]


def test_the_counted_shard_is_the_first_leased_not_the_lowest_id() -> None:
    """A worker that got shard 1, then shard 0 back from a dead peer, was training shard 1."""
    queue = ShardQueue(num_samples=40, shard_size=10)
    queue.lease("peer", 0.0, LEASE_S)  # 0
    queue.lease("w", 0.0, LEASE_S)  # 1
    queue.release_worker("peer")  # 0 back to the front
    assert queue.lease("w", 0.0, LEASE_S) == queue.static(0)
    queue.release_worker("w", failed=True)
    assert dict(queue.failures) == {1: 1}


def test_shard_whose_holder_dies_max_failures_times_is_quarantined() -> None:
    """The third death on the same shard quarantines it: not requeued, reported by id and
    sample range, and the queue can still finish without it. The shard leased ahead is
    requeued every time, never counted."""
    queue = ShardQueue(num_samples=25, shard_size=10, epochs=2, max_failures=3)
    for attempt in range(3):
        shard = queue.lease(f"w{attempt}", 0.0, LEASE_S)
        ahead = queue.lease(f"w{attempt}", 0.0, LEASE_S)
        assert shard is not None and ahead is not None
        assert (shard.shard_id, ahead.shard_id) == (0, 1)
        released = queue.release_worker(f"w{attempt}", failed=True)
        assert [s.shard_id for s in released] == ([0, 1] if attempt < 2 else [1])
    assert queue.quarantined == {0}
    assert queue.failures[1] == 0
    assert queue.quarantined_shards() == [
        {"shard_id": 0, "epoch": 0, "start": 0, "end": 10, "failures": 3}
    ]
    assert queue.counts() == {"todo": 5, "doing": 0, "done": 0, "quarantined": 1}
    assert not queue.complete(0, "w2")
    remaining = _lease_all(queue, "ok")
    assert [s.shard_id for s in remaining] == [1, 2, 3, 4, 5]
    for shard in remaining[:-1]:
        assert queue.complete(shard.shard_id, "ok")
    assert not queue.finished
    assert queue.complete(remaining[-1].shard_id, "ok")
    assert queue.finished  # a quarantined shard counts as finished, never as done
    assert queue.done_samples == 50 - 10
    acct = queue.accounting()
    assert (acct["done_once"], acct["never_done"]) == (5, 1)
    assert acct["quarantined"] == queue.quarantined_shards()


def test_failures_accumulate_across_different_workers() -> None:
    """A shard that kills whichever worker holds it is quarantined even with fresh workers;
    a shard released cleanly in between keeps its count."""
    queue = ShardQueue(num_samples=10, shard_size=10, max_failures=2)
    queue.lease("a", 0.0, LEASE_S)
    queue.release_worker("a", failed=True)
    queue.lease("b", 0.0, LEASE_S)
    queue.expire(now=LEASE_S + 1)  # an expiry is no death
    assert queue.failures[0] == 1 and queue.quarantined == set()
    queue.lease("c", 0.0, LEASE_S)
    queue.release_worker("c", failed=True)
    assert queue.quarantined == {0}
    assert queue.finished and queue.lease("d", 0.0, LEASE_S) is None


def test_to_dict_from_dict_keeps_resume_failures_and_quarantine() -> None:
    """A reloaded queue resumes shards at the same sample, keeps death counts and quarantine."""
    queue = ShardQueue(num_samples=60, shard_size=10, batch_size=3, max_failures=2)
    for _ in range(2):
        queue.lease("w", 0.0, LEASE_S)  # shard 0 (and then 0 again after a requeue: see below)
        queue.release_worker("w", failed=True)
    assert queue.quarantined == {0}
    queue.lease("x", 0.0, LEASE_S)  # shard 1
    queue.release_worker("x", failed=True)
    queue.resume_from(1, 16)
    queue.resume_from(3, 39)

    data = json.loads(json.dumps(queue.to_dict()))
    assert data["resume"] == {"1": 16, "3": 39}
    assert data["failures"] == {"0": 2, "1": 1}
    assert data["quarantined"] == [0]
    assert (data["batch_size"], data["max_failures"]) == (3, 2)
    copy = ShardQueue.from_dict(data)
    assert copy.to_dict() == queue.to_dict()
    assert copy.quarantined_shards() == queue.quarantined_shards()
    for q in (queue, copy):
        shards = _lease_all(q, "y")
        assert shards[:3] == [Shard(1, 0, 16, 20), Shard(2, 0, 20, 30), Shard(3, 0, 39, 40)]
        assert q.first_key(shards[0]) == 1 * 4 + 2
        q.release_worker("y", failed=True)
        assert q.quarantined == {0, 1}  # shard 1's second death


def test_from_dict_of_an_older_queue_without_the_new_fields() -> None:
    """A queue.json written before resume/failures/quarantine existed still loads."""
    queue = ShardQueue(num_samples=30, shard_size=10)
    queue.lease("w", 0.0, LEASE_S)
    data = queue.to_dict()
    for key in ("batch_size", "max_failures", "resume", "failures", "quarantined"):
        del data[key]
    copy = ShardQueue.from_dict(data)
    assert (copy.batch_size, copy.max_failures) == (10, 3)
    assert copy.counts() == {"todo": 2, "doing": 1, "done": 0, "quarantined": 0}


def test_reconcile_resumes_settles_and_reopens_from_the_applied_keys() -> None:
    """Shard 0 done but missing its last batch (a PS restored from a checkpoint): reopened there.
    Shard 1 in TODO with every batch applied: settled. Shard 2 half applied: resumes after."""
    queue = ShardQueue(num_samples=30, shard_size=10, batch_size=5)  # 2 batches per shard
    for _ in range(3):
        assert queue.lease("w", 0.0, LEASE_S) is not None
    assert queue.complete(0, "w")
    queue.release_worker("w")
    applied = {0, 2, 3, 4}  # keys: shard s batch k = 2 * s + k
    queue.reconcile(queue.shards(), applied)
    assert queue.is_todo(0) and queue.remaining(0).start == 5
    assert queue.is_done(1) and queue.completions[1] == 1
    assert queue.is_todo(2) and queue.remaining(2).start == 25
    assert queue.samples_in(applied) == 20
    assert queue.expected_keys() == set(range(6))


def test_batch_accounting_compares_every_ps_ledger_with_the_expected_keys() -> None:
    from airflow_rover.core.ledger import batch_accounting

    ledgers = [({0, 1, 2, 3}, 2), ({0, 1, 2}, 0)]
    assert batch_accounting({0, 1, 2, 3, 4}, ledgers) == {
        "expected": 5,
        "trained_once": 3,
        "never_trained": 1,
        "partially_trained": 1,
        "retried_pushes_turned_away": 2,
    }
