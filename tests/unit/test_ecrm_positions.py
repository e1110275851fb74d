"""ECRM on a positional table (raw 64-bit ids, rows numbered by position on their PS): a
simulated cluster whose rows appear as ids arrive, coded from their first update, where
parity messages arrive in random order and training goes on during a rebuild. The lost PS's
ids are decoded from the parity together with its rows."""

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
    UpdateBuffer,
    XorCodec,
    encode_members,
    make_codec,
    rows_to_rebuild,
)
from airflow_rover.core.ecrm.row_keys import KEY_FIELD, decode_keys, key_fields, no_keys
from airflow_rover.core.hashing import initial_rows
from airflow_rover.core.training_optimizers import Optimizer

TABLE = "raw"
DIM = 3
SEED = 11


class PositionalPS:
    """One PS's rows of a positional table: ids in the order they arrived (a row's position),
    its fields, whether each row is coded (its first update went out), and its ECRM side."""

    def __init__(self, index, placement, codec, opt, epoch=0):
        self.index = index
        self.placement = placement
        self.opt = opt
        self.ids: list[int] = []
        self.where: dict[int, int] = {}
        self.fields = self.blank(0)
        self.coded = np.zeros(0, dtype=bool)
        self.acked = {n: v.copy() for n, v in self.fields.items()}  # what a decode gives back
        self.store = ParityStore(placement, index, codec, self.initial, epoch)
        self.prop = DifferencePropagator(placement, index, codec, epoch)
        self.buffer = UpdateBuffer()

    def initial(self, table, keys):
        """A position's code before its first update: zeros (the store asks for dtypes)."""
        return self.blank(np.asarray(keys).size)

    def blank(self, n):
        out = {"row": np.zeros((n, DIM), np.float32)}
        for k, v in self.opt.init_state((n, DIM), rows=True).items():
            out[f"state/{k}"] = np.zeros_like(v)
        out[KEY_FIELD] = no_keys(n)
        return out

    def _grow(self, n):
        for group in (self.fields, self.acked):
            for name, value in group.items():
                pad = np.zeros((n, *value.shape[1:]), dtype=value.dtype)
                group[name] = np.concatenate([value, pad])
        self.coded = np.concatenate([self.coded, np.zeros(n, dtype=bool)])

    def touch(self, ids):
        """A pull: rows for new ids at the next positions, seeded, not coded (no message)."""
        new = [int(i) for i in dict.fromkeys(ids.tolist()) if int(i) not in self.where]
        if new:
            start = len(self.ids)
            self._grow(len(new))
            for offset, i in enumerate(new):
                self.where[i] = start + offset
            self.ids += new
            at = np.arange(start, start + len(new))
            self.fields["row"][at] = initial_rows(TABLE, np.array(new), DIM, SEED, 0.05)
            for k, v in self.opt.init_state((len(new), DIM), rows=True).items():
                self.fields[f"state/{k}"][at] = v
            self.fields[KEY_FIELD][at] = key_fields(np.array(new))
        return np.array([self.where[int(i)] for i in ids], dtype=np.int64)

    def keys(self, positions):
        return self.placement.position_keys(self.index, positions)

    def read(self, keys):
        """A member read: coded rows' fields, zeros where a key holds no coded row."""
        pos = self.placement.key_positions(keys)
        out = self.blank(pos.size)
        have = np.flatnonzero(
            (pos < self.coded.size) & self.coded[np.minimum(pos, max(0, self.coded.size - 1))]
        )
        for name in out:
            out[name][have] = self.fields[name][pos[have]]
        return out

    def apply_now(self, keys, grads):
        pos = self.placement.key_positions(keys)
        old = self.read(keys)
        rows = self.fields["row"][pos].copy()
        state = {n[6:]: self.fields[n][pos].copy() for n in self.fields if n.startswith("state/")}
        self.opt.apply(rows, state, grads)
        new = {"row": rows, **{f"state/{k}": v for k, v in state.items()}}
        new[KEY_FIELD] = self.fields[KEY_FIELD][pos].copy()
        for name, value in new.items():
            self.fields[name][pos] = value
        self.coded[pos] = True
        return self.prop.deltas({TABLE: (keys, old, new)}), new


class Cluster:
    def __init__(self, num_ps, k, codec, opt, seed, id_pool=400):
        self.placement = ParityPlacement(num_ps, k, {TABLE: 1}, positional=[TABLE])
        self.codec, self.opt = codec, opt
        self.rng = np.random.default_rng(seed)
        # raw ids from the whole int64 range, each owned by one PS
        self.pool = self.rng.integers(-(2**63), 2**63 - 1, size=id_pool, dtype=np.int64)
        self.owner = self.rng.integers(0, num_ps, size=id_pool)
        self.ps = [PositionalPS(i, self.placement, codec, opt) for i in range(num_ps)]
        self.channels: dict[tuple[int, int], deque[tuple[ParityDelta, dict]]] = {}
        self.outcomes = {"applied": 0, "duplicate": 0, "fenced": 0}
        self.paused: set[int] = set()  # PS that take no pushes (a replacement rebuilding)

    def send(self, deltas, keys, new):
        for d in deltas:
            parts = {}
            for part in d.tables:
                sel = np.searchsorted(keys, part.ids)
                parts[part.table] = (part.ids, {n: v[sel] for n, v in new.items()})
            self.channels.setdefault((d.source, d.holder), deque()).append((d, parts))

    def push(self, ps_index, ids, grads):
        ps = self.ps[ps_index]
        keys = ps.keys(ps.touch(ids))
        order = np.argsort(keys)
        now, payload = ps.buffer.admit(TABLE, keys[order], {"grad": grads[order]})
        if now.size:
            deltas, new = ps.apply_now(now, payload["grad"])
            self.send(deltas, now, new)

    def random_step(self):
        if self.rng.random() < 0.3:  # a pull: rows appear, uncoded
            ps = int(self.rng.integers(len(self.ps)))
            if ps not in self.paused:
                mine = self.pool[self.owner == ps]
                if mine.size:
                    self.ps[ps].touch(self.rng.choice(mine, size=min(3, mine.size), replace=False))
            return
        ps = int(self.rng.integers(len(self.ps)))
        mine = self.pool[self.owner == ps]
        if ps in self.paused or mine.size == 0:
            return
        n = int(self.rng.integers(1, min(6, mine.size) + 1))
        ids = self.rng.choice(mine, size=n, replace=False)
        grads = self.rng.normal(0, 0.1, size=(n, DIM)).astype(np.float32)
        self.push(ps, ids, grads)

    def deliver_one(self):
        live = [key for key, q in self.channels.items() if q]
        if not live:
            return False
        key = live[int(self.rng.integers(len(live)))]
        delta, parts = self.channels[key].popleft()
        outcome = self.ps[delta.holder].store.apply(delta)
        self.outcomes[outcome] += 1
        if outcome == "applied":
            src = self.ps[delta.source]
            for _, (keys, fields) in parts.items():
                pos = self.placement.key_positions(keys)
                for n, v in src.acked.items():
                    v[pos] = fields[n]
        return True

    def steps(self, n, p_step=0.5):
        for _ in range(n):
            if self.rng.random() < p_step:
                self.random_step()
            else:
                self.deliver_one()

    def drain_all(self):
        while self.deliver_one():
            pass


def check_parity_consistent(cluster):
    """Every materialised parity row equals the code of its members' coded fields."""
    placement, codec = cluster.placement, cluster.codec
    for holder in range(placement.num_ps):
        store = cluster.ps[holder].store
        slots = store.materialised(TABLE)
        member_ps, member_keys = placement.members(TABLE, holder, slots)
        dtypes, trailing = store.spec(TABLE)

        def values(i, keys, member_ps=member_ps):
            return cluster.ps[int(member_ps[0, i])].read(keys)

        want = encode_members(codec, member_keys, values, dtypes, trailing)
        got = store.read(TABLE, slots)
        for name in want:
            if isinstance(codec, XorCodec):
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
            else:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-15)


def lose_and_rebuild(cluster, lost, rows_per_lock):
    """Lose PS ``lost``; rebuild its ids and rows, and the parity it held, chunk by chunk
    while the other PS train. Returns the rebuilt rows by position and the counts."""
    placement, rng = cluster.placement, cluster.rng
    truth = {n: v.copy() for n, v in cluster.ps[lost].acked.items()}
    epoch = 1
    materialised = {}
    for holder in placement.holders_of(lost):
        cluster.ps[holder].store.fence(lost, epoch)
        materialised[holder] = {TABLE: cluster.ps[holder].store.materialised(TABLE)}
    repl = PositionalPS(lost, placement, cluster.codec, cluster.opt, epoch=epoch)
    cluster.ps[lost] = repl
    cluster.paused.add(lost)
    coded = []  # the sources' coded keys: the parity slots the lost PS held with members
    for src in placement.sources_of(lost):
        cluster.ps[src].prop.reset_holder(lost, epoch)
        coded.append(cluster.ps[src].keys(np.flatnonzero(cluster.ps[src].coded)))
    where, slots = placement.parity_location(TABLE, np.concatenate(coded))
    plan = RebuildPlan(
        placement,
        lost,
        rows_per_lock,
        data_ids=rows_to_rebuild(placement, lost, materialised),
        parity_slots={TABLE: np.unique(slots[where == lost])},
    )
    repl.buffer.lock(TABLE, plan.data_ids(TABLE))
    repl.store.mark_stale(TABLE, plan.parity_slots(TABLE))
    rebuilt: dict[int, tuple[int, dict]] = {}  # position -> (id, fields)
    counts = {"empty": 0, "rows": 0, "slots": 0}
    while (chunk := plan.next_chunk()) is not None:
        cluster.steps(int(rng.integers(0, 6)))
        sent = {}
        for ps in rng.permutation(chunk.lock_ps):
            cluster.ps[ps].buffer.lock(TABLE, chunk.locks[ps])
            sent[int(ps)] = cluster.ps[ps].prop.sent()
            cluster.steps(int(rng.integers(0, 3)))
        plan.locks_installed(sent)
        while not plan.drained({h: cluster.ps[h].store.applied() for h in chunk.holders}):
            cluster.steps(1, p_step=0.1)
        members = {ps: cluster.ps[ps].read(keys) for ps, keys in chunk.member_ids.items()}
        dtypes, _ = repl.store.spec(TABLE)
        if chunk.kind == "decode":
            parity = {h: cluster.ps[h].store.read(TABLE, s) for h, (_, s) in chunk.parity.items()}
            fields = chunk.decode(cluster.codec, parity, members, dtypes)
            present, ids = decode_keys(TABLE, fields[KEY_FIELD])
            positions = placement.key_positions(chunk.ids)
            for j, (p, i) in enumerate(zip(positions[present], ids, strict=True)):
                rebuilt[int(p)] = (int(i), {n: v[present][j] for n, v in fields.items()})
            counts["rows"] += int(present.sum())
            counts["empty"] += int((~present).sum())
        else:
            repl.store.write(TABLE, chunk.slots, chunk.encode(cluster.codec, members, dtypes))
            counts["slots"] += chunk.slots.size
        plan.chunk_written()
        for ps in rng.permutation(chunk.lock_ps):
            for keys, payload in cluster.ps[ps].buffer.release(TABLE, chunk.locks[ps]):
                deltas, new = cluster.ps[ps].apply_now(keys, payload["grad"])
                cluster.send(deltas, keys, new)
    return truth, rebuilt, counts


@pytest.mark.parametrize("codec_name", ["sum", "xor"])
@pytest.mark.parametrize(("k", "num_ps"), [(2, 3), (2, 5), (3, 4)])
def test_a_lost_positional_ps_decodes_to_its_acknowledged_ids_and_rows(k, num_ps, codec_name):
    """Every position whose row a holder acknowledged decodes to that row's raw id, values and
    optimizer state; every other position decodes as empty; the replacement then holds what
    the lost PS had, and after everything drains every parity is the code of its members."""
    codec = make_codec(codec_name)
    empty = 0  # positions in a coded group that the lost PS held no coded row at
    for lost in range(num_ps):
        opt = Optimizer("adam" if lost % 2 else "adagrad", 0.05)
        cluster = Cluster(num_ps, k, codec, opt, seed=100 * k + 10 * num_ps + lost)
        cluster.steps(300)
        truth, rebuilt, counts = lose_and_rebuild(cluster, lost, rows_per_lock=4)
        acked = np.flatnonzero(truth[KEY_FIELD][:, 2] == 1.0)
        assert sorted(rebuilt) == acked.tolist()
        assert counts["rows"] == acked.size > 0 and counts["slots"] > 0
        empty += counts["empty"]
        want_ids = decode_keys(TABLE, truth[KEY_FIELD][acked])[1]
        for p, want_id in zip(acked, want_ids, strict=True):
            got_id, got = rebuilt[int(p)]
            assert got_id == want_id
            for name in got:
                np.testing.assert_allclose(got[name], truth[name][p], rtol=1e-6, atol=1e-9)
                if codec_name == "xor":
                    np.testing.assert_array_equal(got[name], truth[name][p].astype(got[name].dtype))
        # The replacement takes the rows at their positions and trains on.
        repl = cluster.ps[lost]
        top = max(rebuilt) + 1
        repl._grow(top)
        for p, (i, fields) in rebuilt.items():
            repl.where[i] = p
            for name, value in fields.items():
                repl.fields[name][p] = value
                repl.acked[name][p] = value
            repl.coded[p] = True
        cluster.drain_all()
        check_parity_consistent(cluster)
    assert empty > 0


def test_positional_keys_place_groups_on_distinct_ps_and_rotate_holders():
    placement = ParityPlacement(5, 2, {TABLE: 1, "vocab": 40}, positional=[TABLE])
    keys = placement.position_keys(3, np.arange(12))
    assert (placement.owner(TABLE, keys) == 3).all()
    np.testing.assert_array_equal(placement.key_positions(keys), np.arange(12))
    holder, slots = placement.parity_location(TABLE, keys)
    assert set(holder.tolist()) == set(placement.holders_of(3))
    for h in set(holder.tolist()):
        member_ps, member_keys = placement.members(TABLE, h, slots[holder == h])
        assert (member_keys >= 0).all()
        for row_ps, row_keys in zip(member_ps, member_keys, strict=True):
            assert len(set(row_ps.tolist())) == placement.k and h not in row_ps
            assert (placement.owner(TABLE, row_keys) == row_ps).all()
        found = member_keys[member_ps == 3]
        np.testing.assert_array_equal(np.sort(found), np.sort(keys[holder == h]))
    assert placement.num_slots(TABLE, 0) == 0 and placement.num_slots("vocab", 0) > 0
    with pytest.raises(ValueError, match="numbered by position"):
        placement.ids_on(TABLE, 0)
    with pytest.raises(ValueError, match="not among the tables"):
        ParityPlacement(3, 2, {"a": 4}, positional=["b"])
    with pytest.raises(ValueError, match="pass data_ids"):
        RebuildPlan(placement, 0, 4)


def test_key_fields_round_trip_any_int64_and_refuse_a_wrong_code():
    ids = np.array([0, 1, -1, 2**63 - 1, -(2**63), 123456789012345678], dtype=np.int64)
    present, back = decode_keys(TABLE, np.concatenate([key_fields(ids), no_keys(2)]))
    assert present.tolist() == [True] * ids.size + [False, False]
    np.testing.assert_array_equal(back, ids)
    for bad in ([0.0, 0.0, 0.5], [1.5, 0.0, 1.0], [0.0, 2.0**32, 1.0], [3.0, 0.0, 0.0]):
        with pytest.raises(ValueError, match="'raw': a decoded row key"):
            decode_keys(TABLE, np.array([bad]))
