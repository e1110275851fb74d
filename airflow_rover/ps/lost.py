"""A worker's view of a PS it lost under ECRM, until the replacement is announced.

The replacement takes a few hundred milliseconds to start, take over and be announced; ECRM's
workers do not wait for it (ECRM section 3.4): they read the lost rows by decoding them from
the parity holders and the group's other members, as the replacement itself does for rows it
has not rebuilt yet (``ps.ecrm.degraded_requests``), and hold their part of each push for the
replacement. A worker reads its own held updates (they are applied to what it decodes, in
order), not those another worker holds: the rows it reads miss at most the other workers'
updates of the gap, which asynchronous training tolerates.

The held pushes keep their batch keys, so delivering them is safe whatever the lost PS had
applied before it died: a batch its holders all knew is in the replacement's ledger and turned
away, any other is applied once.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from airflow_rover.core.ecrm import DecodePlan, Fields, ParityCodec, ParityPlacement, SumCodec
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.ps.ecrm import apply_updates, decode_degraded, degraded_requests


@dataclass
class EcrmReads:
    """What a client needs to decode a lost PS's rows: the job's ``k``, each table's vocabulary
    size, the optimizer (held updates are replayed with the PS's own code)."""

    k: int
    vocab_sizes: Mapping[str, int]
    optimizer: Optimizer
    codec: ParityCodec = field(default_factory=SumCodec)
    _layouts: dict[int, ParityPlacement] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def layout(self, num_ps: int) -> ParityPlacement:
        """The placement of ``num_ps`` PS (computed once; ``warm`` computes it ahead)."""
        with self._lock:
            got = self._layouts.get(num_ps)
            if got is None:
                got = self._layouts[num_ps] = ParityPlacement(num_ps, self.k, self.vocab_sizes)
        return got

    def warm(self, num_ps: int) -> None:
        """Compute the placement now (about 0.3 s per million ids), so that a lost PS's first
        decoded read does not pay for it."""
        self.layout(num_ps).warm()

    def dtypes(self, table: str) -> dict[str, np.dtype]:
        state = self.optimizer.init_state((0, 1), rows=True)
        return {"row": np.dtype(np.float32), **{f"state/{k}": v.dtype for k, v in state.items()}}


class LostPS:
    """PS ``index``, lost: the parts of pushes held for its replacement, and its rows decoded."""

    def __init__(self, index: int, num_ps: int, reads: EcrmReads, error: Exception) -> None:
        self.index = index
        self.error = error  # how it was lost
        self.reads = reads
        self.layout = reads.layout(num_ps)
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
        """The ``Ecrm`` requests that read what decoding these rows needs (tables with ids)."""
        wanted = {t: ids for t, ids in ids_by_table.items() if ids.size}
        return degraded_requests(self.layout, self.index, wanted)

    def rows(
        self,
        plans: Mapping[str, DecodePlan],
        got: Mapping[tuple[str, int], Mapping[str, np.ndarray]],
    ) -> dict[str, Fields]:
        """The decoded rows and optimizer state of ``plans``' ids, this worker's held updates
        applied (optimizer state put back in range first: a read can be off by an update in
        flight)."""
        reads = self.reads
        out = decode_degraded(self.layout, reads.codec, plans, got, reads.dtypes)
        for t, fields in out.items():
            reads.optimizer.clamp_state({k[6:]: v for k, v in fields.items() if k[:6] == "state/"})
            apply_updates(reads.optimizer, plans[t].ids, fields, self._updates.get(t, ()))
        return out
