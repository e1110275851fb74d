"""The Airflow face of checkpoint storage: a checkpoint store opened with the credentials of an
AWS connection (``aws_conn_id``; none: boto3's default chain). The connection's shape is the
Amazon provider's (login/password or ``aws_access_key_id``/``aws_secret_access_key`` in extra,
``endpoint_url``, ``region_name``), read without that provider."""

from __future__ import annotations

from airflow.sdk import BaseHook

from airflow_rover.storage.base import CheckpointStore, parse_checkpoint_uri
from airflow_rover.storage.s3 import AwsSettings, aws_settings_from_connection
from airflow_rover.storage.stores import store_for


class CheckpointStoreHook(BaseHook):
    """Opens checkpoint stores with the credentials of ``aws_conn_id``.

    :param aws_conn_id: the AWS connection of ``s3://`` stores; None: boto3's default chain.
    """

    hook_name = "airflow-rover checkpoint store"

    def __init__(self, aws_conn_id: str | None = None) -> None:
        super().__init__()
        self.aws_conn_id = aws_conn_id or None

    def aws_settings(self) -> AwsSettings:
        """The connection's settings (boto3's default chain without one)."""
        if self.aws_conn_id is None:
            return AwsSettings()
        return aws_settings_from_connection(self.get_connection(self.aws_conn_id))

    async def async_aws_settings(self) -> AwsSettings:
        """``aws_settings`` for triggers: read without blocking the event loop."""
        if self.aws_conn_id is None:
            return AwsSettings()
        return aws_settings_from_connection(await self.aget_connection(self.aws_conn_id))

    def get_store(self, uri: str) -> CheckpointStore:
        """The store ``uri`` names (the credentials are read only for ``s3://``)."""
        location = parse_checkpoint_uri(uri)
        return store_for(location, self.aws_settings() if location.scheme == "s3" else None)

    async def async_get_store(self, uri: str) -> CheckpointStore:
        """``get_store`` for triggers (the store's own calls block: run them in a thread)."""
        location = parse_checkpoint_uri(uri)
        settings = await self.async_aws_settings() if location.scheme == "s3" else None
        return store_for(location, settings)
