"""The parameter-server process: serves pull/push of embedding rows and dense weights over gRPC.

Messages are ``ps.codec`` frames. Every call must carry the job's bearer token. A malformed or
non-finite update is rejected whole (nothing of it is applied) with INVALID_ARGUMENT.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np

from airflow_rover.core.embedding_layout import EmbeddingLayout
from airflow_rover.core.ledger import NO_KEY, BatchLedger
from airflow_rover.ps import codec, rpc
from airflow_rover.ps.optimizers import Optimizer
from airflow_rover.ps.tables import DenseStore, EmbeddingTable

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class ParameterServer:
    """One PS's partition of the model and the operations workers call on it."""

    def __init__(
        self, index: int, num_ps: int, layout: EmbeddingLayout, optimizer: Optimizer, seed: int
    ) -> None:
        self.index = index
        self.num_ps = num_ps
        self.tables = {
            g.name: EmbeddingTable(g.name, g.dim, g.vocab_size, seed, optimizer)
            for g in layout.groups
        }
        self.dense = DenseStore(optimizer)
        self.ledger = BatchLedger()
        self.pushes = 0
        # Held while a push is applied and while a checkpoint is taken, so a checkpoint never
        # holds half a push and its ledger names exactly the pushes its rows include.
        self._apply_lock = threading.Lock()

    def _table(self, name: str) -> EmbeddingTable:
        table = self.tables.get(name)
        if table is None:
            raise ValueError(f"unknown table {name!r}")
        return table

    def pull(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        create = bool(req["create"][0]) if "create" in req else True
        out: dict[str, np.ndarray] = {}
        for key, ids in req.items():
            if not key.startswith("ids/"):
                continue
            name = key[4:]
            state_ids = req.get(f"state_ids/{name}")
            if state_ids is not None and not create:
                raise ValueError("state_ids: only a training pull (create) returns row state")
            if state_ids is None:
                out[f"rows/{name}"] = self._table(name).lookup(ids, create=create)
                continue
            rows, row_state = self._table(name).lookup_with_state(ids, state_ids)
            out[f"rows/{name}"] = rows
            out.update({f"rstate/{name}/{k}": v for k, v in row_state.items()})
        if "dense" in req:
            known = int(req["dense_version"][0]) if "dense_version" in req else -1
            version, values, state = self.dense.read_versioned(known)
            out["dense_version"] = np.array([version], dtype=np.int64)
            out.update({f"dense/{k}": v for k, v in values.items()})
            for name, slots in state.items():
                out.update({f"dstate/{name}/{k}": v for k, v in slots.items()})
        return out

    def push(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sparse = [
            (self._table(k[4:]), ids, req[f"grad/{k[4:]}"])
            for k, ids in req.items()
            if k.startswith("ids/")
        ]
        dense = {k[6:]: g for k, g in req.items() if k.startswith("dgrad/")}
        key = int(req["key"][0]) if "key" in req else NO_KEY
        for table, ids, grads in sparse:  # validate everything before applying anything
            table.check_update(ids, grads)
        self.dense.check_update(dense)
        with self._apply_lock:
            if not self.ledger.admit(key):  # a retried batch this PS already applied
                return {"duplicate": np.ones(1, dtype=np.uint8)}
            for table, ids, grads in sparse:
                table.apply_gradients(ids, grads)
            if dense:
                self.dense.apply_gradients(dense)
            self.pushes += 1
        return {}

    def push_pull(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Apply the ``push/``-prefixed update (validated whole first), then serve the pull."""
        push = {k[5:]: v for k, v in req.items() if k.startswith("push/")}
        if push:
            self.push(push)
        return self.pull({k: v for k, v in req.items() if not k.startswith("push/")})

    def init_dense(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.dense.initialize({k[6:]: v for k, v in req.items() if k.startswith("dense/")})
        return {}

    def snapshot(self) -> dict[str, np.ndarray]:
        """Rows, optimizer state, dense weights and the batch ledger, at one point in time."""
        with self._apply_lock:
            arrays: dict[str, np.ndarray] = {}
            for name, table in self.tables.items():
                arrays.update({f"table/{name}/{k}": v for k, v in table.snapshot().items()})
            arrays.update(self.dense.snapshot())
            arrays.update(self.ledger.to_arrays())
            arrays["num_ps"] = np.array([self.num_ps], dtype=np.int64)
            arrays["ps_index"] = np.array([self.index], dtype=np.int64)
            return arrays

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        """Load a ``snapshot`` of the same partition (same PS index and count)."""
        saved = int(arrays["num_ps"][0]) if "num_ps" in arrays else self.num_ps
        if saved != self.num_ps:
            raise ValueError(f"checkpoint has {saved} PS partitions, the job has {self.num_ps}")
        index = int(arrays["ps_index"][0]) if "ps_index" in arrays else self.index
        if index != self.index:
            raise ValueError(f"checkpoint is partition {index}, this is PS {self.index}")
        for name, table in self.tables.items():
            prefix = f"table/{name}/"
            part = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
            if part:
                table.restore(part)
        self.dense.restore(arrays)
        self.ledger = BatchLedger.from_arrays(arrays)

    def ledger_info(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch keys this PS has applied and how many retried pushes it turned away."""
        with self._apply_lock:
            arrays = self.ledger.to_arrays()
        return {
            "applied": arrays["ledger/applied"],
            "rejected": np.array([int(arrays["ledger/rejected_counts"].sum())], dtype=np.int64),
        }

    def save(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Write this PS's partition to ``path`` (an .npz), atomically."""
        path = Path(req["path"].tobytes().decode())
        arrays = self.snapshot()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        return {"rows": np.array([sum(t.size for t in self.tables.values())], dtype=np.int64)}

    def stats(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {
            "rows": np.array([sum(t.size for t in self.tables.values())], dtype=np.int64),
            "pushes": np.array([self.pushes], dtype=np.int64),
        }

    def handlers(self) -> dict[str, Handler]:
        return {
            "Pull": self.pull,
            "Push": self.push,
            "PushPull": self.push_pull,
            "InitDense": self.init_dense,
            "Save": self.save,
            "Stats": self.stats,
            "Ledger": self.ledger_info,
        }


def _unary(handler: Handler, token: str) -> grpc.RpcMethodHandler:
    expected = f"Bearer {token}".encode()

    def call(request: bytes, context: grpc.ServicerContext) -> bytes:
        given = dict(context.invocation_metadata()).get("authorization", "")
        if not hmac.compare_digest(str(given).encode(), expected):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong job token")
        try:
            return codec.encode(handler(codec.decode(request)))
        except (ValueError, KeyError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # unreachable: abort raises

    return grpc.unary_unary_rpc_method_handler(call)


def start_server(
    ps: ParameterServer, token: str, host: str = "127.0.0.1", threads: int = 8
) -> tuple[grpc.Server, int]:
    """Start serving ``ps``; returns the server and the port it bound (0 picks a free one)."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads), options=rpc.CHANNEL_OPTIONS
    )
    handlers = {name: _unary(fn, token) for name, fn in ps.handlers().items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(rpc.SERVICE, handlers),))
    port = server.add_insecure_port(f"{host}:0")
    server.start()
    return server, port
