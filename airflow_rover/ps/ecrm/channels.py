"""How ECRM's PS talk to each other: gRPC channels to the other PS of the job, and the ordered
channel from this PS to each of its parity holders."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import grpc
import numpy as np

from airflow_rover.core.ecrm import Fields, ParityDelta
from airflow_rover.core.ecrm.messages import encode_frame
from airflow_rover.core.job_tls import JobTLS
from airflow_rover.rpc import frames, ps_service
from airflow_rover.rpc.tls import grpc_channel

log = logging.getLogger(__name__)

MAX_FRAME_ENTRIES = 256  # messages per parity RPC: a backlog goes in several
LINGER_S = 0.1  # how long a channel lets messages gather: one RPC per frame, not per push
RETRY_S = 0.2


class Peers:
    """gRPC channels to the other PS of the job, by index (addresses change on replacement)."""

    def __init__(self, addresses: list[str], token: str, tls: JobTLS | None = None) -> None:
        self.addresses = list(addresses)
        self._token = token
        self._tls = tls
        self._channels: dict[str, grpc.Channel] = {}
        self._channels_lock = threading.Lock()

    def call(self, index: int, arrays: dict[str, np.ndarray], timeout: float = 60) -> Fields:
        address = self.addresses[index]
        with self._channels_lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = grpc_channel(address, self._tls, ps_service.CHANNEL_OPTIONS)
                self._channels[address] = channel
        stub = channel.unary_unary(ps_service.method_path("Ecrm"))
        reply = stub(
            frames.encode(arrays), metadata=ps_service.auth_metadata(self._token), timeout=timeout
        )
        return frames.decode(reply)

    def close(self) -> None:
        with self._channels_lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()


@dataclass
class _Entry:
    holder_epoch: int
    delta: ParityDelta | None
    key: int | None

    @property
    def nbytes(self) -> int:
        if self.delta is None:
            return 0
        return sum(
            part.ids.nbytes + sum(v.nbytes for v in part.fields.values())
            for part in self.delta.tables
        )


def _frame(queue: list[_Entry]) -> list[_Entry]:
    """The entries at the head of ``queue`` that go in one frame: at most
    ``MAX_FRAME_ENTRIES``, and no more than ``ps_service.PIECE_BYTES`` of rows but the first
    (a backlog of large pushes stays within what the holder takes in one request)."""
    size = 0
    for n, entry in enumerate(queue[:MAX_FRAME_ENTRIES]):
        size += entry.nbytes
        if n and size > ps_service.PIECE_BYTES:
            return queue[:n]
    return queue[:MAX_FRAME_ENTRIES]


class ParityChannel:
    """The ordered channel from this PS to one parity holder: a thread sends whatever is queued
    in one RPC and drops it only once the holder took it; a failed send is retried (the
    holder's replacement re-points the channel, and messages to the dead one are dropped)."""

    def __init__(
        self, peers: Peers, source: int, epoch: int, holder: int, holder_epoch: int
    ) -> None:
        self.peers = peers
        self.source = source  # this PS, incarnation ``epoch``
        self.epoch = epoch
        self.holder = holder
        self.holder_epoch = holder_epoch
        self._queue: list[_Entry] = []
        self._dense: Fields | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._urgent = False  # a rebuild waits for what is queued: send it without lingering
        self._thread = threading.Thread(
            target=self._run, name=f"parity-to-ps-{holder}", daemon=True
        )
        self._thread.start()

    def put(self, delta: ParityDelta | None, key: int | None) -> None:
        with self._cond:
            self._queue.append(_Entry(self.holder_epoch, delta, key))
            # Wake the sender only when it waits for work or a frame is full: while it lingers
            # or sends it sees the queue anyway, and a wake-up per push costs the pushing
            # thread a GIL hand-off (py-spy: a quarter of a PS's push time under ECRM).
            if len(self._queue) == 1 or len(self._queue) >= MAX_FRAME_ENTRIES:
                self._cond.notify()

    def put_dense(self, dense: Fields) -> None:
        with self._cond:
            self._dense = dense
            self._cond.notify()

    def retarget(self, holder_epoch: int) -> None:
        """The holder was replaced: what was queued for the dead one is dropped."""
        with self._cond:
            self.holder_epoch = holder_epoch
            self._queue = [e for e in self._queue if e.holder_epoch >= holder_epoch]
            self._cond.notify()

    def flush(self) -> None:
        """Send what is queued now (a rebuild is draining it)."""
        with self._cond:
            self._urgent = True
            self._cond.notify()

    def backlog(self) -> int:
        with self._cond:
            return len(self._queue)

    def in_flight(self) -> list[ParityDelta]:
        """Messages to the live holder not acknowledged yet (it may have applied some)."""
        with self._cond:
            return [
                e.delta
                for e in self._queue
                if e.delta is not None and e.holder_epoch == self.holder_epoch
            ]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and self._dense is None and not self._closed:
                    self._cond.wait()
                # Let a few pushes' messages gather: one RPC per frame, not per push.
                self._cond.wait_for(
                    lambda: self._closed or self._urgent or len(self._queue) >= MAX_FRAME_ENTRIES,
                    LINGER_S,
                )
                self._urgent = False
                if self._closed:
                    return
                entries = _frame(self._queue)
                dense = self._dense
                self._dense = None
                epoch = self.holder_epoch
            entries = [e for e in entries if e.holder_epoch == epoch]
            frame = encode_frame(
                self.source, self.epoch, [(e.delta, e.key) for e in entries], dense
            )
            frame["holder_epoch"] = np.array([epoch], dtype=np.int64)
            try:
                self.peers.call(self.holder, frame)
            except grpc.RpcError as exc:
                with self._cond:
                    if dense is not None and self._dense is None:
                        self._dense = dense
                    if self._closed:
                        return
                log.debug("parity to PS %d not delivered (%s); retrying", self.holder, exc.code())
                time.sleep(RETRY_S)
                continue
            with self._cond:
                sent = {id(e) for e in entries}
                self._queue = [e for e in self._queue if id(e) not in sent]
