"""The data worker's gRPC service: a trainer's shard in, its ready batches out, in order."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc

from airflow_rover.core.job_tls import JobTLS
from airflow_rover.data.batch_ids import ElementEncoder
from airflow_rover.data.preprocessing import Preprocess, prepared_elements
from airflow_rover.data.reader import SampleReader
from airflow_rover.rpc import data_service
from airflow_rover.rpc.ps_service import MAX_MESSAGE_BYTES, TokenCheck
from airflow_rover.rpc.tls import add_port

log = logging.getLogger(__name__)

STREAMS = 8  # shards served at once (trainers fetch a few shards ahead each)


class Served:
    """What the worker has served: the heartbeat reports it to the master."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.batches = 0
        self.samples = 0
        self.busy_s = 0.0  # seconds spent preparing batches

    def add(self, samples: int, seconds: float) -> None:
        with self._lock:
            self.batches += 1
            self.samples += samples
            self.busy_s += seconds

    @property
    def ms_per_batch(self) -> float:
        with self._lock:
            return 1000.0 * self.busy_s / self.batches if self.batches else 0.0


class DataWorkerService:
    """Prepares the batches of one range per call: read, preprocess, encode, send. Stateless:
    a trainer whose call broke asks another data worker for the batches it still lacks."""

    def __init__(
        self,
        reader: SampleReader,
        preprocess: Preprocess,
        encoder: ElementEncoder,
        preprocess_ref: str | None = None,
    ) -> None:
        self.reader = reader
        self.preprocess = preprocess
        self.encoder = encoder
        self.preprocess_ref = preprocess_ref
        self.served = Served()

    def batches(self, message: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        try:
            request = data_service.BatchesRequest.decode(message)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return
        end = min(request.end, self.reader.num_samples)
        t0 = time.perf_counter()
        elements = prepared_elements(
            self.reader,
            self.preprocess,
            self.encoder,
            request.start,
            end,
            request.batch_size,
            self.preprocess_ref,
        )
        for index, element in enumerate(elements):
            frame = data_service.encode_batch(element, request.first_key + index)
            self.served.add(int(element["label"].shape[0]), time.perf_counter() - t0)
            if not context.is_active():
                return  # the trainer went away or cancelled
            yield frame
            t0 = time.perf_counter()


def start_server(
    service: DataWorkerService,
    token: str,
    host: str = "127.0.0.1",
    port: int = 0,
    tls: JobTLS | None = None,
) -> tuple[grpc.Server, int]:
    """Serve ``service`` on ``host:port`` (0: a free port) for callers with the job's token."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=STREAMS, thread_name_prefix="batches"),
        interceptors=[TokenCheck(token)],
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", data_service.REQUEST_BYTES),
        ],
        maximum_concurrent_rpcs=STREAMS * 4,
    )
    handler = grpc.unary_stream_rpc_method_handler(service.batches)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(data_service.SERVICE, {"Batches": handler}),)
    )
    bound = add_port(server, f"{host}:{port}", tls)
    server.start()
    return server, bound
