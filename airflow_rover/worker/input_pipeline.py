"""The input pipeline: leased shards' batches with their ids, computed ahead of training."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf

from airflow_rover.data.reader import SampleReader
from airflow_rover.rpc.master_client import MasterClient
from airflow_rover.worker.ps_model import PSModel
from airflow_rover.worker.shard_leases import leased_batches

PREFETCH_BATCHES = 2


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
) -> tf.data.Dataset:
    """The leased shards' batches as model inputs, prefetched; built once per worker (building
    one costs about 0.1 s, which a relaunched PS would otherwise add to every recovery).
    ``ps_set_version()``: the version of the PS set the trainer is on (leases ask for it)."""

    def elements() -> Iterator[dict[str, np.ndarray]]:
        batches = leased_batches(
            node_id,
            reader,
            master,
            batch_size,
            stop,
            ps_set_version=ps_set_version,
            wake=wake,
            keeps=keeps,
        )
        for batch, shard_id, last, key, version in batches:
            element = model.ids_element(batch)
            element["shard_id"] = np.array(shard_id, dtype=np.int64)
            element["key"] = np.array(key, dtype=np.int64)
            element["last"] = np.array(last)
            element["ps_set_version"] = np.array(version, dtype=np.int64)
            yield element

    return tf.data.Dataset.from_generator(
        elements, output_signature=model.element_signature()
    ).prefetch(PREFETCH_BATCHES)
