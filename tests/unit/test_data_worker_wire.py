"""A data worker behind its real gRPC server: the batches it serves are the ones a trainer
prepares itself, keyed from where the trainer asks, and only for the job's token."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from heavy_preprocess import crossed

from airflow_rover.core.spec import JobSpec
from airflow_rover.data.batch_ids import ElementEncoder
from airflow_rover.data.features import resolve_features
from airflow_rover.data.preprocessing import (
    PreprocessError,
    load_preprocess,
    prepared_elements,
    same_elements,
)
from airflow_rover.data.reader import SampleReader, open_dataset
from airflow_rover.data.synthetic import GeneratedDataset, SyntheticConfig, generate_dataset
from airflow_rover.dataworker.server import DataWorkerService, start_server
from airflow_rover.rpc import data_service

TOKEN = "data-token-0123456789"
BATCH = 100


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> GeneratedDataset:
    root = tmp_path_factory.mktemp("data")
    return generate_dataset(root, SyntheticConfig(num_train=1000, num_eval=100, seed=4))


@pytest.fixture(scope="module")
def reader(dataset: GeneratedDataset) -> SampleReader:
    return open_dataset(dataset.train_dir)


@pytest.fixture(scope="module")
def encoder(dataset: GeneratedDataset, reader: SampleReader) -> ElementEncoder:
    spec = JobSpec(job_id="wire", train_data=str(dataset.train_dir))
    return ElementEncoder(resolve_features(spec), [c.name for c in reader.schema.categorical])


@pytest.fixture(scope="module")
def address(reader: SampleReader, encoder: ElementEncoder) -> Iterator[str]:
    service = DataWorkerService(reader, crossed, encoder, "heavy_preprocess:crossed")
    server, port = start_server(service, TOKEN)
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


def fetch(address: str, request: data_service.BatchesRequest, token: str = TOKEN) -> list:
    client = data_service.DataWorkerClient(address, token)
    try:
        return [data_service.decode_batch(frame) for frame in client.batches(request)]
    finally:
        client.close()


def test_served_batches_are_the_ones_prepared_in_process(
    address: str, reader: SampleReader, encoder: ElementEncoder
) -> None:
    served = fetch(address, data_service.BatchesRequest(200, 650, 40, BATCH, shard_id=3))
    here = list(prepared_elements(reader, crossed, encoder, 200, 650, BATCH))
    assert [key for _, key in served] == [40, 41, 42, 43, 44]
    assert len(served) == len(here) == 5
    assert all(same_elements(a, b) for (a, _), b in zip(served, here, strict=True))
    assert [len(e["label"]) for e, _ in served] == [100, 100, 100, 100, 50]
    # the preprocessing really ran: the crossed column differs from the unprocessed one
    plain = list(prepared_elements(reader, load_preprocess(None), encoder, 200, 650, BATCH))
    assert not all(same_elements(a, b) for (a, _), b in zip(served, plain, strict=True))


def test_a_call_resumed_mid_shard_gives_the_same_later_batches(address: str) -> None:
    whole = fetch(address, data_service.BatchesRequest(0, 500, 10, BATCH))
    rest = fetch(address, data_service.BatchesRequest(300, 500, 13, BATCH))
    assert [k for _, k in rest] == [13, 14]
    assert all(same_elements(a, b) for (a, _), (b, _) in zip(whole[3:], rest, strict=True))


def test_a_caller_without_the_token_is_refused(address: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        fetch(address, data_service.BatchesRequest(0, 100, 0, BATCH), token="wrong")
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_bad_request_is_refused(address: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        fetch(address, data_service.BatchesRequest(500, 100, 0, BATCH))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_preprocess_that_breaks_the_columns_is_refused_by_name(
    reader: SampleReader, encoder: ElementEncoder
) -> None:
    def drops_a_column(batch):  # type: ignore[no-untyped-def]
        return type(batch)(batch.dense[:, 1:], batch.categorical, batch.label)

    with pytest.raises(PreprocessError, match="preprocess='x:y' returned 12 dense columns"):
        list(prepared_elements(reader, drops_a_column, encoder, 0, 100, BATCH, "x:y"))
    with pytest.raises(PreprocessError, match="cannot be imported"):
        load_preprocess("no_such_module_here:fn")


def test_path_of_fixture_module_is_importable_by_reference() -> None:
    assert load_preprocess("heavy_preprocess:crossed") is crossed
    assert Path(crossed.__code__.co_filename).name == "heavy_preprocess.py"
