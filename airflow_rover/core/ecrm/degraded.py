"""Degraded reads: a lost PS's rows decoded from its parity holders and the group's other
members, by a replacement for the rows it has not rebuilt yet, or by a worker until the
replacement is announced.

The replacement takes a few hundred milliseconds to start, take over and be announced; ECRM's
workers do not wait for it (ECRM section 3.4): they read the lost rows by decoding them, with
the same requests the replacement makes (``degraded_requests``), and hold their part of each
push for the replacement (``LostPS``). A worker reads its own held updates (they are applied
to what it decodes, in order), not those another worker holds: the rows it reads miss at most
the other workers' updates of the gap, which asynchronous training tolerates.

The held pushes keep their batch keys, so delivering them is safe whatever the lost PS had
applied before it died: a batch its holders all knew is in the replacement's ledger and turned
away, any other is applied once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from airflow_rover.core.ecrm.codecs import Fields, ParityCodec, SumCodec
from airflow_rover.core.ecrm.decoding import DecodePlan, catch_up, plan_decode
from airflow_rover.core.ecrm.messages import read_ints, text
from airflow_rover.core.ecrm.placement import ParityPlacement
from airflow_rover.core.ecrm.propagation import TableDelta
from airflow_rover.core.training_optimizers import Optimizer


def degraded_requests(
    placement: ParityPlacement, lost: int, ids_by_table: Mapping[str, np.ndarray]
) -> tuple[dict[str, DecodePlan], dict[tuple[str, int], dict[str, np.ndarray]]]:
    """What to read to decode rows of the lost PS ``lost`` (a replacement's pull of rows not
    rebuilt yet, or a worker's while its PS is away): per table the decode plan, and one
    ``Ecrm`` request per PS, keyed ``("member", ps)`` (``fields``: its rows and its messages
    to the holders not acknowledged yet) or ``("holder", ps)`` (``parity_read``: the parity
    and how many messages of each source it applied), every table in the same request."""
    plans = {t: plan_decode(placement, t, lost, ids) for t, ids in ids_by_table.items()}
    requests: dict[tuple[str, int], dict[str, np.ndarray]] = {}
    for t, plan in plans.items():
        for q, ids in plan.member_ids.items():
            member = requests.setdefault(("member", q), {})
            if not member:
                member.update(op=text("fields"), degraded=text("1"))
            member[f"ids/{t}"] = ids
        for h, (_, slots) in plan.parity.items():
            holder = requests.setdefault(("holder", h), {})
            if not holder:
                holder["op"] = text("parity_read")
            holder[f"slots/{t}"] = slots
    return plans, requests


def decode_degraded(
    placement: ParityPlacement,
    codec: ParityCodec,
    plans: Mapping[str, DecodePlan],
    got: Mapping[tuple[str, int], Mapping[str, np.ndarray]],
    dtypes: Callable[[str], Mapping[str, np.dtype]],
) -> dict[str, Fields]:
    """The rows of ``degraded_requests``' plans from the replies ``got`` (same keys): each
    holder's parity is brought up to the members' reads with the messages it lacked
    (``catch_up``), so a difference in flight costs no wait, then the members are taken out.
    ``dtypes(table)``: the fields and their dtypes."""
    out = {}
    for t, plan in plans.items():
        names = dtypes(t)
        parity = {h: {n: got["holder", h][f"{t}/{n}"] for n in names} for h in plan.parity}
        for h, (_, slots) in plan.parity.items():
            lacked = _lacked(got["holder", h], h, t, plan.member_ids, got)
            if lacked:
                parity[h] = {n: v.copy() for n, v in parity[h].items()}  # views: read-only
                catch_up(placement, codec, t, h, slots, parity[h], lacked)
        out[t] = plan.decode(
            codec,
            parity,
            {q: {n: got["member", q][f"{t}/{n}"] for n in names} for q in plan.member_ids},
            names,
        )
    return out


def _lacked(
    parity: Mapping[str, np.ndarray],
    holder: int,
    table: str,
    members: Iterable[int],
    got: Mapping[tuple[str, int], Mapping[str, np.ndarray]],
) -> list[TableDelta]:
    """The members' messages to ``holder`` (their parts for ``table``) that it had not
    applied when it read its parity: later than what it counts of their incarnation."""
    applied = read_ints({"keys": parity["applied/keys"], "values": parity["applied/values"]})
    epochs = read_ints({"keys": parity["epochs/keys"], "values": parity["epochs/values"]})
    out = []
    for q in members:
        reply = got["member", q]
        current = epochs.get(q) == int(reply["epoch"][0])
        seen = applied.get(q, 0) if current else 0  # a new incarnation: none of its yet
        head = f"flight/{holder}/"
        for key, ids in reply.items():
            if not (key.startswith(head) and key.endswith(f"/{table}/ids")):
                continue
            seq = int(key[len(head) :].split("/", 1)[0])
            if seq > seen:
                prefix = key[: -len("ids")] + "f/"
                fields = {k[len(prefix) :]: v for k, v in reply.items() if k.startswith(prefix)}
                out.append(TableDelta(table, ids, fields))
    return out


def state_of(fields: Fields) -> dict[str, np.ndarray]:
    """The optimizer state among ``fields`` (``state/<slot>``), by slot."""
    return {k[6:]: v for k, v in fields.items() if k.startswith("state/")}


def apply_updates(
    optimizer: Optimizer,
    ids: np.ndarray,
    fields: Fields,
    updates: Iterable[tuple[np.ndarray, np.ndarray]],
) -> Fields:
    """Decoded ``fields`` of ``ids`` with ``updates`` (ids, their gradients), not applied
    anywhere yet, applied in order: the reader sees them (a replacement's held updates, or a
    worker's own pushes held while its PS is away)."""
    state_names = [k for k in fields if k.startswith("state/")]
    for got, grads in updates:
        mine, at_ids, at_held = np.intersect1d(ids, got, return_indices=True)
        if mine.size == 0:
            continue
        rows = fields["row"][at_ids]
        state = {k[6:]: fields[k][at_ids] for k in state_names}
        optimizer.apply(rows, state, grads[at_held])
        fields["row"][at_ids] = rows
        for k in state_names:
            fields[k][at_ids] = state[k[6:]]
    return fields


@dataclass
class EcrmReads:
    """What a client needs to decode a lost PS's rows: the job's ``k``, each table's vocabulary
    size, the optimizer (held updates are replayed with the PS's own code)."""

    k: int
    vocab_sizes: Mapping[str, int]
    optimizer: Optimizer
    positional: frozenset[str] = frozenset()  # tables of raw ids: not decoded by a client
    codec: ParityCodec = field(default_factory=SumCodec)
    _placements: dict[int, ParityPlacement] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def placement(self, num_ps: int) -> ParityPlacement:
        """The placement of ``num_ps`` PS (computed once; ``warm`` computes it ahead)."""
        with self._lock:
            got = self._placements.get(num_ps)
            if got is None:
                got = self._placements[num_ps] = ParityPlacement(
                    num_ps, self.k, self.vocab_sizes, positional=self.positional
                )
        return got

    def warm(self, num_ps: int) -> None:
        """Compute the placement now (about 0.3 s per million ids), so that a lost PS's first
        decoded read does not pay for it."""
        self.placement(num_ps).warm()

    def dtypes(self, table: str) -> dict[str, np.dtype]:
        state = self.optimizer.init_state((0, 1), rows=True)
        return {"row": np.dtype(np.float32), **{f"state/{k}": v.dtype for k, v in state.items()}}


class LostPS:
    """PS ``index``, lost: the parts of pushes held for its replacement, and its rows decoded."""

    def __init__(self, index: int, num_ps: int, reads: EcrmReads, error: Exception) -> None:
        self.index = index
        self.error = error  # how it was lost
        self.reads = reads
        self.placement = reads.placement(num_ps)
        self.held: list[dict[str, np.ndarray]] = []
        """Its ``Push`` requests, in the order they were made."""
        self._updates: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}

    def hold(self, request: dict[str, np.ndarray]) -> None:
        """Keep a ``Push`` request (``key``, ``ids/<table>``, ``grad/<table>``, ``dgrad/...``)
        for the replacement; its rows' updates show in this worker's decoded reads."""
        self.held.append(request)
        for key, ids in request.items():
            if key.startswith("ids/") and ids.size:
                table = key[4:]
                self._updates.setdefault(table, []).append((ids, request[f"grad/{table}"]))

    def requests(
        self, ids_by_table: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, DecodePlan], dict[tuple[str, int], dict[str, np.ndarray]]]:
        """The ``Ecrm`` requests that read what decoding these rows needs (tables with ids).
        A positional table's rows cannot be: which position holds a raw id only its PS knew,
        so a read of one raises how the PS was lost (the caller waits for the replacement)."""
        wanted = {t: ids for t, ids in ids_by_table.items() if ids.size}
        if any(t in self.reads.positional for t in wanted):
            raise self.error
        return degraded_requests(self.placement, self.index, wanted)

    def rows(
        self,
        plans: Mapping[str, DecodePlan],
        got: Mapping[tuple[str, int], Mapping[str, np.ndarray]],
    ) -> dict[str, Fields]:
        """The decoded rows and optimizer state of ``plans``' ids, this worker's held updates
        applied (optimizer state put back in range first: a read can be off by an update in
        flight)."""
        reads = self.reads
        out = decode_degraded(self.placement, reads.codec, plans, got, reads.dtypes)
        for t, fields in out.items():
            reads.optimizer.clamp_state(state_of(fields))
            apply_updates(reads.optimizer, plans[t].ids, fields, self._updates.get(t, ()))
        return out
