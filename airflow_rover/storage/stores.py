"""Open the checkpoint store a URI names: ``file:///path`` (or a plain path) or
``s3://bucket/prefix`` with the given credentials (or boto3's default chain). The Airflow side
reads them from an AWS connection (``hooks.checkpoint_store``)."""

from __future__ import annotations

from airflow_rover.storage.base import CheckpointStore, StoreLocation, parse_checkpoint_uri
from airflow_rover.storage.local import LocalStore
from airflow_rover.storage.s3 import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MULTIPART_CHUNKSIZE,
    DEFAULT_MULTIPART_THRESHOLD,
    AwsSettings,
    S3Store,
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


def open_store(uri: str, settings: AwsSettings | None = None) -> CheckpointStore:
    """The store ``uri`` names; for ``s3://`` with ``settings`` (None: boto3's default chain,
    the environment's credentials). A bad URI raises a ValueError naming ``checkpoint_uri``
    and the accepted forms."""
    return store_for(parse_checkpoint_uri(uri), settings)
