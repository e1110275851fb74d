"""The wire between a trainer and a data worker: one server-streaming call per shard.

A trainer asks for samples ``[start, end)`` of the shard it leased, ``batch_size`` at a time,
the first batch keyed ``first_key``; the data worker answers with one tensor frame per batch,
in order, each carrying its key. The request is a small tensor frame too; the job's token is
checked before it is read (``ps_service.TokenCheck``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from airflow_rover.core.job_tls import JobTLS
from airflow_rover.data.batch_ids import Element
from airflow_rover.rpc import frames
from airflow_rover.rpc.ps_service import MAX_MESSAGE_BYTES, auth_metadata
from airflow_rover.rpc.tls import grpc_channel

SERVICE = "rover.DataWorker"
BATCHES = f"/{SERVICE}/Batches"
REQUEST_BYTES = 4096  # a request is five numbers
KEY = "key"  # the batch key every reply frame carries besides the element


@dataclass(frozen=True)
class BatchesRequest:
    """Samples ``[start, end)`` as batches of ``batch_size``, the first keyed ``first_key``."""

    start: int
    end: int
    first_key: int
    batch_size: int
    shard_id: int = -1

    def encode(self) -> bytes:
        return frames.encode(
            {
                name: np.array([getattr(self, name)], np.int64)
                for name in ("start", "end", "first_key", "batch_size", "shard_id")
            }
        )

    @classmethod
    def decode(cls, message: bytes) -> BatchesRequest:
        fields = frames.decode(message)
        values = {name: int(frames.one(fields, name)) for name in fields}
        request = cls(**values)
        if not 0 <= request.start <= request.end or request.batch_size < 1:
            raise ValueError(f"bad range or batch size: {request}")
        return request


def encode_batch(element: Element, key: int) -> bytes:
    return frames.encode({**element, KEY: np.array([key], np.int64)})


def decode_batch(message: bytes) -> tuple[Element, int]:
    """The element and its key (the arrays are views of ``message``)."""
    element = frames.decode(message)
    key = int(frames.one(element, KEY))
    del element[KEY]
    return element, key


class DataWorkerClient:
    """A channel to one data worker."""

    def __init__(self, address: str, token: str, tls: JobTLS | None = None) -> None:
        self.address = address
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        self._channel = grpc_channel(address, tls, options)
        self._batches = self._channel.unary_stream(BATCHES)
        self._metadata = auth_metadata(token)

    def batches(self, request: BatchesRequest, timeout_s: float | None = None) -> Iterator[bytes]:
        """The reply frames, in order; ``cancel()`` on the returned call ends it early."""
        return self._batches(request.encode(), metadata=self._metadata, timeout=timeout_s)

    def close(self) -> None:
        self._channel.close()
