"""The input pipeline: leased shards' batches with their ids, computed ahead of training, here
or by the job's data workers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import numpy as np

from airflow_rover.core.job_tls import JobTLS
from airflow_rover.data.preprocessing import (
    Preprocess,
    checked,
    prepared_elements,
    unchanged,
)
from airflow_rover.data.reader import SampleReader
from airflow_rover.rpc.master_client import MasterClient
from airflow_rover.worker.data_client import LeasedElement, RemoteBatches
from airflow_rover.worker.prefetch import Prefetched
from airflow_rover.worker.ps_model import PSModel
from airflow_rover.worker.shard_leases import leased_batches

PREFETCH_BATCHES = 2


@dataclass(frozen=True)
class InputConfig:
    """How a trainer gets its batches: the job's preprocessing, and whether data workers
    prepare them (their calls carry the job's token, over its TLS)."""

    preprocess: Preprocess = unchanged
    preprocess_ref: str | None = None
    data_workers: bool = False
    token: str = ""
    tls: JobTLS | None = None
    ready_batches: int = 8


IN_PROCESS = InputConfig()


def input_pipeline(
    node_id: str,
    model: PSModel,
    reader: SampleReader,
    master: MasterClient,
    batch_size: int,
    stop: threading.Event,
    ps_set_version: Callable[[], int],
    wake: threading.Event | None = None,
    keeps: Callable[[int], bool] | None = None,
    inputs: InputConfig = IN_PROCESS,
) -> tuple[Iterator[dict[str, np.ndarray]], Callable[[], float]]:
    """The leased shards' batches as model inputs (numpy arrays, the dtypes the step function
    declares), made ahead on a thread of their own, and how full the queue of ready batches
    is (0..1); built once per worker (a loop against a relaunched PS trains on from it).
    ``ps_set_version()``: the version of the PS set the trainer is on (leases ask for it)."""
    leased: Iterator[LeasedElement]
    fill: Callable[[], float] = lambda: 0.0  # noqa: E731
    if inputs.data_workers:
        remote = RemoteBatches(
            node_id,
            master,
            inputs.token,
            inputs.tls,
            partial(
                _prepared_here, reader, inputs.preprocess, model, batch_size, inputs.preprocess_ref
            ),
            model.ids_element(reader.read(0, 0)),
            batch_size,
            inputs.ready_batches,
            stop,
            ps_set_version,
            wake,
            keeps,
        )
        leased, fill = iter(remote), remote.ready_fill
    else:
        prep, ref = inputs.preprocess, inputs.preprocess_ref
        leased = (
            (
                model.ids_element(checked(prep, b, reader.schema, ref)),
                shard_id,
                last,
                key,
                version,
            )
            for b, shard_id, last, key, version in leased_batches(
                node_id,
                reader,
                master,
                batch_size,
                stop,
                ps_set_version=ps_set_version,
                wake=wake,
                keeps=keeps,
            )
        )

    dtypes = {name: spec.dtype.as_numpy_dtype for name, spec in model.element_signature().items()}

    def elements() -> Iterator[dict[str, np.ndarray]]:
        """Each element with its lease's fields, every array in the dtype the step declares
        (no copy where it is already so)."""
        for element, shard_id, last, key, version in leased:
            fields = {
                **element,
                "shard_id": shard_id,
                "key": key,
                "last": last,
                "ps_set_version": version,
            }
            yield {name: np.asarray(value, dtype=dtypes[name]) for name, value in fields.items()}

    return Prefetched(elements(), PREFETCH_BATCHES, stop, f"input-{node_id}"), fill


def _prepared_here(
    reader: SampleReader,
    preprocess: Preprocess,
    model: PSModel,
    batch_size: int,
    ref: str | None,
    start: int,
    end: int,
) -> Iterator[dict[str, np.ndarray]]:
    return prepared_elements(reader, preprocess, model.encoder, start, end, batch_size, ref)
