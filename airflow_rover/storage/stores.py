"""Open the checkpoint store a URI names: ``file:///path`` (or a plain path) or
``s3://bucket/prefix`` with an Airflow AWS connection (or boto3's default chain)."""

from __future__ import annotations

from airflow_rover.storage.base import CheckpointStore, StoreLocation, parse_checkpoint_uri
from airflow_rover.storage.local import LocalStore
from airflow_rover.storage.s3 import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MULTIPART_CHUNKSIZE,
    DEFAULT_MULTIPART_THRESHOLD,
    AwsSettings,
    S3Store,
    async_aws_settings,
    aws_settings,
    transfer_config,
)


def store_for(
    location: StoreLocation,
    settings: AwsSettings | None = None,
    multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
    multipart_chunksize: int = DEFAULT_MULTIPART_CHUNKSIZE,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
) -> CheckpointStore:
    """The store at a parsed location (S3 with ``settings``; they are ignored for a path)."""
    if location.scheme == "file":
        if location.path is None:
            raise ValueError(f"{location!r}: a file location needs a path")
        return LocalStore(location.path)
    transfer = transfer_config(multipart_threshold, multipart_chunksize, max_concurrency)
    return S3Store(location.bucket, location.prefix, settings, transfer)


def open_store(
    uri: str,
    aws_conn_id: str | None = None,
    multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
    multipart_chunksize: int = DEFAULT_MULTIPART_CHUNKSIZE,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
) -> CheckpointStore:
    """The store ``uri`` names; for ``s3://`` the credentials of the Airflow connection
    ``aws_conn_id`` (None: boto3's default chain). A bad URI raises a ValueError naming
    ``checkpoint_uri`` and the accepted forms."""
    location = parse_checkpoint_uri(uri)
    settings = aws_settings(aws_conn_id) if location.scheme == "s3" else None
    return store_for(location, settings, multipart_threshold, multipart_chunksize, max_concurrency)


async def async_open_store(uri: str, aws_conn_id: str | None = None) -> CheckpointStore:
    """``open_store`` for triggers: the connection is read without blocking the event loop
    (the store's own calls block: run them with ``asyncio.to_thread``)."""
    location = parse_checkpoint_uri(uri)
    settings = await async_aws_settings(aws_conn_id) if location.scheme == "s3" else None
    return store_for(location, settings)
