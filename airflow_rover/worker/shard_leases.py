"""Shard leasing: the batches of every shard the master hands this worker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from airflow_rover.core.ledger import NO_KEY
from airflow_rover.data.reader import Batch, SampleReader
from airflow_rover.rpc.master_client import MasterClient

NO_SHARD = -1


def leased_batches(
    node_id: str,
    reader: SampleReader,
    master: MasterClient,
    batch_size: int,
    stop: threading.Event,
    wait_s: float = 0.2,
    ps_set_version: Callable[[], int | None] = lambda: None,
    wake: threading.Event | None = None,
    keeps: Callable[[int], bool] | None = None,
) -> Iterator[tuple[Batch, int, bool, int, int]]:
    """(batch, shard id, last batch of its shard, batch key, PS set version) for every shard
    the master hands out (from where it resumes: a requeued shard skips batches every PS already
    applied), and an empty batch whenever the master has nothing to hand out yet (``wait``): the
    trainer then flushes its pending gradients, which may be exactly what completes the queue
    (or lets a PS resize begin). ``ps_set_version()``: that of the PS set the trainer uses now;
    the master hands no shard to a trainer of another PS set (one that has not noticed a PS
    change). ``wake``: cuts a wait short (the trainer learnt of a new PS set).
    ``keeps(version)``: whether the trainer still trains shards leased under that PS set
    (default: it is the trainer's; an ECRM replacement keeps the shards of the PS set before)."""
    if keeps is None:
        keeps = lambda version: ps_set_version() in (None, version)  # noqa: E731
    while not stop.is_set():
        reply = master.lease(node_id, ps_set_version())
        if reply.status == "done":
            return
        if reply.status == "wait" or reply.shard is None:
            yield reader.read(0, 0), NO_SHARD, False, NO_KEY, reply.ps_set_version
            if wake is None:
                time.sleep(wait_s)
            elif wake.wait(wait_s):
                wake.clear()
            continue
        shard = reply.shard
        samples = reader.read(shard.start, shard.end)
        for index, lo in enumerate(range(0, len(samples), batch_size)):
            if not keeps(reply.ps_set_version):
                break  # the trainer moved on (a lost PS is back): the master requeued the shard
            hi = min(lo + batch_size, len(samples))
            batch = samples[lo:hi]
            last = hi == len(samples)
            yield batch, shard.shard_id, last, shard.first_key + index, reply.ps_set_version
