"""The parameter-server process: serves pull/push of embedding rows and dense weights over gRPC.

Messages are ``rpc.frames`` frames. Every call must carry the job's bearer token, checked on its
metadata before its request is read (``rpc.ps_service.TokenCheck``). A malformed or non-finite
update is rejected whole (nothing of it is applied) with INVALID_ARGUMENT.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from airflow_rover.core.checkpoint_files import sync_file, write_npz
from airflow_rover.core.ecrm.messages import read_text
from airflow_rover.core.hashing import owner_of, partition_of
from airflow_rover.core.job_tls import JobTLS
from airflow_rover.core.ledger import NO_KEY, BatchLedger
from airflow_rover.core.step_profile import StepProfile
from airflow_rover.ps.ecrm import EcrmPeer, Replacement
from airflow_rover.ps.flash import DONE, FAILED, PERSISTING, FlashCheckpointer, Persist
from airflow_rover.ps.partition import Partition
from airflow_rover.ps.pieces import in_pieces
from airflow_rover.ps.tables import DenseStore, EmbeddingTable
from airflow_rover.rpc import frames, ps_service
from airflow_rover.rpc.tls import add_port, grpc_channel

log = logging.getLogger(__name__)
# Makes CPR partial saves durable off the request's path, one after the other (a started
# thread per save cost 0.6 ms of the save's 2-4 ms: its start waits for the GIL).
_SYNCER = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="partial-sync")


def partial_saves_synced() -> None:
    """Return once every partial save written so far in this process is durable."""
    _SYNCER.submit(lambda: None).result()


Handler = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
_PERSIST_CODES = {PERSISTING: 1, DONE: 2, FAILED: 3}


@dataclass
class _Frozen:
    """What ``ParameterServer._frozen`` hands out: live views, the ledger, the pause."""

    views: list[tuple[str, np.ndarray]]
    applied: np.ndarray  # the ledger's applied keys, unsorted: a view later admits never change
    rejected: collections.Counter[int]
    pause_s: float = field(default=0.0)


def _live_views(
    tables: Iterable[EmbeddingTable], dense: DenseStore
) -> list[tuple[str, np.ndarray]]:
    """Every array of a snapshot, as views of the live state (valid under the locks)."""
    out: list[tuple[str, np.ndarray]] = []
    for table in tables:
        n, prefix = table.size, f"table/{table.name}/"
        out += [(f"{prefix}ids", table.live_ids), (f"{prefix}rows", table.rows[:n])]
        out.append((f"{prefix}counts", table.counts[:n]))
        out.append((f"{prefix}seen", table.seen[:n]))
        out += [(f"{prefix}state/{k}", v[:n]) for k, v in table.state.items()]
    out += [(f"dense/{name}", value) for name, value in dense.values.items()]
    for name, slots in dense.state.items():
        out += [(f"dstate/{name}/{k}", v) for k, v in slots.items()]
    out.append(("dense_version", np.array([dense.version], dtype=np.int64)))
    return out


def _dense_var(key: str) -> str | None:
    """The dense variable a snapshot key belongs to (``dense/<var>``, ``dstate/<var>/<slot>``)."""
    if key.startswith("dense/"):
        return key[6:]
    if key.startswith("dstate/"):
        return key[7:].rsplit("/", 1)[0]
    return None


def _persist_reply(job: Persist | None) -> dict[str, np.ndarray]:
    reply = {"state": np.array([_PERSIST_CODES.get(job.state, 0) if job else 0], np.int64)}
    if job is not None and job.digest is not None:
        reply["sha256"] = np.frombuffer(job.digest.sha256.encode(), dtype=np.uint8)
        reply["bytes"] = np.array([job.digest.bytes], dtype=np.int64)
    if job is not None and job.error:
        reply["error"] = np.frombuffer(job.error.encode(), dtype=np.uint8)
    return reply


class ParameterServer(Partition):
    """One PS's partition of the model and the operations workers call on it."""

    pushes: int = 0
    """Pushes applied so far (``stats``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.profile = StepProfile()
        """Where requests spend their time: decode, table ops, encode (``Stats`` sends it)."""

    def _table(self, name: str) -> EmbeddingTable:
        table = self.tables.get(name)
        if table is None:
            raise ValueError(f"unknown table {name!r}")
        return table

    def pull(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        create = bool(frames.one(req, "create")) if "create" in req else True
        out: dict[str, np.ndarray] = {}
        wanted = {key[4:]: ids for key, ids in req.items() if key.startswith("ids/")}
        pending = {}  # ECRM: rows this replacement has not rebuilt yet, per table
        if self.ecrm is not None:
            self.ecrm.wait_ready(wanted)
            for name, ids in wanted.items():
                mask = self.ecrm.pending(name, ids)
                if mask is not None:
                    pending[name] = mask
        decoded = (
            self.ecrm.degraded_reads({n: wanted[n][m] for n, m in pending.items()})
            if self.ecrm is not None and pending
            else {}
        )
        for name, ids in wanted.items():
            state_ids = req.get(f"state_ids/{name}")
            if state_ids is not None and not create:
                raise ValueError("state_ids: only a training pull (create) returns row state")
            if name in pending:
                out.update(
                    self._degraded_pull(name, ids, pending[name], decoded[name], create, state_ids)
                )
                continue
            if state_ids is None:
                out[f"rows/{name}"] = self._table(name).lookup(ids, create=create)
                continue
            rows, row_state = self._table(name).lookup_with_state(ids, state_ids)
            out[f"rows/{name}"] = rows
            out.update({f"rstate/{name}/{k}": v for k, v in row_state.items()})
        if "dense" in req:
            known = int(frames.one(req, "dense_version")) if "dense_version" in req else -1
            version, values, state = self.dense.read_versioned(known)
            out["dense_version"] = np.array([version], dtype=np.int64)
            out.update({f"dense/{k}": v for k, v in values.items()})
            for name, slots in state.items():
                out.update({f"dstate/{name}/{k}": v for k, v in slots.items()})
        return out

    def _degraded_pull(
        self,
        name: str,
        ids: np.ndarray,
        pending: np.ndarray,
        decoded: dict[str, np.ndarray],
        create: bool,
        state_ids: np.ndarray | None,
    ) -> dict[str, np.ndarray]:
        """A pull touching rows a replacement has not rebuilt yet (``ps.ecrm``): those are
        ``decoded`` from parity (not created here: the rebuild writes them), the rest read as
        usual."""
        table = self._table(name)
        rows = np.empty((ids.size, table.dim), dtype=np.float32)
        rows[pending] = decoded["row"]
        rest = ids[~pending]
        out: dict[str, np.ndarray] = {}
        if state_ids is None:
            rows[~pending] = table.lookup(rest, create=create)
        else:
            in_rest = np.isin(state_ids, rest)
            got, state = table.lookup_with_state(rest, state_ids[in_rest])
            rows[~pending] = got
            lost = ids[pending]
            order = np.argsort(lost)
            where = order[np.searchsorted(lost, state_ids[~in_rest], sorter=order)]
            for k, v in state.items():
                full = np.empty((state_ids.size, *v.shape[1:]), dtype=v.dtype)
                full[in_rest] = v
                full[~in_rest] = decoded[f"state/{k}"][where]
                out[f"rstate/{name}/{k}"] = full
        out[f"rows/{name}"] = rows
        return out

    def push(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sparse = [
            (self._table(k[4:]), ids, req[f"grad/{k[4:]}"])
            for k, ids in req.items()
            if k.startswith("ids/")
        ]
        dense = {k[6:]: g for k, g in req.items() if k.startswith("dgrad/")}
        key = int(frames.one(req, "key")) if "key" in req else NO_KEY
        t0 = time.perf_counter_ns()
        for table, ids, grads in sparse:  # validate everything before applying anything
            table.check_update(ids, grads)
        self.dense.check_update(dense)
        t1 = time.perf_counter_ns()
        self.profile.add("ps/push/check", t1 - t0)
        if self.ecrm is not None:  # outside the apply lock: a rebuild takes it
            self.ecrm.wait_ready(table.name for table, _, _ in sparse)
        with self.applying(), self.profile.phase("ps/push/apply"):
            if not self.ledger.admit(key):  # a retried batch this PS already applied
                return {"duplicate": np.ones(1, dtype=np.uint8)}
            if self.ecrm is not None:  # ECRM: the differences go to the parity holders
                self.ecrm.apply_push(sparse, key)
            else:
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
        with self.profile.phase("ps/pull"):
            return self.pull({k: v for k, v in req.items() if not k.startswith("push/")})

    def init_dense(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.dense.initialize({k[6:]: v for k, v in req.items() if k.startswith("dense/")})
        return {}

    def snapshot(self) -> dict[str, np.ndarray]:
        """Rows, optimizer state, dense weights and the batch ledger, at one point in time."""
        with self._frozen() as frozen:
            arrays = {name: np.array(view) for name, view in frozen.views}
        arrays.update(self._tail_arrays(frozen))
        return arrays

    @contextlib.contextmanager
    def _frozen(self) -> Iterator[_Frozen]:
        """Views of the live state (and a copy of the ledger) that no push, pull or dense
        update changes while the block runs: pushes wait for it, so keep it to a copy."""
        with self.applying():
            start = time.perf_counter()
            with contextlib.ExitStack() as stack:
                for table in self.tables.values():
                    stack.enter_context(table.holding())
                stack.enter_context(self.dense.holding())
                # The ledger's log: a view no later push changes (no set is walked here).
                applied = self.ledger.applied_keys()
                rejected = collections.Counter(self.ledger.rejected)
                frozen = _Frozen(_live_views(self.tables.values(), self.dense), applied, rejected)
                try:
                    yield frozen
                finally:
                    frozen.views = []
            frozen.pause_s = time.perf_counter() - start

    def _tail_arrays(self, frozen: _Frozen, sort: bool = True) -> dict[str, np.ndarray]:
        """The ledger (as ``BatchLedger.to_arrays`` writes it, its applied keys in log order
        unless ``sort``) and the partition's identity."""
        ledger = BatchLedger()
        ledger.rejected = frozen.rejected
        arrays = ledger.to_arrays()
        arrays["ledger/applied"] = np.sort(frozen.applied) if sort else frozen.applied
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

    def restore_repartitioned(self, parts: list[dict[str, np.ndarray]]) -> None:
        """Load this PS's rows and dense variables from a checkpoint of another PS count (the
        job was resized after it): each part's rows this PS owns now. Its ledger is the
        batches every part had applied (parts saved while workers trained may differ by the
        batches in flight; those are trained again)."""
        ledgers = []
        for arrays in parts:
            for name, table in self.tables.items():
                prefix = f"table/{name}/"
                part = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
                if part:
                    mine = partition_of(name, part["ids"].astype(np.int64), self.num_ps)
                    table.absorb({k: v[mine == self.index] for k, v in part.items()})
            mine_dense = {
                k: v
                for k, v in arrays.items()
                if (var := _dense_var(k)) is not None and owner_of(var, self.num_ps) == self.index
            }
            self.dense.restore(mine_dense)
            ledgers.append(BatchLedger.from_arrays(arrays).applied)
        self.ledger = BatchLedger()
        self.ledger.applied = set.intersection(*ledgers) if ledgers else set()

    def ledger_info(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch keys this PS has applied and how many retried pushes it turned away."""
        with self.applying():
            arrays = self.ledger.to_arrays()
        return {
            "applied": arrays["ledger/applied"],
            "rejected": np.array([int(arrays["ledger/rejected_counts"].sum())], dtype=np.int64),
        }

    token: str = ""
    """The job token, for the calls this PS makes to the others (a resize's row hand-over)."""
    tls: JobTLS | None = None
    """The job's certificate: this PS serves with it, and trusts it in the others."""

    def reshard(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Go from this job's PS count to ``num_ps`` (``addresses``: the new PS set, in
        order): every row and dense variable whose owner changes (``core.hashing``: only those
        travel) is removed here and handed to its new owner's ``Absorb`` with this PS's batch
        ledger (a new PS adopts it). Called on every PS of both sets while no worker trains;
        the rows are copied out under the locks and sent after them, so two PS handing rows to
        each other cannot deadlock. They go in pieces (``ps.pieces``), the first with the
        ledger."""
        num_ps = int(frames.one(req, "num_ps"))
        addresses = req["addresses"].tobytes().decode().split("\n")
        if num_ps < 1 or len(addresses) != num_ps:
            raise ValueError(f"reshard: {len(addresses)} addresses for num_ps={num_ps}")
        started = time.perf_counter()
        with self.applying():
            outgoing: list[dict[str, np.ndarray]] = [{} for _ in range(num_ps)]
            for name, table in self.tables.items():

                def moving(ids: np.ndarray, name: str = name) -> np.ndarray:
                    return partition_of(name, ids, num_ps) != self.index

                popped = table.pop_rows(moving)
                owners = partition_of(name, popped["ids"], num_ps)
                for dest in np.unique(owners):
                    mask = owners == dest
                    outgoing[dest].update({f"table/{name}/{k}": v[mask] for k, v in popped.items()})
            for var in [n for n in self.dense.values if owner_of(n, num_ps) != self.index]:
                outgoing[owner_of(var, num_ps)].update(self.dense.pop([var]))
            applied = np.sort(np.fromiter(self.ledger.applied, np.int64, len(self.ledger.applied)))
            self.num_ps = num_ps
        moved_rows = sum(v.shape[0] for o in outgoing for k, v in o.items() if k.endswith("/ids"))
        for dest, arrays in enumerate(outgoing):
            if dest != self.index:  # even with no rows: a new PS needs the ledger
                arrays["ledger/applied"] = applied
                self._hand_over(addresses[dest], arrays)
        return {
            "moved_rows": np.array([moved_rows], dtype=np.int64),
            "seconds": np.array([time.perf_counter() - started], dtype=np.float64),
        }

    def _hand_over(self, address: str, arrays: dict[str, np.ndarray]) -> None:
        """``arrays`` to the PS at ``address``'s ``Absorb``, in pieces its limit takes."""
        with grpc_channel(address, self.tls, ps_service.CHANNEL_OPTIONS) as channel:
            absorb = channel.unary_unary(ps_service.method_path("Absorb"))
            metadata = ps_service.auth_metadata(self.token)
            for piece in in_pieces(arrays, ps_service.PIECE_BYTES):
                absorb(frames.encode(piece), metadata=metadata, timeout=120)

    def absorb(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Rows and dense variables another PS hands over in a resize (``reshard``). A PS with
        an empty ledger (new in this PS set) adopts the sender's: every PS has applied the
        same batches once the workers have paused."""
        with self.applying():
            for name, table in self.tables.items():
                prefix = f"table/{name}/"
                part = {k[len(prefix) :]: v for k, v in req.items() if k.startswith(prefix)}
                if part:
                    table.absorb(part)
            dense = {k: v for k, v in req.items() if k.startswith(("dense/", "dstate/"))}
            if dense:
                self.dense.restore(dense)
            if not self.ledger.applied and "ledger/applied" in req:
                self.ledger.applied.update(int(k) for k in req["ledger/applied"])
            if "ledger/forgive" in req:  # partial recovery: these updates are lost here
                self.ledger.applied.update(int(k) for k in req["ledger/forgive"])
        return {}

    flash: FlashCheckpointer | None = None
    """This PS's shared-memory slot and persister (``ps.flash``); made on first use."""

    def save(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Save this PS's partition to ``path`` (a checksummed .npz), by ``mode``:

        - ``sync`` (default; the trained model): write it durably, then reply;
        - ``flash`` (checkpoints): copy the state into shared memory (pushes wait only for
          that copy), reply, and persist it in the background;
        - ``partial``: a CPR partial save (``variant`` mfu or ssu, fraction ``r``) of this
          PS's most-used or sampled rows, written durably before the reply;
        - ``status``: how the background persist of ``path`` stands (``state``: 0 unknown,
          1 persisting, 2 done with ``sha256`` and ``bytes``, 3 failed with ``error``).
        """
        path = Path(req["path"].tobytes().decode())
        mode = req["mode"].tobytes().decode() if "mode" in req else "sync"
        if mode != "status" and self.ecrm is not None and self.ecrm.pending_rebuild:
            raise ValueError("save: this PS is still rebuilding its rows (ECRM); save later")
        rows = np.array([sum(t.size for t in self.tables.values())], dtype=np.int64)
        if mode == "sync":
            write_npz(path, self.snapshot().items())
            return {"rows": rows}
        if mode == "status":
            return _persist_reply(self.flash.status(path) if self.flash else None)
        if mode == "partial":  # CPR-MFU/SSU: the chosen rows only, written before the reply
            variant = req["variant"].tobytes().decode()
            saved = self.partial_save(path, variant, float(frames.one(req, "r")))
            return {"rows": np.array([saved], dtype=np.int64)}
        if mode != "flash":
            raise ValueError(f"save mode {mode!r}: expected sync, flash, partial or status")
        if self.flash is None:  # a PS started outside ``ps.__main__``: same slot it would use
            self.flash = FlashCheckpointer.for_job(path.parent.parent, self.index)
        flash = self.flash
        flash.begin(self._state_bytes())
        with self._frozen() as frozen:  # all of the snapshot: its pause is the copy
            flash.copy(frozen.views)
            # The ledger's keys as logged (one array copy); the persister sorts them.
            flash.copy(self._tail_arrays(frozen, sort=False).items())
        owner = int(frames.one(req, "owner")) if "owner" in req else 0
        times = flash.finish(path, owner, frozen.pause_s, sort=("ledger/applied",))
        return {
            "rows": rows,
            "bytes": np.array([times.bytes], dtype=np.int64),
            "pause_s": np.array([times.pause_s], dtype=np.float64),
            "save_s": np.array([times.save_s], dtype=np.float64),
        }

    def partial_save(self, path: Path, variant: str, r: float) -> int:
        """A CPR partial save: every table's ``r`` most-used (``mfu``) or sampled (``ssu``)
        rows with their optimizer state, in one file; returns the rows saved."""
        arrays: dict[str, np.ndarray] = {}
        for name, table in self.tables.items():
            part = table.partial_rows(variant, r)
            arrays.update({f"table/{name}/{k}": v for k, v in part.items()})
        # The fsyncs (a fixed 1-5 ms a file, more than the rows of a small save) run in the
        # background: a save cut short by a machine crash fails its checksum and is skipped.
        write_npz(path, arrays.items(), durable=False)
        _SYNCER.submit(sync_file, path)
        return sum(v.shape[0] for k, v in arrays.items() if k.endswith("/ids"))

    def _state_bytes(self) -> int:
        """About what a snapshot takes now (read without locks: an estimate)."""
        total = sum(v.nbytes for _, v in _live_views(self.tables.values(), self.dense))
        return total + 8 * (len(self.ledger.applied) + 2 * len(self.ledger.rejected)) + 4096

    ecrm: EcrmPeer | None = None
    """ECRM's parity and rebuild (``ps.ecrm``), once the master set it up."""

    def ecrm_call(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """ECRM operations (``ps.ecrm``): ``setup`` and ``rebuild`` (on a replacement) start
        it with the placement the master gives; every other op goes to ``EcrmPeer.handle``."""
        op = read_text(req["op"])
        if op in ("setup", "rebuild"):
            if self.ecrm is not None:
                self.ecrm.close()
            args = (
                self,
                int(frames.one(req, "k")),
                int(frames.one(req, "rows_per_lock")),
                read_text(req["addresses"]).split("\n"),
                [int(e) for e in req["epochs"]],
                self.token,
                self.tls,
            )
            if op == "rebuild":
                replacement = Replacement(*args)
                self.ecrm = replacement
                return replacement.start_rebuild()
            self.ecrm = EcrmPeer(*args)
            self.ecrm.send_ledger()
            return {}
        if self.ecrm is None:
            raise ValueError(f"ecrm op {op!r}: ECRM is not set up on PS {self.index}")
        return self.ecrm.handle(req)

    def stats(self, req: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {
            "rows": np.array([sum(t.size for t in self.tables.values())], dtype=np.int64),
            "pushes": np.array([self.pushes], dtype=np.int64),
            **self.profile.to_arrays(),
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
            "Reshard": self.reshard,
            "Absorb": self.absorb,
            "Ecrm": self.ecrm_call,
        }


def _unary(handler: Handler, name: str, profile: StepProfile) -> grpc.RpcMethodHandler:
    """The handler of a call whose token ``ps_service.TokenCheck`` has checked already."""

    def call(request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            t0 = time.perf_counter_ns()
            req = frames.decode(request)
            t1 = time.perf_counter_ns()
            reply = handler(req)
            t2 = time.perf_counter_ns()
            out = frames.encode(reply)
            profile.add(f"ps/{name}/decode", t1 - t0)
            profile.add(f"ps/{name}/handle", t2 - t1)
            profile.add(f"ps/{name}/encode", time.perf_counter_ns() - t2)
            return out
        except (ValueError, KeyError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # unreachable: abort raises

    return grpc.unary_unary_rpc_method_handler(call)


def start_server(
    ps: ParameterServer,
    token: str,
    host: str = "127.0.0.1",
    threads: int = ps_service.SERVER_THREADS,
    port: int = 0,
    receive_bytes: int = ps_service.MAX_MESSAGE_BYTES,
    tls: JobTLS | None = None,
) -> tuple[grpc.Server, int]:
    """Start serving ``ps`` on ``host:port``; returns the server and the port it bound (0 picks a
    free one). A call without the token is refused before its request is read, and a request
    over ``receive_bytes`` (a job's PS: ``ps_service.receive_limit``) as it arrives. With
    ``tls`` (the job's certificate and key) it serves TLS only."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads),
        interceptors=[ps_service.TokenCheck(token)],
        options=ps_service.server_options(receive_bytes),
    )
    ps.token, ps.tls = token, tls
    handlers = {name: _unary(fn, name, ps.profile) for name, fn in ps.handlers().items()}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(ps_service.SERVICE, handlers),)
    )
    port = add_port(server, f"{host}:{port}", tls)
    server.start()
    return server, port
