"""One PS's partition of the model, and the lock under which it changes.

What the RPC handlers (``ps.server``) and ECRM (``ps.ecrm``) share: the tables, the dense
variables, the batch ledger and the apply lock, with no RPC of their own.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.ledger import BatchLedger
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.ps.tables import DenseStore, EmbeddingTable


class Partition:
    """PS ``index`` of ``num_ps``: its rows of every embedding group, the dense variables it
    owns and the batches it has applied."""

    def __init__(
        self,
        index: int,
        num_ps: int,
        embeddings: EmbeddingPlacement,
        optimizer: Optimizer,
        seed: int,
    ) -> None:
        self.index = index
        self.num_ps = num_ps
        self.tables = {
            g.name: EmbeddingTable(g.name, g.dim, g.vocab_size, seed, optimizer, g.index)
            for g in embeddings.groups
        }
        self.dense = DenseStore(optimizer)
        self.ledger = BatchLedger()
        # Held while a push is applied and while a checkpoint is taken, so a checkpoint never
        # holds half a push and its ledger names exactly the pushes its rows include.
        self._apply_lock = threading.Lock()

    def applying(self) -> AbstractContextManager[bool]:
        """The apply lock: a push, its ECRM propagation and a snapshot never interleave, and
        ECRM reads its send counters and locks rows for a rebuild at one point between pushes."""
        return self._apply_lock
