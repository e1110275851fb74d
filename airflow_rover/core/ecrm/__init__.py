"""ECRM erasure coding of embedding rows: placement, parity codecs, difference propagation,
decoding and the chunked rebuild, as pure numpy a PS (and the master) can drive.

ECRM paper section 3; formulas and pictures in ``docs/checkpoint-policies.md``.

**Placement** (``ParityPlacement``). Rows already live on PS ``owner = partition_of(table, id, n)``.
Number each PS's ids of a table in ascending order: ``j`` = local index. Row ``(table, id)``
with local index ``j`` on PS ``p`` has position ``i = j % k`` and level ``l = j // k`` in the
group ``(table, a, l)`` with ``a = (p - i) % n``: the members are the rows of local index
``l*k + i`` on PS ``(a + i) % n`` for ``i < k`` (k distinct PS), and the parity lives on PS
``(a + k) % n`` in its parity slot ``l`` for that table. So PS ``h`` holds the parity of the
groups of the ``k`` PS before it, one per level, and the parity of a PS's rows rotates over the
``k`` PS after it in equal shares (RAID-5 when ``n = k + 1``); each PS holds about
``rows/(n*k)`` parity rows per table. ``k + 1 <= n`` is required. The placement depends on ``n``:
after a PS resize the parity is encoded again (``plan_encode``).

**Parity** of a group is the sum of its members' fields (the row and every optimizer-state
array), in one of two codecs. ``SumCodec`` (ECRM's summation code) keeps float64 parity: after
``u`` differences the decode error is below ``2**-52 * (u + k) * max|member|``, so the float32
result is the exact value whenever ``|row| > 2**-28 * (u + k) * max|member|``; a read racing
an update is off by that update only; inf/nan would poison the parity. ``XorCodec`` XORs the
bit patterns (RAID-5's code, a sum over GF(2)): bit-exact whatever the history or the values,
parity as wide as the row, but a read racing an update decodes to garbage, so degraded reads
must be drained first. A member row not created yet counts with its seeded initial value, so
a parity row is materialised lazily from the members' initial values.

**Normal operation.** Each PS keeps a ``ParityStore`` (the parity it holds), a
``DifferencePropagator`` (after applying an update it turns the ``old``/``new`` fields into one
``ParityDelta`` per parity holder, sent in order on one channel per holder; the holder
``apply``-s it exactly once) and an ``UpdateBuffer`` (updates held back while rows are locked).

**A PS is lost** (new incarnation ``e``). The master: (1) fences the dead incarnation at the
PS holding its parity (``ParityStore.fence(lost, e)`` at each of ``placement.holders_of(lost)``:
its differences still in flight are dropped, so its rows decode to the last update a holder
acknowledged, a state asynchronous training could have reached, ECRM appendix A); (2) starts
the replacement with ``epoch=e`` and a ``RebuildPlan``, locks every ``plan.data_ids`` in the
replacement's buffer and marks its ``plan.parity_slots`` stale (deltas to them are dropped
until re-encoded: they would be overwritten anyway); (3) has each of
``placement.sources_of(lost)`` call ``reset_holder(lost, e)``; (4) drives the plan::

    while (chunk := plan.next_chunk()) is not None:
        for ps in chunk.lock_ps: buffers[ps].lock(chunk.table, chunk.locks[ps])
        plan.locks_installed({ps: propagator[ps].sent() for ps in chunk.lock_ps})
        while not plan.drained({h: stores[h].applied() for h in chunk.holders}): wait()
        members = {ps: read(ps, chunk.table, ids) for ps, ids in chunk.member_ids.items()}
        if chunk.kind == "decode":  # the lost PS's rows -> write them on the replacement
            parity = {h: stores[h].read(chunk.table, s) for h, (_, s) in chunk.parity.items()}
            rows = chunk.decode(codec, parity, members, dtypes)
        else:  # the parity the lost PS held
            stores[lost].write(chunk.table, chunk.slots, chunk.encode(codec, members, dtypes))
        plan.chunk_written()
        for ps in chunk.lock_ps: apply buffers[ps].release(chunk.table, chunk.locks[ps])

(``read`` of a row a PS has not created returns its initial value, like
``EmbeddingTable.lookup(create=False)``; ``sent()`` must be read after that PS's lock is in.)
Training goes on meanwhile: rows outside the locked chunk are updated as usual; updates to a
lost row wait in the replacement's buffer until its chunk is written (``plan.status``); a read
of a lost row not rebuilt yet is a degraded read (``plan_decode``).

Modules: ``codecs`` (``SumCodec``, ``XorCodec``), ``placement`` (``ParityPlacement``),
``propagation`` (``DifferencePropagator``, ``ParityDelta``), ``parity_store`` (``ParityStore``),
``encoding`` and ``decoding`` (``plan_encode``, ``plan_decode``, ``catch_up``), ``rebuild``
(``RebuildPlan``), ``update_buffer`` (``UpdateBuffer``), ``messages`` (ECRM's RPCs as arrays),
``degraded`` (a worker's or a replacement's reads of a lost PS's rows) and ``row_keys`` (the
id a position of a positional table holds, as a parity field).
"""

from airflow_rover.core.ecrm.codecs import Fields, ParityCodec, SumCodec, XorCodec, make_codec
from airflow_rover.core.ecrm.decoding import DecodePlan, catch_up, plan_decode, restrict
from airflow_rover.core.ecrm.encoding import EncodePlan, encode_members, plan_encode
from airflow_rover.core.ecrm.parity_store import ParityStore
from airflow_rover.core.ecrm.placement import ParityPlacement
from airflow_rover.core.ecrm.propagation import DifferencePropagator, ParityDelta, TableDelta
from airflow_rover.core.ecrm.rebuild import RebuildChunk, RebuildPlan, RowStatus, rows_to_rebuild
from airflow_rover.core.ecrm.update_buffer import UpdateBuffer

__all__ = [
    "DecodePlan",
    "DifferencePropagator",
    "EncodePlan",
    "Fields",
    "ParityCodec",
    "ParityDelta",
    "ParityPlacement",
    "ParityStore",
    "RebuildChunk",
    "RebuildPlan",
    "RowStatus",
    "SumCodec",
    "TableDelta",
    "UpdateBuffer",
    "XorCodec",
    "catch_up",
    "encode_members",
    "make_codec",
    "plan_decode",
    "plan_encode",
    "restrict",
    "rows_to_rebuild",
]
