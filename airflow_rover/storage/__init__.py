"""Durable checkpoint storage: a local directory or S3, chosen by URI.

``open_store("s3://bucket/prefix", settings)`` (or ``file:///path``, or a plain
path) gives a ``CheckpointStore``; ``upload_checkpoint`` publishes a committed local checkpoint
there (parts, then ``queue.json``, then ``LATEST``), ``latest_remote_checkpoint`` finds the
newest one that verifies, ``download_checkpoint`` / ``restore_latest_checkpoint`` bring one
back with every checksum checked. See ``docs/checkpoint-storage.md``.
"""

from airflow_rover.storage.base import (
    ACCEPTED_URIS,
    CheckpointStore,
    StorageAccessDenied,
    StorageError,
    StoreLocation,
    parse_checkpoint_uri,
)
from airflow_rover.storage.checkpoints import (
    DEFAULT_KEEP,
    LATEST,
    CheckpointMirror,
    ForeignCheckpoint,
    StoredCheckpoint,
    check_owner,
    checkpoint_samples,
    download_checkpoint,
    inspect_checkpoint,
    latest_remote_checkpoint,
    restore_latest_checkpoint,
    upload_checkpoint,
)
from airflow_rover.storage.local import LocalStore
from airflow_rover.storage.s3 import AwsSettings, S3Store, aws_settings_from_connection
from airflow_rover.storage.stores import open_store, store_for

__all__ = [
    "ACCEPTED_URIS",
    "DEFAULT_KEEP",
    "LATEST",
    "AwsSettings",
    "CheckpointMirror",
    "CheckpointStore",
    "ForeignCheckpoint",
    "LocalStore",
    "S3Store",
    "StorageAccessDenied",
    "StorageError",
    "StoreLocation",
    "StoredCheckpoint",
    "aws_settings_from_connection",
    "check_owner",
    "checkpoint_samples",
    "download_checkpoint",
    "inspect_checkpoint",
    "latest_remote_checkpoint",
    "open_store",
    "parse_checkpoint_uri",
    "restore_latest_checkpoint",
    "store_for",
    "upload_checkpoint",
]
