"""The worker side of the PS protocol: split requests by owner, call all PS in parallel, merge."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from airflow_rover.core.checkpoint_files import PartDigest
from airflow_rover.core.ecrm.degraded import EcrmReads, LostPS
from airflow_rover.core.hashing import owner_of, partition_of
from airflow_rover.core.job_tls import JobTLS
from airflow_rover.core.ledger import NO_KEY
from airflow_rover.core.step_profile import StepProfile
from airflow_rover.rpc import frames, ps_service
from airflow_rover.rpc.tls import grpc_channel

LOST_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


@dataclass
class DenseReply:
    """Dense weights as a PushPull left them: each PS's version, and values plus optimizer
    state from the PS that had versions the caller did not know (``fresh``)."""

    versions: list[int]
    fresh: list[bool]
    values: dict[str, np.ndarray]
    state: dict[str, dict[str, np.ndarray]]


Push = tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]
"""(unique ids per table, their summed gradients per table, dense gradients by name)."""


@dataclass
class PushPullReply:
    rows: dict[str, np.ndarray]
    dense: DenseReply
    row_state: dict[str, dict[str, np.ndarray]]
    """Per table, the optimizer state of the requested ``state_ids``, in their order."""


@dataclass
class PendingPushPull:
    """A PushPull in flight (``PSClient.push_pull_async``); ``result()`` waits for every PS
    and merges their replies. A PS lost meanwhile (under ECRM) gets its part of the push held
    and its rows decoded from the others."""

    client: PSClient
    calls: list[Any]  # the gRPC futures, None for a PS lost before
    decoding: Callable[[], dict[str, dict[str, np.ndarray]]] | None  # that PS's rows
    requests: list[dict[str, np.ndarray]]
    masks: list[dict[str, Index]]
    state_masks: list[dict[str, Index]]
    pull_ids: dict[str, np.ndarray]
    state_ids: dict[str, np.ndarray]
    dense_versions: list[int]
    pushing: bool

    def result(self) -> PushPullReply:
        client = self.client
        profile = client.profile
        got: list[dict[str, np.ndarray] | None] = []
        for i, call in enumerate(self.calls):
            try:
                t0 = time.perf_counter_ns()
                message = None if call is None else call.result()
                t1 = time.perf_counter_ns()
                got.append(None if message is None else frames.decode(message))
                waited = call.wait_ns if isinstance(call, _Replied) else 0
                profile.add("rpc/PushPull/wait", t1 - t0 + waited)
                profile.add("rpc/PushPull/decode", time.perf_counter_ns() - t1)
            except grpc.RpcError as exc:
                if not client._may_lose(i, exc):
                    raise
                self._hold(i)
                got.append(None)
        lost = client.lost
        if lost is not None:
            index = lost.index
            if self.dense_versions[index] < 0:
                # the caller has none of its dense weights yet (it has just started):
                # without them there is nothing to train on until the replacement is up
                raise lost.error
            if self.decoding is None:  # lost during this call: one more round trip, once
                self.decoding = client._start_decoding(self._parts(index)[0])
            live = [r for r in got if r is not None]
            got[index] = _decoded_reply(
                *self._parts(index), self.decoding(), self.dense_versions[index], live[0]
            )
        replies = [r for r in got if r is not None]
        t_merge = time.perf_counter_ns()
        rows, values = client._merge_pull(replies, self.masks, self.pull_ids)
        dense_state: dict[str, dict[str, np.ndarray]] = {}
        for reply in replies:
            for key, value in reply.items():
                if key.startswith("dstate/"):
                    name, slot = key[7:].rsplit("/", 1)
                    dense_state.setdefault(name, {})[slot] = value
        versions = [
            int(r["dense_version"][0]) if "dense_version" in r else known
            for r, known in zip(replies, self.dense_versions, strict=True)
        ]
        fresh = [any(k.startswith("dense/") for k in r) for r in replies]
        row_state = {
            t: _merge_state(replies, self.state_masks, t, ids) for t, ids in self.state_ids.items()
        }
        profile.add("rpc/PushPull/merge", time.perf_counter_ns() - t_merge)
        return PushPullReply(rows, DenseReply(versions, fresh, values, dense_state), row_state)

    def _hold(self, i: int) -> None:
        if self.pushing:
            assert self.client.lost is not None
            self.client.lost.hold(_pushed(self.requests[i]))

    def _parts(self, i: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The pull ids and state ids PS ``i`` owns."""
        return _owned(self.pull_ids, self.masks[i]), _owned(self.state_ids, self.state_masks[i])


class _Replied:
    """A call made blocking, as the future of it would answer: ``result()`` returns the reply
    or raises the call's ``grpc.RpcError``; ``wait_ns`` is how long the call took."""

    def __init__(self, call: Callable[[], bytes]) -> None:
        start = time.perf_counter_ns()
        self._reply = b""
        self._error: grpc.RpcError | None = None
        try:
            self._reply = call()
        except grpc.RpcError as exc:
            self._error = exc
        self.wait_ns = time.perf_counter_ns() - start

    def result(self) -> bytes:
        if self._error is not None:
            raise self._error
        return self._reply


def _pushed(request: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The push in a PushPull request, as a Push request (what a lost PS is held)."""
    return {k[5:]: v for k, v in request.items() if k[:5] == "push/"}


def _owned(ids_by_table: dict[str, np.ndarray], mask: dict[str, Index]) -> dict[str, np.ndarray]:
    """The ids of each table that one PS owns (``mask``: its part of ``PSClient._split``)."""
    return {t: ids[mask[t]] for t, ids in ids_by_table.items()}


def _merge_state(
    replies: list[dict[str, np.ndarray]],
    masks: list[dict[str, Index]],
    table: str,
    ids: np.ndarray,
) -> dict[str, np.ndarray]:
    prefix = f"rstate/{table}/"
    out: dict[str, np.ndarray] = {}
    for i, reply in enumerate(replies):
        for key, value in reply.items():
            if key.startswith(prefix):
                slot = key[len(prefix) :]
                if slot not in out:
                    out[slot] = np.empty((ids.size, *value.shape[1:]), dtype=value.dtype)
                out[slot][masks[i][table]] = value
    return out


Index = np.ndarray | slice
"""Which of a table's ids a PS owns: a boolean mask, or every id when there is one PS."""


class PSClient:
    """Pull and push rows and dense weights across ``len(addresses)`` parameter servers."""

    def __init__(
        self,
        addresses: list[str],
        token: str,
        timeout_s: float = 60.0,
        channels: Mapping[str, grpc.Channel] | None = None,
        ecrm: EcrmReads | None = None,
        tls: JobTLS | None = None,
        profile: StepProfile | None = None,
    ) -> None:
        """``ecrm``: the job keeps ECRM parity, so a lost PS's rows can be decoded: PushPulls
        and pushes go on without it (``lost``) until the client is moved to its replacement.
        ``tls``: the job's certificate, the only one its PS are trusted with. ``profile``:
        where the PushPulls' encode, wait, decode and merge times are summed."""
        self.profile = profile or StepProfile()
        if not addresses:
            raise ValueError("addresses: at least one parameter server is needed")
        self.num_ps = len(addresses)
        self.addresses = list(addresses)
        self._token = token
        self._metadata = ps_service.auth_metadata(token)
        self._timeout = timeout_s
        self._tls = tls
        given = channels or {}
        self._channels = [
            given.get(a) or grpc_channel(a, tls, ps_service.CHANNEL_OPTIONS) for a in addresses
        ]
        self._stubs = [
            {m: ch.unary_unary(ps_service.method_path(m)) for m in ps_service.METHODS}
            for ch in self._channels
        ]
        self.ecrm = ecrm
        self.lost: LostPS | None = None
        """The PS this client lost (ECRM only): its rows are decoded, its pushes held."""

    def connected_to(self, addresses: list[str]) -> PSClient:
        """A client of another PS list with this one's token, timeout and TLS (own channels)."""
        return PSClient(addresses, self._token, self._timeout, ecrm=self.ecrm, tls=self._tls)

    def reconnect(self, addresses: list[str]) -> PSClient:
        """This client moved to another PS list (a relaunched PS, a resized job): the new
        client takes over the channels to the PS both lists name, still connected (a worker
        back from a lost PS connects only to its replacement); the others are closed, and
        this client is not to be used after."""
        both = zip(self.addresses, self._channels, strict=True)
        kept = {a: ch for a, ch in both if a in addresses}
        client = PSClient(
            addresses, self._token, self._timeout, kept, self.ecrm, self._tls, self.profile
        )
        self.close(keep=set(kept))
        return client

    def deliver(self, lost: LostPS, dense: Mapping[str, np.ndarray]) -> None:
        """Send the pushes another client held for a PS it lost to that PS's replacement (PS
        ``lost.index`` here), one after the other: in the order they were made, as the PS
        would have applied them (with one worker, training stays exactly sequential). Each
        keeps its batch key, so one the lost PS had applied (and its holders knew) is turned
        away. First ``dense`` (the caller's dense weights) is offered for the variables the
        PS owns: a replacement whose holders had no copy of them yet (a PS lost within a
        second of its start) takes these rather than none."""
        mine = {f"dense/{n}": v for n, v in dense.items() if self.dense_owner(n) == lost.index}
        if mine:
            self._call_one(lost.index, "InitDense", mine)
        for request in lost.held:
            self._call_one(lost.index, "Push", request)

    def _may_lose(self, index: int, exc: grpc.RpcError) -> bool:
        """Whether PS ``index`` failing with ``exc`` can be trained around (ECRM, the PS is
        gone, no other one is lost); if so it is ``lost`` from now on."""
        if self.ecrm is None or exc.code() not in LOST_CODES:
            return False
        if self.lost is None:
            self.lost = LostPS(index, self.num_ps, self.ecrm, exc)
        return self.lost.index == index

    def _start_decoding(
        self, ids_by_table: dict[str, np.ndarray]
    ) -> Callable[[], dict[str, dict[str, np.ndarray]]]:
        """Start the reads that decode the lost PS's rows ``ids_by_table`` (one ``Ecrm`` call
        per PS that has a part, all at once); the returned function waits and decodes."""
        lost = self.lost
        assert lost is not None
        plans, requests = lost.requests(ids_by_table)
        calls = {
            key: self._stubs[key[1]]["Ecrm"].future(
                frames.encode(req), metadata=self._metadata, timeout=self._timeout
            )
            for key, req in requests.items()
        }

        def decoded() -> dict[str, dict[str, np.ndarray]]:
            return lost.rows(plans, {key: frames.decode(c.result()) for key, c in calls.items()})

        return decoded

    def close(self, keep: Collection[str] = ()) -> None:
        """Close the channels, but those to ``keep`` (handed over to another client)."""
        for address, channel in zip(self.addresses, self._channels, strict=True):
            if address not in keep:
                channel.close()
        self._channels, self._stubs, self.addresses = [], [], []

    def _start_all(
        self, method: str, requests: list[dict[str, np.ndarray]], skip: int | None = None
    ) -> list[Any]:
        """Send request i to PS i, all in flight at once; returns the gRPC futures (None for
        PS ``skip``). A single call is made here, blocking (every caller waits for it at
        once): a future would start the channel's polling thread again, as none is in flight
        between a training loop's steps."""
        live = [i for i in range(len(requests)) if i != skip]
        if len(live) == 1:
            stub, body = self._stubs[live[0]][method], frames.encode(requests[live[0]])
            replied = _Replied(lambda: stub(body, metadata=self._metadata, timeout=self._timeout))
            return [replied if i == live[0] else None for i in range(len(requests))]
        return [
            None
            if i == skip
            else self._stubs[i][method].future(
                frames.encode(req), metadata=self._metadata, timeout=self._timeout
            )
            for i, req in enumerate(requests)
        ]

    def _call_all(self, method: str, requests: list[dict[str, np.ndarray]]) -> list[dict]:
        return [frames.decode(call.result()) for call in self._start_all(method, requests)]

    def _split(self, ids_by_table: dict[str, np.ndarray]) -> list[dict[str, Index]]:
        """Per-PS masks of each table's ids (ids are unique per table)."""
        if self.num_ps == 1:  # no hashing, and views instead of copies
            return [{table: slice(None) for table in ids_by_table}]
        masks: list[dict[str, Index]] = [{} for _ in range(self.num_ps)]
        for table, ids in ids_by_table.items():
            owner = partition_of(table, ids, self.num_ps)
            for i in range(self.num_ps):
                masks[i][table] = owner == i
        return masks

    def _pull_requests(
        self,
        ids_by_table: dict[str, np.ndarray],
        dense: bool,
        create: bool,
        dense_versions: list[int] | None = None,
    ) -> tuple[list[dict[str, np.ndarray]], list[dict[str, Index]]]:
        masks = self._split(ids_by_table)
        requests: list[dict[str, np.ndarray]] = []
        for i in range(self.num_ps):
            req = {f"ids/{t}": ids[masks[i][t]] for t, ids in ids_by_table.items()}
            req["create"] = np.array([create], dtype=np.uint8)
            if dense:
                req["dense"] = np.zeros(1, dtype=np.uint8)
                if dense_versions is not None:
                    req["dense_version"] = np.array([dense_versions[i]], dtype=np.int64)
            requests.append(req)
        return requests, masks

    def _merge_pull(
        self,
        replies: list[dict[str, np.ndarray]],
        masks: list[dict[str, Index]],
        ids_by_table: dict[str, np.ndarray],
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        rows: dict[str, np.ndarray] = {}
        for t, ids in ids_by_table.items():
            out = np.empty((ids.size, replies[0][f"rows/{t}"].shape[1]), dtype=np.float32)
            for i in range(self.num_ps):
                out[masks[i][t]] = replies[i][f"rows/{t}"]
            rows[t] = out
        dense_values: dict[str, np.ndarray] = {}
        for reply in replies:
            dense_values.update({k[6:]: v for k, v in reply.items() if k.startswith("dense/")})
        return rows, dense_values

    def _push_requests(
        self,
        ids_by_table: dict[str, np.ndarray],
        grads_by_table: dict[str, np.ndarray],
        dense_grads: dict[str, np.ndarray],
        key: int = NO_KEY,
        prefix: str = "",
    ) -> list[dict[str, np.ndarray]]:
        """Every PS gets a request, empty or not, so each records the batch key."""
        masks = self._split(ids_by_table)
        requests: list[dict[str, np.ndarray]] = [
            {f"{prefix}key": np.array([key], dtype=np.int64)} for _ in range(self.num_ps)
        ]
        for t, ids in ids_by_table.items():
            for i in range(self.num_ps):
                requests[i][f"{prefix}ids/{t}"] = ids[masks[i][t]]
                requests[i][f"{prefix}grad/{t}"] = grads_by_table[t][masks[i][t]]
        for name, grad in dense_grads.items():
            requests[owner_of(name, self.num_ps)][f"{prefix}dgrad/{name}"] = grad
        return requests

    def pull(
        self, ids_by_table: dict[str, np.ndarray], dense: bool = True, create: bool = True
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Rows for each table's unique ids (in the given order) and, optionally, dense weights."""
        requests, masks = self._pull_requests(ids_by_table, dense, create)
        return self._merge_pull(self._call_all("Pull", requests), masks, ids_by_table)

    def push(
        self,
        ids_by_table: dict[str, np.ndarray],
        grads_by_table: dict[str, np.ndarray],
        dense_grads: dict[str, np.ndarray],
        key: int = NO_KEY,
    ) -> None:
        """Send gradients (already summed per unique id) to the owners of the rows. ``key``:
        the batch they come from; a PS that already applied that batch ignores them. A lost
        PS's part is held (``lost``)."""
        t0 = time.perf_counter_ns()
        requests = self._push_requests(ids_by_table, grads_by_table, dense_grads, key)
        lost = self.lost
        if lost is not None:
            lost.hold(requests[lost.index])
        calls = self._start_all("Push", requests, skip=lost.index if lost else None)
        for i, call in enumerate(calls):
            if call is None:
                continue
            try:
                call.result()
            except grpc.RpcError as exc:
                if not self._may_lose(i, exc):
                    raise
                assert self.lost is not None
                self.lost.hold(requests[i])
        self.profile.add("rpc/Push", time.perf_counter_ns() - t0)

    def reshard(self, addresses: list[str]) -> list[dict[str, np.ndarray]]:
        """Every PS of this client (the old and the new PS set's together) hands the rows and
        dense variables it no longer owns under ``addresses`` to their new owners."""
        request = {
            "num_ps": np.array([len(addresses)], dtype=np.int64),
            "addresses": _text("\n".join(addresses)),
        }
        return self._call_all("Reshard", [request] * self.num_ps)

    def partial_save(self, directory: Path, variant: str, r: float) -> int:
        """CPR partial save: every PS writes its ``r`` most-used (``mfu``) or sampled (``ssu``)
        rows to ``directory/ps-<i>.npz``; returns the rows saved."""
        extra = {
            "mode": _text("partial"),
            "variant": _text(variant),
            "r": np.array([r], dtype=np.float64),
        }
        replies = self._call_all("Save", self._save_requests(directory, extra))
        return sum(int(reply["rows"][0]) for reply in replies)

    def forgive(self, keys_by_ps: list[set[int]]) -> None:
        """Partial recovery: PS i records ``keys_by_ps[i]`` as applied without their updates
        (its restored rows lost them; CPR does not train them again)."""
        requests = [
            {"ledger/forgive": np.array(sorted(keys), dtype=np.int64)} if keys else {}
            for keys in keys_by_ps
        ]
        self._call_all("Absorb", requests)

    def _ecrm_request(
        self, op: str, k: int, rows_per_lock: int, addresses: list[str], epochs: list[int]
    ) -> dict[str, np.ndarray]:
        return {
            "op": _text(op),
            "k": np.array([k], dtype=np.int64),
            "rows_per_lock": np.array([rows_per_lock], dtype=np.int64),
            "addresses": _text("\n".join(addresses)),
            "epochs": np.array(epochs, dtype=np.int64),
        }

    def ecrm_setup(
        self, k: int, rows_per_lock: int, addresses: list[str], epochs: list[int], encode: bool
    ) -> None:
        """Start ECRM on every PS (``ps.ecrm``); ``encode``: re-encode the parity from rows
        restored from a checkpoint (once every PS is set up, before anyone trains)."""
        request = self._ecrm_request("setup", k, rows_per_lock, addresses, epochs)
        self._call_all("Ecrm", [request] * self.num_ps)
        if encode:
            self._call_all("Ecrm", [{"op": _text("encode")}] * self.num_ps)

    def ecrm_rebuild(
        self, index: int, k: int, rows_per_lock: int, addresses: list[str], epochs: list[int]
    ) -> dict[str, np.ndarray]:
        """PS ``index`` (a replacement, started empty) rebuilds the lost one in the background."""
        request = self._ecrm_request("rebuild", k, rows_per_lock, addresses, epochs)
        return self._call_one(index, "Ecrm", request)

    def ecrm_status(self, index: int) -> dict[str, np.ndarray]:
        """How PS ``index``'s rebuild stands (``EcrmPeer.status``)."""
        return self._call_one(index, "Ecrm", {"op": _text("status")})

    def _call_one(self, index: int, method: str, request: dict[str, np.ndarray]) -> dict:
        reply = self._stubs[index][method](
            frames.encode(request), metadata=self._metadata, timeout=self._timeout
        )
        return frames.decode(reply)

    def stats(self) -> list[dict[str, np.ndarray]]:
        """Per PS: its rows, pushes applied and request profile (``StepProfile.to_arrays``)."""
        return self._call_all("Stats", [{} for _ in range(self.num_ps)])

    def ledgers(self) -> list[tuple[set[int], int]]:
        """Per PS: the batch keys it has applied, and how many retried pushes it turned away."""
        replies = self._call_all("Ledger", [{} for _ in range(self.num_ps)])
        return [({int(k) for k in r["applied"]}, int(r["rejected"][0])) for r in replies]

    def push_pull(
        self,
        push: Push | None,
        pull_ids: dict[str, np.ndarray],
        dense_versions: list[int],
    ) -> tuple[dict[str, np.ndarray], DenseReply]:
        """Apply the last step's gradients, then read the next step's rows, in one round trip
        per PS: the rows read already include this worker's update. Dense weights come back
        only from a PS whose dense version is not ``dense_versions[i]``."""
        reply = self.push_pull_async(push, pull_ids, dense_versions).result()
        return reply.rows, reply.dense

    def push_pull_async(
        self,
        push: Push | None,
        pull_ids: dict[str, np.ndarray],
        dense_versions: list[int],
        state_ids: dict[str, np.ndarray] | None = None,
        push_key: int = NO_KEY,
        dense: bool = True,
    ) -> PendingPushPull:
        """``push_pull`` started in the background; ``state_ids`` (per table, a subset of its
        pull ids) also reads those rows' optimizer state. ``dense=False``: no PS sends dense
        weights, whatever its version (the reply's versions are then ``dense_versions``). A
        lost PS (``lost``; one that fails now becomes it, under ECRM) gets no call: its part of
        the push is held, its rows are decoded from the others."""
        t0, cpu = time.perf_counter_ns(), time.thread_time_ns()
        state_ids = state_ids or {}
        requests, masks = self._pull_requests(pull_ids, dense, True, dense_versions)
        state_masks = self._split(state_ids)
        for i, req in enumerate(requests):
            for t, ids in state_ids.items():
                req[f"state_ids/{t}"] = ids[state_masks[i][t]]
        if push is not None:
            for req, push_req in zip(
                requests, self._push_requests(*push, key=push_key, prefix="push/"), strict=True
            ):
                req.update(push_req)
        lost = self.lost
        if lost is not None and push is not None:
            lost.hold(_pushed(requests[lost.index]))
        calls = self._start_all("PushPull", requests, skip=lost.index if lost else None)
        waited = sum(c.wait_ns for c in calls if isinstance(c, _Replied))  # a blocking call
        self.profile.add("rpc/PushPull/encode", time.perf_counter_ns() - t0 - waited)
        self.profile.add("rpc/PushPull/encode_cpu", time.thread_time_ns() - cpu)
        decoding = None
        if lost is not None:
            decoding = self._start_decoding(_owned(pull_ids, masks[lost.index]))
        return PendingPushPull(
            self,
            calls,
            decoding,
            requests,
            masks,
            state_masks,
            pull_ids,
            state_ids,
            dense_versions,
            push is not None,
        )

    def dense_owner(self, name: str) -> int:
        return owner_of(name, self.num_ps)

    def init_dense(self, values: dict[str, np.ndarray]) -> None:
        """Offer initial dense weights; each PS keeps the first offer it gets per variable."""
        requests: list[dict[str, np.ndarray]] = [{} for _ in range(self.num_ps)]
        for name, value in values.items():
            requests[owner_of(name, self.num_ps)][f"dense/{name}"] = value
        self._call_all("InitDense", requests)

    def save(self, directory: Path) -> int:
        """Every PS writes its partition to ``directory/ps-<i>.npz`` durably (checksummed)
        before replying; returns total rows saved."""
        return sum(
            int(r["rows"][0]) for r in self._call_all("Save", self._save_requests(directory))
        )

    def flash_save(self, directory: Path, owner: int = 0) -> list[FlashSnapshot]:
        """Every PS snapshots its partition into shared memory, replies, and persists it to
        ``directory/ps-<i>.npz`` in the background (``persist_status``). ``owner``: the pid
        of the master asking (a relaunched PS restores a newer snapshot only for it)."""
        extra = {"mode": _text("flash"), "owner": np.array([owner], dtype=np.int64)}
        replies = self._call_all("Save", self._save_requests(directory, extra))
        return [
            FlashSnapshot(
                rows=int(r["rows"][0]),
                bytes=int(r["bytes"][0]),
                pause_s=float(r["pause_s"][0]),
                save_s=float(r["save_s"][0]),
            )
            for r in replies
        ]

    def persist_status(self, directory: Path) -> list[PartStatus]:
        """Per PS: how the background write of its part of ``directory`` stands."""
        replies = self._call_all("Save", self._save_requests(directory, {"mode": _text("status")}))
        out = []
        for r in replies:
            digest = None
            if "sha256" in r:
                digest = PartDigest(r["sha256"].tobytes().decode(), int(r["bytes"][0]))
            error = r["error"].tobytes().decode() if "error" in r else ""
            out.append(
                PartStatus(_PERSIST_STATES.get(int(r["state"][0]), "unknown"), digest, error)
            )
        return out

    def _save_requests(
        self, directory: Path, extra: dict[str, np.ndarray] | None = None
    ) -> list[dict[str, np.ndarray]]:
        return [
            {"path": _text(str(directory / f"ps-{i}.npz")), **(extra or {})}
            for i in range(self.num_ps)
        ]


_PERSIST_STATES = {0: "unknown", 1: "persisting", 2: "done", 3: "failed"}


def _decoded_reply(
    pulled: dict[str, np.ndarray],
    state_ids: dict[str, np.ndarray],
    fields: dict[str, dict[str, np.ndarray]],
    dense_version: int,
    like: dict[str, np.ndarray],
) -> dict[str, np.ndarray]:
    """A lost PS's PushPull reply made of its decoded rows: ``rows/<t>`` and ``rstate/<t>/..``
    as it would have sent them, its dense version as the caller expects (the worker applies its
    own dense gradients meanwhile), no dense values. ``like``: a live PS's reply (row widths)."""
    reply = {"dense_version": np.array([dense_version], dtype=np.int64)}
    for t, ids in pulled.items():
        got = fields.get(t)
        if got is None:  # none of this table's ids are on the lost PS
            reply[f"rows/{t}"] = like[f"rows/{t}"][:0]
            continue
        reply[f"rows/{t}"] = got["row"]
        order = np.argsort(ids)  # where each of state_ids (a subset of ids) is in ids
        at = order[np.searchsorted(ids, state_ids.get(t, ids[:0]), sorter=order)]
        for name, value in got.items():
            if name.startswith("state/"):
                reply[f"rstate/{t}/{name[6:]}"] = value[at]
    return reply


def _text(value: str) -> np.ndarray:
    return np.frombuffer(value.encode(), dtype=np.uint8)


@dataclass(frozen=True)
class FlashSnapshot:
    """One PS's reply to a flash save: what it copied and how long pushes waited for it."""

    rows: int
    bytes: int
    pause_s: float
    save_s: float


@dataclass(frozen=True)
class PartStatus:
    """One PS's part of a checkpoint: ``unknown`` (not this PS's: it was relaunched),
    ``persisting``, ``done`` (with its digest) or ``failed`` (with the error)."""

    state: str
    digest: PartDigest | None
    error: str
