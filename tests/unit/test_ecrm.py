"""ECRM: placement, codecs, difference propagation and the chunked rebuild, against a
simulated cluster where parity messages arrive in random order and training never stops."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from airflow_rover.core.ecrm import (
    DifferencePropagator,
    ParityDelta,
    ParityPlacement,
    ParityStore,
    RebuildPlan,
    RowStatus,
    SumCodec,
    UpdateBuffer,
    XorCodec,
    catch_up,
    encode_members,
    make_codec,
    plan_decode,
    plan_encode,
    restrict,
    rows_to_rebuild,
)
from airflow_rover.core.hashing import initial_rows, partition_of
from airflow_rover.core.training_optimizers import Optimizer

DIMS = {"dim4": 4, "dim1": 1}
VOCAB = {"dim4": 47, "dim1": 29}
SEED = 7


def make_initial(opt: Optimizer):
    """Seeded initial rows and fresh optimizer state, as a PS creates them lazily."""

    def initial(table: str, ids: np.ndarray) -> dict[str, np.ndarray]:
        dim = DIMS[table]
        out = {"row": initial_rows(table, ids, dim, SEED, 0.05)}
        for key, value in opt.init_state((ids.size, dim), rows=True).items():
            out[f"state/{key}"] = value
        return out

    return initial


# ----------------------------------------------------------------------------- the cluster


class SimPS:
    """One PS: its rows (all of its ids, created eagerly with their initial values), the
    parity it holds, its outgoing channels and the updates it holds back."""

    def __init__(self, index, placement, codec, opt, initial, epoch=0, blank=False):
        self.index = index
        self.opt = opt
        self.ids = {t: placement.ids_on(t, index) for t in placement.tables}
        self.values = {}
        for t, ids in self.ids.items():
            fields = initial(t, ids)
            if blank:  # a replacement: nothing until decoded
                fields = {n: np.full_like(v, np.nan) for n, v in fields.items()}
            self.values[t] = fields
        # Fields as of the last difference its holder applied: what a decode must give back.
        self.acked = {
            t: {n: v.copy() for n, v in initial(t, ids).items()} for t, ids in self.ids.items()
        }
        self.store = ParityStore(placement, index, codec, initial, epoch)
        self.prop = DifferencePropagator(placement, index, codec, epoch)
        self.buffer = UpdateBuffer()

    def pos(self, table, ids):
        return np.searchsorted(self.ids[table], ids)

    def read(self, table, ids):
        p = self.pos(table, ids)
        return {n: v[p].copy() for n, v in self.values[table].items()}

    def write(self, table, ids, fields):
        p = self.pos(table, ids)
        for n, v in self.values[table].items():
            v[p] = fields[n]

    def apply_now(self, table, ids, grads):
        old = self.read(table, ids)
        rows = old["row"].copy()
        state = {n[6:]: v.copy() for n, v in old.items() if n.startswith("state/")}
        self.opt.apply(rows, state, grads)
        new = {"row": rows, **{f"state/{k}": v for k, v in state.items()}}
        assert np.isfinite(rows).all(), "an update reached a row that was not rebuilt"
        self.write(table, ids, new)
        return self.prop.deltas({table: (ids, old, new)}), new


class Cluster:
    def __init__(self, num_ps, k, codec, opt, seed):
        self.placement = ParityPlacement(num_ps, k, VOCAB)
        self.codec = codec
        self.opt = opt
        self.initial = make_initial(opt)
        self.rng = np.random.default_rng(seed)
        self.ps = [SimPS(i, self.placement, codec, opt, self.initial) for i in range(num_ps)]
        self.channels: dict[tuple[int, int], deque[tuple[ParityDelta, dict]]] = {}
        self.outcomes = {"applied": 0, "duplicate": 0, "fenced": 0}

    def send(self, deltas, news):
        for d in deltas:
            new = {}
            for part in d.tables:
                sel = np.searchsorted(news[part.table][0], part.ids)
                new[part.table] = (part.ids, {n: v[sel] for n, v in news[part.table][1].items()})
            self.channels.setdefault((d.source, d.holder), deque()).append((d, new))

    def push(self, ps_index, table, ids, grads):
        """A worker's push: applied now unless locked (then held back)."""
        ps = self.ps[ps_index]
        ids_now, payload = ps.buffer.admit(table, ids, {"grad": grads})
        if ids_now.size:
            deltas, new = ps.apply_now(table, ids_now, payload["grad"])
            self.send(deltas, {table: (ids_now, new)})

    def apply_held(self, ps_index, table, held):
        ps = self.ps[ps_index]
        for ids, payload in held:
            deltas, new = ps.apply_now(table, ids, payload["grad"])
            self.send(deltas, {table: (ids, new)})

    def random_push(self):
        ps = int(self.rng.integers(len(self.ps)))
        table = str(self.rng.choice(list(VOCAB)))
        mine = self.ps[ps].ids[table]
        if mine.size == 0:
            return
        n = int(self.rng.integers(1, min(6, mine.size) + 1))
        ids = np.sort(self.rng.choice(mine, size=n, replace=False))
        grads = self.rng.normal(0, 0.1, size=(n, DIMS[table])).astype(np.float32)
        self.push(ps, table, ids, grads)

    def deliver_one(self):
        live = [key for key, q in self.channels.items() if q]
        if not live:
            return False
        key = live[int(self.rng.integers(len(live)))]
        delta, new = self.channels[key].popleft()
        outcome = self.ps[delta.holder].store.apply(delta)
        self.outcomes[outcome] += 1
        if outcome == "applied":
            src = self.ps[delta.source]
            for table, (ids, fields) in new.items():
                p = src.pos(table, ids)
                for n, v in src.acked[table].items():
                    v[p] = fields[n]
        if outcome == "applied" and self.rng.random() < 0.05:  # a retransmission
            assert self.ps[delta.holder].store.apply(delta) == "duplicate"
            self.outcomes["duplicate"] += 1
        return True

    def steps(self, n, p_push=0.5):
        for _ in range(n):
            if self.rng.random() < p_push:
                self.random_push()
            else:
                self.deliver_one()

    def drain_all(self):
        while self.deliver_one():
            pass

    def applied(self, holders):
        return {h: self.ps[h].store.applied() for h in holders}


def assert_fields_close(codec, got, want, what):
    for name in want:
        if isinstance(codec, XorCodec):
            np.testing.assert_array_equal(
                got[name].view(np.uint32), want[name].view(np.uint32), err_msg=f"{what} {name}"
            )
        else:
            scale = max(1.0, float(np.abs(want[name]).max(initial=0.0)))
            np.testing.assert_allclose(
                got[name], want[name], rtol=1e-6, atol=1e-12 * scale, err_msg=f"{what} {name}"
            )


def check_parity_consistent(cluster):
    """Every parity row of every holder equals the code of its members' current fields."""
    placement, codec = cluster.placement, cluster.codec
    for holder in range(placement.num_ps):
        store = cluster.ps[holder].store
        for table in placement.tables:
            slots = np.arange(placement.num_slots(table, holder))
            member_ps, member_ids = placement.members(table, holder, slots)
            dtypes, trailing = store.spec(table)

            def values(i, ids, member_ps=member_ps, table=table):
                return cluster.ps[int(member_ps[0, i])].read(table, ids)

            want = encode_members(codec, member_ids, values, dtypes, trailing)
            got = store.read(table, slots)
            for name in want:
                if isinstance(codec, XorCodec):
                    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
                else:
                    np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-15)


def fail_and_rebuild(cluster, lost, rows_per_lock, stats):
    """Lose PS ``lost`` and rebuild it chunk by chunk while training goes on."""
    rng, placement = cluster.rng, cluster.placement
    truth = {t: {n: v.copy() for n, v in f.items()} for t, f in cluster.ps[lost].acked.items()}
    epoch = 1
    # The master fences the dead incarnation at its holders and starts a replacement;
    # messages still in flight from (or to) the dead process are left on the wire.
    for holder in placement.holders_of(lost):
        cluster.ps[holder].store.fence(lost, epoch)
    repl = SimPS(
        lost, placement, cluster.codec, cluster.opt, cluster.initial, epoch=epoch, blank=True
    )
    cluster.ps[lost] = repl
    for src in placement.sources_of(lost):
        cluster.ps[src].prop.reset_holder(lost, epoch)
    plan = RebuildPlan(placement, lost, rows_per_lock)
    for table in placement.tables:
        repl.buffer.lock(table, plan.data_ids(table))
        repl.store.mark_stale(table, plan.parity_slots(table))

    while (chunk := plan.next_chunk()) is not None:
        cluster.steps(int(rng.integers(0, 6)))
        sent = {}
        for ps in rng.permutation(chunk.lock_ps):  # locks go in one PS at a time
            cluster.ps[ps].buffer.lock(chunk.table, chunk.locks[ps])
            sent[int(ps)] = cluster.ps[ps].prop.sent()
            cluster.steps(int(rng.integers(0, 3)))
        plan.locks_installed(sent)
        while not plan.drained(cluster.applied(chunk.holders)):
            cluster.steps(1, p_push=0.1)
        assert plan.phase == "writing"
        members = {
            ps: cluster.ps[ps].read(chunk.table, ids) for ps, ids in chunk.member_ids.items()
        }
        dtypes, _ = repl.store.spec(chunk.table)
        if chunk.kind == "decode":
            parity = {
                h: cluster.ps[h].store.read(chunk.table, slots)
                for h, (_, slots) in chunk.parity.items()
            }
            rows = chunk.decode(cluster.codec, parity, members, dtypes)
            pos = repl.pos(chunk.table, chunk.ids)
            want = {n: v[pos] for n, v in truth[chunk.table].items()}
            assert_fields_close(cluster.codec, rows, want, f"PS {lost} {chunk.table}")
            for n in want:
                exact = rows[n].view(np.uint32) == want[n].view(np.uint32)
                stats["values"] += exact.size
                stats["inexact"] += int((~exact).sum())
                stats["max_err"] = max(stats["max_err"], float(np.abs(rows[n] - want[n]).max()))
            repl.write(chunk.table, chunk.ids, rows)
            stats["decoded"] += chunk.ids.size
        else:
            repl.store.write(chunk.table, chunk.slots, chunk.encode(cluster.codec, members, dtypes))
            stats["encoded"] += chunk.slots.size
        assert (plan.status(chunk.table, chunk.ids) == RowStatus.LOCKED).all()
        plan.chunk_written()
        assert (plan.status(chunk.table, chunk.ids) == RowStatus.DONE).all()
        for ps in rng.permutation(chunk.lock_ps):
            held = cluster.ps[ps].buffer.release(chunk.table, chunk.locks[ps])
            stats["held"] += sum(ids.size for ids, _ in held)
            cluster.apply_held(int(ps), chunk.table, held)
            cluster.steps(int(rng.integers(0, 3)))
    assert plan.done and plan.rows_done == plan.rows_total
    for table in placement.tables:
        assert repl.buffer.held_rows == 0
        assert not repl.store.stale(table, np.arange(placement.num_slots(table, lost))).any()
        assert all(np.isfinite(v).all() for v in repl.values[table].values())


@pytest.mark.parametrize("codec_name", ["sum", "xor"])
@pytest.mark.parametrize(("k", "num_ps"), [(2, 3), (2, 4), (2, 6), (4, 5), (4, 6), (4, 8)])
def test_rebuild_restores_every_lost_row_and_state_under_any_single_loss(k, num_ps, codec_name):
    """For every choice of the lost PS: parity messages arrive in random order, some twice,
    some from the dead incarnation; training goes on during a rebuild of 5 rows per lock.
    Every decoded row and optimizer state equals what the holders had acknowledged, and
    after everything drains every parity equals the code of its members."""
    codec = make_codec(codec_name)
    stats = {"values": 0, "inexact": 0, "max_err": 0.0, "decoded": 0, "encoded": 0, "held": 0}
    fenced = 0
    for lost in range(num_ps):
        opt = Optimizer("adam" if lost % 2 == 0 else "adagrad", 0.05)
        cluster = Cluster(num_ps, k, codec, opt, seed=1000 * k + 10 * num_ps + lost)
        cluster.steps(150)
        fail_and_rebuild(cluster, lost, rows_per_lock=5, stats=stats)
        cluster.steps(60)
        cluster.drain_all()
        check_parity_consistent(cluster)
        fenced += cluster.outcomes["fenced"]
    assert stats["decoded"] == sum(VOCAB.values())  # each PS's share, once per lost PS
    assert stats["encoded"] > 0 and stats["held"] > 0 and fenced > 0
    if codec_name == "xor":
        assert stats["inexact"] == 0
    else:  # float64 parity: back to the exact float32 value in (almost) every case
        assert stats["inexact"] <= stats["values"] // 1000
        assert stats["max_err"] < 1e-9


def test_placement_groups_partition_rows_over_distinct_ps():
    """Every row is in exactly one group; a group's k members sit on k different PS, its
    parity on yet another; a PS's rows have their parity on the k PS after it."""
    for num_ps, k in [(3, 2), (5, 4), (7, 2), (9, 4), (6, 5)]:
        placement = ParityPlacement(num_ps, k, {"t": 1000, "u": 17})
        for table, vocab in placement.vocab_sizes.items():
            seen = np.zeros(vocab, dtype=int)
            for holder in range(num_ps):
                slots = np.arange(placement.num_slots(table, holder))
                ps, ids = placement.members(table, holder, slots)
                present = ids >= 0
                assert present.any(axis=1).all()  # no empty parity slot
                np.add.at(seen, ids[present], 1)
                for row in range(slots.size):
                    where = ps[row][present[row]]
                    assert np.unique(where).size == where.size
                    assert holder not in where
                # members really live on the PS the placement names, and point back here
                np.testing.assert_array_equal(
                    partition_of(table, ids[present], num_ps), ps[present]
                )
                back_h, back_s = placement.parity_location(table, ids[present])
                assert (back_h == holder).all()
                np.testing.assert_array_equal(back_s, np.nonzero(present)[0])
            assert (seen == 1).all()
            for p in range(num_ps):
                holders, _ = placement.parity_location(table, placement.ids_on(table, p))
                assert set(holders.tolist()) <= set(placement.holders_of(p))
                assert placement.sources_of(placement.holders_of(p)[0])[-1] == p


def test_parity_spreads_evenly_over_holders():
    """Rotating placement: each PS holds about rows/(k*n) parity rows, and the parity of one
    PS's rows goes to its k successors in equal shares (RAID-5 when n = k + 1)."""
    placement = ParityPlacement(6, 4, {"t": 60_000})
    slots = np.array([placement.num_slots("t", h) for h in range(6)])
    assert np.abs(slots - 60_000 / 24).max() < 0.05 * 60_000 / 24
    for p in range(6):
        holders, _ = placement.parity_location("t", placement.ids_on("t", p))
        share = np.bincount(holders, minlength=6)[list(placement.holders_of(p))] / holders.size
        np.testing.assert_allclose(share, 1 / 4, atol=0.01)


def test_placement_rejects_too_few_ps_naming_k():
    with pytest.raises(ValueError, match=r"ecrm.k=4: needs at least k\+1=5 parameter servers"):
        ParityPlacement(4, 4, {"t": 10})
    with pytest.raises(ValueError, match=r"ecrm\.k=0"):
        ParityPlacement(4, 0, {"t": 10})
    placement = ParityPlacement(3, 2, {"t": 10})
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 10\)"):
        placement.parity_location("t", np.array([10]))
    with pytest.raises(KeyError, match="unknown table"):
        placement.owner("nope", np.array([1]))
    with pytest.raises(ValueError, match="rows_per_lock"):
        RebuildPlan(placement, 0, 0)


@pytest.mark.parametrize("codec", [SumCodec(), XorCodec()])
def test_codec_decodes_any_member_after_random_differences(codec):
    """parity = sum of members, kept up to date by differences only, gives any member back:
    bit for bit with xor (whatever the values), within the documented bound with sum."""
    rng = np.random.default_rng(3)
    k, n, dim, updates = 4, 500, 8, 200
    members = rng.normal(0, 1, size=(k, n, dim)).astype(np.float32)
    if codec.name == "xor":  # zeros, tiny, huge, subnormal, inf, nan: bits are bits
        members[0, :6, 0] = [0.0, -0.0, 1e-30, 3e30, 1e-45, np.inf]
        members[1, 0, :2] = [np.nan, -np.inf]
    parity = np.zeros((n, dim), dtype=codec.parity_dtype(np.dtype(np.float32)))
    for i in range(k):
        codec.add(parity, slice(None), codec.lift(members[i]))
    for _ in range(updates):
        i = int(rng.integers(k))
        rows = rng.choice(n, size=50, replace=False)
        new = (members[i, rows] + rng.normal(0, 0.01, (50, dim))).astype(np.float32)
        if codec.name == "xor":
            new[np.isnan(members[i, rows])] = np.nan
        codec.add(parity, rows, codec.difference(new, members[i, rows]))
        members[i, rows] = new
    bound = 2.0**-52 * (updates + k) * np.abs(members).max(axis=0)
    for lost in range(k):
        acc = parity.copy()
        for i in range(k):
            if i != lost:
                codec.sub(acc, slice(None), codec.lift(members[i]))
        got = codec.lower(acc, np.dtype(np.float32))
        if codec.name == "xor":
            np.testing.assert_array_equal(got.view(np.uint32), members[lost].view(np.uint32))
        else:
            err = np.abs(got.astype(np.float64) - members[lost])
            half_ulp = np.abs(members[lost]).astype(np.float64) * 2.0**-24
            assert (err <= np.maximum(bound, half_ulp)).all()
            assert np.mean(got == members[lost]) > 0.999


def test_sum_codec_rejects_integers_and_xor_odd_widths():
    with pytest.raises(TypeError, match="floating-point"):
        SumCodec().parity_dtype(np.dtype(np.int32))
    with pytest.raises(TypeError, match="1, 2, 4 or 8-byte"):
        XorCodec().parity_dtype(np.dtype("V3"))
    with pytest.raises(ValueError, match="accepted: sum, xor"):
        make_codec("rs")


def _store_pair(codec=None):
    codec = codec or SumCodec()
    opt = Optimizer("adagrad", 0.1)
    placement = ParityPlacement(3, 2, {"dim4": 40})
    initial = make_initial(opt)
    src = SimPS(0, placement, codec, opt, initial)
    holder = placement.holders_of(0)[0]
    return placement, src, ParityStore(placement, holder, codec, initial), holder


def test_parity_store_applies_each_message_once_in_order_and_fences_the_dead():
    placement, src, store, holder = _store_pair()
    ids = placement.ids_on("dim4", 0)
    holders, _ = placement.parity_location("dim4", ids)
    ids = ids[holders == holder][:3]
    grads = np.ones((ids.size, 4), dtype=np.float32)
    first, _ = src.apply_now("dim4", ids, grads)
    second, _ = src.apply_now("dim4", ids, grads)
    (m1,), (m2,) = first, second
    with pytest.raises(ValueError, match="got message 2 after 0; a difference was lost"):
        store.apply(m2)
    assert store.apply(m1) == "applied"
    assert store.apply(m1) == "duplicate"
    assert store.apply(m2) == "applied"
    assert store.applied()[0] == 2
    store.fence(0, 1)  # PS 0 died; anything from incarnation 0 is dropped
    (m3,), _ = src.apply_now("dim4", ids, grads)
    assert store.apply(m3) == "fenced"
    stale = ParityDelta(m1.source, 1, m1.holder, m1.holder_epoch + 1, 1, m1.tables)
    assert store.apply(stale) == "fenced"  # addressed to another incarnation of the holder
    with pytest.raises(ValueError, match="delivered to PS"):
        store.apply(ParityDelta(0, 1, (holder + 1) % 3, 0, 1, m1.tables))


def test_parity_is_materialised_lazily_from_initial_values():
    """A slot no member was updated in reads as the code of the members' initial values;
    decoding any row through it gives that row's initial value."""
    placement, _, store, holder = _store_pair(XorCodec())
    assert store.materialised("dim4").size == 0
    lost = placement.sources_of(holder)[0]
    ids = placement.ids_on("dim4", lost)
    plan = plan_decode(placement, "dim4", lost, ids)
    parity = {
        h: ParityStore(placement, h, store.codec, store.initial).read("dim4", s)
        for h, (_, s) in plan.parity.items()
    }
    members = {ps: store.initial("dim4", m) for ps, m in plan.member_ids.items()}
    dtypes, _ = store.spec("dim4")
    got = plan.decode(store.codec, parity, members, dtypes)
    want = store.initial("dim4", ids)
    for n in want:
        np.testing.assert_array_equal(got[n], want[n])
    assert store.materialised("dim4").size == 0  # reads never store


def test_degraded_read_matches_live_rows_once_drained():
    """With no difference in flight a degraded read of any row gives its current value."""
    for codec in (SumCodec(), XorCodec()):
        cluster = Cluster(5, 2, codec, Optimizer("adam", 0.05), seed=11)
        cluster.steps(300)
        cluster.drain_all()
        for lost in range(5):
            for table in VOCAB:
                ids = cluster.placement.ids_on(table, lost)
                plan = plan_decode(cluster.placement, table, lost, ids)
                parity = {
                    h: cluster.ps[h].store.read(table, s) for h, (_, s) in plan.parity.items()
                }
                members = {p: cluster.ps[p].read(table, m) for p, m in plan.member_ids.items()}
                dtypes, _ = cluster.ps[lost].store.spec(table)
                got = plan.decode(codec, parity, members, dtypes)
                assert_fields_close(codec, got, cluster.ps[lost].read(table, ids), "read")


def test_degraded_read_catches_up_with_differences_in_flight():
    """Messages still in the channels, in a random interleaving: the parity read now plus the
    members' undelivered messages for the rows read (``restrict``, ``catch_up``) decodes every
    lost row to what its holders know of it, as a fully drained read would."""
    for codec in (SumCodec(), XorCodec()):
        cluster = Cluster(5, 2, codec, Optimizer("adagrad", 0.1), seed=21)
        cluster.steps(400, p_push=0.7)
        assert sum(len(q) for q in cluster.channels.values()) > 20
        for lost in range(5):
            for table in VOCAB:
                ids = cluster.placement.ids_on(table, lost)
                plan = plan_decode(cluster.placement, table, lost, ids)
                members = {p: cluster.ps[p].read(table, m) for p, m in plan.member_ids.items()}
                parity = {}
                for h, (_, slots) in plan.parity.items():
                    parity[h] = cluster.ps[h].store.read(table, slots)
                    in_flight = [
                        part
                        for (source, to), queue in cluster.channels.items()
                        if to == h and source in plan.member_ids
                        for delta, _ in queue
                        for part in restrict(delta, {table: plan.member_ids[source]})
                    ]
                    catch_up(cluster.placement, codec, table, h, slots, parity[h], in_flight)
                dtypes, _ = cluster.ps[lost].store.spec(table)
                got = plan.decode(codec, parity, members, dtypes)
                src = cluster.ps[lost]
                want = {n: v[src.pos(table, ids)] for n, v in src.acked[table].items()}
                assert_fields_close(codec, got, want, "caught-up read")


def test_rows_to_rebuild_are_the_updated_groups_of_the_lost_ps():
    """Rows outside any materialised group are still initial; the others are listed."""
    cluster = Cluster(6, 2, SumCodec(), Optimizer("adagrad", 0.1), seed=8)
    cluster.steps(16)
    cluster.drain_all()
    placement, lost = cluster.placement, 3
    mat = {h: {t: cluster.ps[h].store.materialised(t) for t in VOCAB} for h in range(6)}
    targets = rows_to_rebuild(placement, lost, mat)
    initial = make_initial(cluster.opt)
    for table in VOCAB:
        ids = placement.ids_on(table, lost)
        listed = np.isin(ids, targets[table])
        assert listed.sum() < ids.size
        rest = ids[~listed]
        now, init = cluster.ps[lost].read(table, rest), initial(table, rest)
        for n in init:
            np.testing.assert_array_equal(now[n], init[n])
        assert (placement.owner(table, targets[table]) == lost).all()
    assert sum(v.size for v in targets.values()) > 0
    plan = RebuildPlan(placement, lost, 4, data_ids=targets)
    assert plan.rows_total == sum(v.size for v in targets.values()) + sum(
        placement.num_slots(t, lost) for t in VOCAB
    )


def test_encode_plan_rebuilds_a_holders_parity():
    cluster = Cluster(4, 3, XorCodec(), Optimizer("adagrad", 0.1), seed=5)
    cluster.steps(200)
    cluster.drain_all()
    for holder in range(4):
        slots = np.arange(cluster.placement.num_slots("dim4", holder))
        plan = plan_encode(cluster.placement, "dim4", holder, slots)
        members = {p: cluster.ps[p].read("dim4", m) for p, m in plan.member_ids.items()}
        dtypes, _ = cluster.ps[holder].store.spec("dim4")
        got = plan.encode(cluster.codec, members, dtypes)
        want = cluster.ps[holder].store.read("dim4", slots)
        for n in want:
            np.testing.assert_array_equal(got[n], want[n])


def test_encode_only_plans_rebuild_all_parity_after_a_restore():
    """After every PS restored its rows from a checkpoint, each holder re-encodes its parity
    (``data_ids={}``) and the code is consistent with the restored rows again."""
    cluster = Cluster(5, 2, SumCodec(), Optimizer("adam", 0.05), seed=21)
    cluster.steps(200)
    cluster.channels.clear()  # the processes died: nothing in flight survives
    for ps in cluster.ps:
        ps.store = ParityStore(cluster.placement, ps.index, cluster.codec, cluster.initial, epoch=1)
        for table in VOCAB:
            ps.store.mark_stale(table)
    for holder in range(5):
        plan = RebuildPlan(cluster.placement, holder, rows_per_lock=8, data_ids={})
        while (chunk := plan.next_chunk()) is not None:
            assert chunk.kind == "encode" and chunk.ids.size == 0
            plan.locks_installed({ps: {} for ps in chunk.lock_ps})
            assert plan.drained({})
            members = {p: cluster.ps[p].read(chunk.table, m) for p, m in chunk.member_ids.items()}
            dtypes, _ = cluster.ps[holder].store.spec(chunk.table)
            encoded = chunk.encode(cluster.codec, members, dtypes)
            cluster.ps[holder].store.write(chunk.table, chunk.slots, encoded)
            plan.chunk_written()
    with pytest.raises(ValueError, match="being rebuilt"):
        stale = ParityStore(cluster.placement, 0, cluster.codec, cluster.initial)
        stale.mark_stale("dim4")
        stale.read("dim4", np.array([0]))
    check_parity_consistent(cluster)


def test_rebuild_plan_enforces_its_protocol_and_reports_progress():
    placement = ParityPlacement(3, 2, {"t": 30})
    plan = RebuildPlan(placement, 1, rows_per_lock=4)
    n_data = placement.ids_on("t", 1).size
    n_slots = placement.num_slots("t", 1)
    assert plan.rows_total == n_data + n_slots
    assert plan.chunks == -(-n_data // 4) + -(-n_slots // 4)
    with pytest.raises(RuntimeError, match="rebuild is idle, not draining"):
        plan.drained({})
    chunk = plan.next_chunk()
    assert chunk is not None and chunk.kind == "decode" and chunk.ids.size == 4
    assert 1 in chunk.locks and set(chunk.lock_ps) >= set(chunk.member_ids)
    with pytest.raises(RuntimeError, match="rebuild is locked, not idle"):
        plan.next_chunk()
    with pytest.raises(ValueError, match="no sent"):
        plan.locks_installed({})
    plan.locks_installed({ps: {h: 3 for h in placement.holders_of(ps)} for ps in chunk.lock_ps})
    assert not plan.drained({h: {} for h in chunk.holders})
    assert plan.drained({h: dict.fromkeys(placement.sources_of(h), 3) for h in chunk.holders})
    plan.chunk_written()
    assert plan.rows_done == 4
    others = np.setdiff1d(placement.ids_on("t", 1), chunk.ids)
    assert (plan.status("t", others) == RowStatus.PENDING).all()
    assert (plan.status("t", np.array([placement.ids_on("t", 0)[0]])) == RowStatus.DONE).all()


def test_update_buffer_holds_locked_rows_and_releases_them_in_order():
    buf = UpdateBuffer()
    buf.lock("t", np.array([5, 1, 9]))
    now_ids, now = buf.admit("t", np.array([1, 2, 5]), {"grad": np.array([[1.0], [2.0], [3.0]])})
    np.testing.assert_array_equal(now_ids, [2])
    np.testing.assert_array_equal(now["grad"], [[2.0]])
    buf.admit("t", np.array([9, 5]), {"grad": np.array([[4.0], [5.0]])})
    assert buf.held_rows == 4
    first = buf.release("t", np.array([5]))
    assert [ids.tolist() for ids, _ in first] == [[5], [5]]
    assert [p["grad"].ravel().tolist() for _, p in first] == [[3.0], [5.0]]
    assert not buf.locked("t", np.array([5]))[0] and buf.locked("t", np.array([9]))[0]
    rest = buf.release("t")
    assert [ids.tolist() for ids, _ in rest] == [[1], [9]]
    assert buf.held_rows == 0 and not buf.locked("t", np.array([1, 9])).any()


def test_propagator_rejects_rows_it_does_not_own():
    placement = ParityPlacement(3, 2, {"t": 30})
    prop = DifferencePropagator(placement, 0, SumCodec())
    foreign = placement.ids_on("t", 1)[:2]
    f = {"row": np.zeros((2, 1), np.float32)}
    with pytest.raises(ValueError, match="not owned by PS 0"):
        prop.deltas({"t": (foreign, f, f)})
    mine = placement.ids_on("t", 0)[:1]
    with pytest.raises(ValueError, match="unique"):
        prop.deltas({"t": (np.repeat(mine, 2), f, f)})


def test_the_rebuild_path_groupings_match_numpy_unique() -> None:
    """``distinct_ps`` and ``sorted_inverse`` stand in for ``np.unique`` on the rebuild path
    (ids there are unique; the fallback keeps repeats right too)."""
    from airflow_rover.core.ecrm.ids import distinct_ps, sorted_inverse

    rng = np.random.default_rng(3)
    for ids in (
        rng.permutation(1000)[:300],  # unique, unordered: the usual case
        rng.integers(0, 50, 300),  # repeats
        np.arange(5),
        np.empty(0, dtype=np.int64),
    ):
        uniq, inverse = sorted_inverse(ids)
        want, want_inverse = np.unique(ids, return_inverse=True)
        np.testing.assert_array_equal(uniq, want)
        np.testing.assert_array_equal(uniq[inverse], ids)
        np.testing.assert_array_equal(inverse, want_inverse)
    ps = rng.integers(0, 6, 1000)
    np.testing.assert_array_equal(distinct_ps(ps), np.unique(ps))
    assert distinct_ps(np.empty(0, dtype=np.int64)).size == 0
