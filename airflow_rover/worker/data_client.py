"""A trainer's input from data workers: it leases shards as always, and has each prepared by a
data worker while it trains the one before.

The trainer keeps one shard more in hand than there are data workers to prepare them, each
fetched into a queue of ``capacity`` ready batches, and trains them in lease order. A call that
breaks (a data worker died or was drained) is asked again of another data worker from the
first batch the trainer lacks, and with none to ask the trainer prepares the batches itself
(``prepared_elements``, the data workers' own code): each batch keeps its key, so the PS ledgers
still see every batch once.
"""

from __future__ import annotations

import collections
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc

from airflow_rover.core.job_tls import JobTLS
from airflow_rover.core.ledger import NO_KEY
from airflow_rover.data.batch_ids import Element
from airflow_rover.rpc import data_service, master_api
from airflow_rover.rpc.master_client import MasterClient
from airflow_rover.worker.prefetch import put_unless_set
from airflow_rover.worker.shard_leases import NO_SHARD

log = logging.getLogger(__name__)

RETRY_AFTER_S = 10.0  # a data worker whose call broke is not asked again for this long
FETCH_THREADS = 8
WAIT_S = 0.2

LocalElements = Callable[[int, int], Iterator[Element]]
"""The elements of samples ``[start, end)`` prepared in this process."""

LeasedElement = tuple[Element, int, bool, int, int]
"""(element, shard id, last batch of its shard, batch key, PS set version)."""


@dataclass
class _End:
    error: BaseException | None = None


@dataclass
class ShardFetch:
    """One leased shard's batches as they are prepared, in order."""

    shard: master_api.ShardOut
    version: int
    batches: int
    capacity: int
    ready: queue.Queue[tuple[Element, int] | _End] = field(init=False)
    cancelled: threading.Event = field(default_factory=threading.Event)
    call: Any = None  # the data worker's call in progress (cancelled with the fetch)

    def __post_init__(self) -> None:
        self.ready = queue.Queue(self.capacity)

    def put(self, item: tuple[Element, int] | _End) -> bool:
        """Queue ``item`` (waits for room); False once the fetch is cancelled."""
        return put_unless_set(self.ready, item, self.cancelled, WAIT_S)

    def cancel(self) -> None:
        self.cancelled.set()
        call = self.call
        if call is not None:
            call.cancel()


class RemoteBatches:
    """The leased shards' elements, prepared by the job's data workers."""

    def __init__(
        self,
        node_id: str,
        master: MasterClient,
        token: str,
        tls: JobTLS | None,
        local: LocalElements,
        empty: Element,
        batch_size: int,
        capacity: int,
        stop: threading.Event,
        ps_set_version: Callable[[], int | None] = lambda: None,
        wake: threading.Event | None = None,
        keeps: Callable[[int], bool] | None = None,
    ) -> None:
        self.node_id, self.master = node_id, master
        self._token, self._tls = token, tls
        self.local, self.empty = local, empty
        self.batch_size, self.capacity = batch_size, capacity
        self.stop, self.wake = stop, wake
        self.ps_set_version = ps_set_version
        self.keeps = keeps or (lambda version: ps_set_version() in (None, version))
        self.addresses: list[str] = []
        self._clients: dict[str, data_service.DataWorkerClient] = {}
        self._broken: dict[str, float] = {}  # address -> when its call broke
        self._streams: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="fetch")
        self._pending: collections.deque[ShardFetch] = collections.deque()
        self.fetched_locally = 0  # batches this trainer prepared itself

    # -- what the trainer reads ----------------------------------------------------------------
    def ready_fill(self) -> float:
        """How full the queues of the shards in hand are (0..1)."""
        pending = list(self._pending)
        if not pending:
            return 0.0
        return sum(f.ready.qsize() for f in pending) / (self.capacity * len(pending))

    def __iter__(self) -> Iterator[LeasedElement]:
        ended, retry_at = False, 0.0
        try:
            while not self.stop.is_set():
                if not ended and time.monotonic() >= retry_at:
                    ended, waits = self._top_up()
                    retry_at = time.monotonic() + WAIT_S if waits else 0.0
                if not self._pending:
                    if ended:
                        return
                    yield self.empty, NO_SHARD, False, NO_KEY, self.ps_set_version() or 0
                    self._pause()
                    continue
                head = self._pending[0]
                if not self.keeps(head.version):  # the trainer moved on: the master requeued it
                    head.cancel()
                    self._pending.popleft()
                    continue
                try:
                    item = head.ready.get(timeout=WAIT_S)
                except queue.Empty:
                    continue
                if isinstance(item, _End):
                    self._pending.popleft()
                    if item.error is not None:
                        raise item.error
                    continue
                element, index = item
                last = index == head.batches - 1
                yield element, head.shard.shard_id, last, head.shard.first_key + index, head.version
        finally:
            self.close()

    def close(self) -> None:
        for fetch in self._pending:
            fetch.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for client in self._clients.values():
            client.close()

    def _pause(self) -> None:
        if self.wake is None:
            time.sleep(WAIT_S)
        elif self.wake.wait(WAIT_S):
            self.wake.clear()

    # -- leasing ahead -------------------------------------------------------------------------
    def _top_up(self) -> tuple[bool, bool]:
        """Lease until one shard more than there are data workers is in hand; returns (the
        queue is done, the master said wait)."""
        while len(self._pending) < len(self._usable()) + 1:
            reply = self.master.lease(self.node_id, self.ps_set_version())
            self.addresses = list(reply.data_workers)
            if reply.status == "done":
                return True, False
            if reply.status == "wait" or reply.shard is None:
                return False, True
            shard = reply.shard
            batches = -(-(shard.end - shard.start) // self.batch_size)
            fetch = ShardFetch(shard, reply.ps_set_version, batches, self.capacity)
            self._pending.append(fetch)
            self._pool.submit(self._fetch, fetch)
        return False, False

    def _usable(self) -> list[str]:
        now = time.monotonic()
        broken = self._broken
        return [a for a in self.addresses if now - broken.get(a, -RETRY_AFTER_S) >= RETRY_AFTER_S]

    def _pick(self) -> str | None:
        """The data worker with the fewest of this trainer's calls (None: there is none)."""
        with self._lock:
            usable = self._usable()
            if not usable:
                return None
            fewest = min(self._streams[a] for a in usable)
            address = random.choice([a for a in usable if self._streams[a] == fewest])
            self._streams[address] += 1
            return address

    def _client(self, address: str) -> data_service.DataWorkerClient:
        with self._lock:
            client = self._clients.get(address)
            if client is None:
                client = self._clients[address] = data_service.DataWorkerClient(
                    address, self._token, self._tls
                )
            return client

    # -- fetching one shard --------------------------------------------------------------------
    def _fetch(self, fetch: ShardFetch) -> None:
        """Fill ``fetch``'s queue, from data workers or here; any other error reaches the
        trainer through the queue."""
        index = 0
        try:
            while index < fetch.batches and not fetch.cancelled.is_set():
                address = self._pick()
                if address is None:
                    index = self._prepare_here(fetch, index)
                    break
                try:
                    index = self._from(address, fetch, index)
                except grpc.RpcError as exc:
                    if fetch.cancelled.is_set():
                        return
                    with self._lock:
                        self._broken[address] = time.monotonic()
                    log.warning(
                        "%s: data worker %s failed (%s) at batch %d of shard %d; asking "
                        "another for the rest",
                        self.node_id,
                        address,
                        exc.code(),
                        index,
                        fetch.shard.shard_id,
                    )
                finally:
                    with self._lock:
                        self._streams[address] -= 1
            fetch.put(_End())
        except BaseException as exc:  # the trainer raises it when it reaches this shard
            fetch.put(_End(exc))

    def _from(self, address: str, fetch: ShardFetch, index: int) -> int:
        """Batches ``index`` on from the data worker at ``address``; returns the next index."""
        shard = fetch.shard
        request = data_service.BatchesRequest(
            start=shard.start + index * self.batch_size,
            end=shard.end,
            first_key=shard.first_key + index,
            batch_size=self.batch_size,
            shard_id=shard.shard_id,
        )
        call = self._client(address).batches(request)
        fetch.call = call
        for frame in call:
            element, key = data_service.decode_batch(frame)
            if key != shard.first_key + index:
                raise RuntimeError(f"data worker {address} sent batch {key}, expected {index}")
            if not fetch.put((element, index)):
                return index
            index += 1
        return index

    def _prepare_here(self, fetch: ShardFetch, index: int) -> int:
        start = fetch.shard.start + index * self.batch_size
        for element in self.local(start, fetch.shard.end):
            if not fetch.put((element, index)):
                break
            index += 1
            self.fetched_locally += 1
        return index
