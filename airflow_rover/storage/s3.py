"""``S3Store``: checkpoints in an S3 bucket (or any S3 API: MinIO, Ceph, moto), through boto3.

Credentials come from an Airflow connection in the Amazon provider's shape, read without that
provider (it is not a dependency): login = access key id, password = secret access key, extra
``{"endpoint_url", "region_name", "aws_session_token", "profile_name"}``. Without a connection
boto3's default chain applies (environment, shared config, instance role). Secrets stay inside
the boto3 session: they are never logged, never in a ``repr`` and never in XCom.

Large files go up as multipart uploads (``multipart_threshold``, ``multipart_chunksize``): the
object appears only when its last part is in, so a key never holds part of a file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig

from airflow_rover.storage.base import (
    StorageAccessDenied,
    StorageError,
    check_key,
    checkpoint_names,
    put_tree,
)

log = logging.getLogger(__name__)

MiB = 1 << 20
MIN_PART_BYTES = 5 * MiB  # S3's smallest part (every part but the last)
DEFAULT_MULTIPART_THRESHOLD = 64 * MiB
DEFAULT_MULTIPART_CHUNKSIZE = 64 * MiB
DEFAULT_MAX_CONCURRENCY = 4
_DENIED = {
    "AccessDenied",
    "AllAccessDisabled",
    "ExpiredToken",
    "InvalidAccessKeyId",
    "InvalidToken",
    "SignatureDoesNotMatch",
    "403",
}
_MISSING = {"NoSuchKey", "404", "NotFound"}
# Amazon-provider connection extras that need that provider's machinery (role assumption).
_UNSUPPORTED_EXTRAS = ("role_arn", "assume_role_method", "assume_role_kwargs")


@dataclass(frozen=True, repr=False)
class AwsSettings:
    """What boto3 needs to reach S3; ``repr`` never shows the keys."""

    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    endpoint_url: str | None = None
    region_name: str | None = None
    profile_name: str | None = None

    def __repr__(self) -> str:
        keys = "set" if self.access_key_id else "default chain"
        return (
            f"AwsSettings(credentials={keys}, endpoint_url={self.endpoint_url!r}, "
            f"region_name={self.region_name!r}, profile_name={self.profile_name!r})"
        )

    def to_env(self) -> dict[str, str]:
        """The same settings as the environment boto3's default chain reads, for a process
        that cannot read Airflow connections (the job's master): pass it to the process, never
        write it to a file or a log."""
        names = {
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_SESSION_TOKEN": self.session_token,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_DEFAULT_REGION": self.region_name,
            "AWS_PROFILE": self.profile_name,
        }
        return {name: value for name, value in names.items() if value}

    def session(self) -> boto3.session.Session:
        return boto3.session.Session(
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            aws_session_token=self.session_token,
            region_name=self.region_name,
            profile_name=self.profile_name,
        )


def aws_settings_from_connection(conn: Any) -> AwsSettings:
    """``AwsSettings`` from an Airflow connection (``airflow.sdk.Connection``) in the Amazon
    provider's shape; a connection that needs that provider raises a ValueError saying so."""
    extra = conn.extra_dejson or {}
    conn_id = getattr(conn, "conn_id", "?")
    unsupported = [k for k in _UNSUPPORTED_EXTRAS if extra.get(k)]
    if unsupported:
        raise ValueError(
            f"aws_conn_id={conn_id!r}: extra {unsupported} needs the Amazon provider, which "
            "airflow-rover does not use; give the keys as login/password (or "
            "aws_access_key_id/aws_secret_access_key in extra), or no connection for boto3's "
            "default chain"
        )
    key_id = conn.login or extra.get("aws_access_key_id")
    secret = conn.password or extra.get("aws_secret_access_key")
    if bool(key_id) != bool(secret):
        raise ValueError(
            f"aws_conn_id={conn_id!r}: give both the access key id (login) and the secret "
            "access key (password), or neither for boto3's default chain"
        )
    s3_config = (extra.get("service_config") or {}).get("s3") or {}
    return AwsSettings(
        access_key_id=key_id or None,
        secret_access_key=secret or None,
        session_token=extra.get("aws_session_token") or None,
        endpoint_url=s3_config.get("endpoint_url") or extra.get("endpoint_url") or None,
        region_name=extra.get("region_name") or None,
        profile_name=extra.get("profile_name") or None,
    )


def transfer_config(
    multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
    multipart_chunksize: int = DEFAULT_MULTIPART_CHUNKSIZE,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
) -> TransferConfig:
    """boto3's transfer settings, checked: files from ``multipart_threshold`` bytes go up in
    ``multipart_chunksize`` parts (at least S3's 5 MiB), ``max_concurrency`` at a time."""
    if not isinstance(multipart_threshold, int) or multipart_threshold < 1:
        raise ValueError(f"multipart_threshold={multipart_threshold!r}: accepted: bytes >= 1")
    if not isinstance(multipart_chunksize, int) or multipart_chunksize < MIN_PART_BYTES:
        raise ValueError(
            f"multipart_chunksize={multipart_chunksize!r}: accepted: bytes >= {MIN_PART_BYTES} "
            "(S3's smallest part)"
        )
    if not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise ValueError(f"max_concurrency={max_concurrency!r}: accepted: an integer >= 1")
    return TransferConfig(
        multipart_threshold=multipart_threshold,
        multipart_chunksize=multipart_chunksize,
        max_concurrency=max_concurrency,
    )


class S3Store:
    """A checkpoint store under ``s3://bucket/prefix``.

    :param bucket: the bucket (it must exist).
    :param prefix: the key prefix of the store's root ("" for the bucket's root).
    :param settings: credentials and endpoint (``aws_settings(conn_id)``).
    :param transfer: multipart settings (``transfer_config(...)``).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        settings: AwsSettings | None = None,
        transfer: TransferConfig | None = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = "/".join(p for p in prefix.split("/") if p)
        self.settings = settings or AwsSettings()
        self.transfer = transfer or transfer_config()
        config = botocore.config.Config(
            retries={"max_attempts": 5, "mode": "standard"},
            connect_timeout=10,
            read_timeout=60,
        )
        self.client = self.settings.session().client(
            "s3", endpoint_url=self.settings.endpoint_url, config=config
        )

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r}, {self.settings!r})"

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def uri_of(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def _key(self, key: str) -> str:
        key = check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _relative(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    # -- writing -----------------------------------------------------------------------------
    def put_file(self, local: Path, key: str) -> None:
        if not local.is_file():
            raise StorageError(f"{local}: missing (removed before it was stored?)")
        with self._errors(key, "upload"):
            self.client.upload_file(str(local), self.bucket, self._key(key), Config=self.transfer)

    def put_tree(self, local_dir: Path, prefix: str, skip: Collection[str] = ()) -> list[str]:
        return put_tree(self, local_dir, prefix, skip)

    def put_bytes(self, key: str, data: bytes) -> None:
        with self._errors(key, "write"):
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    # -- reading -----------------------------------------------------------------------------
    def read_bytes(self, key: str) -> bytes | None:
        try:
            with self._errors(key, "read"):
                reply = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
                body: bytes = reply["Body"].read()
                return body
        except _Missing:
            return None

    def get_file(self, key: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.{os.getpid()}.tmp")
        try:
            with self._errors(key, "download"):
                self.client.download_file(
                    self.bucket, self._key(key), str(tmp), Config=self.transfer
                )
            os.replace(tmp, local)
        except _Missing:
            raise StorageError(f"{self.uri_of(key)}: no such object") from None
        finally:
            tmp.unlink(missing_ok=True)

    def _pages(self, prefix: str, delimiter: str | None = None) -> Iterator[dict[str, Any]]:
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            args["Delimiter"] = delimiter
        with self._errors_at(f"s3://{self.bucket}/{prefix}", "list"):
            yield from self.client.get_paginator("list_objects_v2").paginate(**args)

    def list_objects(self, prefix: str = "") -> dict[str, int]:
        full = self._key(prefix) if prefix else self.prefix
        found: dict[str, int] = {}
        for page in self._pages(f"{full}/" if full else ""):
            for item in page.get("Contents", []):
                found[self._relative(item["Key"])] = int(item["Size"])
        if prefix and not found:  # ``prefix`` may name one object
            try:
                with self._errors(prefix, "stat"):
                    head = self.client.head_object(Bucket=self.bucket, Key=full)
                found[check_key(prefix)] = int(head["ContentLength"])
            except _Missing:
                pass
        return found

    def list_checkpoints(self) -> list[str]:
        names = []
        for page in self._pages(f"{self.prefix}/" if self.prefix else "", delimiter="/"):
            for common in page.get("CommonPrefixes", []):
                names.append(self._relative(common["Prefix"]).rstrip("/"))
        return checkpoint_names(names)

    def delete(self, prefix: str) -> int:
        keys = [self._key(k) for k in self.list_objects(prefix)]
        for start in range(0, len(keys), 1000):  # DeleteObjects takes 1000 keys at most
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            with self._errors(prefix, "delete"):
                reply = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
                )
            errors = reply.get("Errors") or []
            if errors:
                first = errors[0]
                raise StorageError(
                    f"s3://{self.bucket}/{first.get('Key')}: could not delete "
                    f"({first.get('Code')}: {first.get('Message')}; {len(errors)} failed)"
                )
        return len(keys)

    # -- errors ------------------------------------------------------------------------------
    def _errors(self, key: str, action: str) -> _ErrorMapper:
        return _ErrorMapper(self.uri_of(key), action)

    def _errors_at(self, where: str, action: str) -> _ErrorMapper:
        return _ErrorMapper(where, action)


class _Missing(Exception):
    """The object does not exist (turned into None or a StorageError by the caller)."""


class _ErrorMapper:
    """Turn boto3's errors into ``StorageError`` (``StorageAccessDenied`` for refused
    credentials) naming the object and the action; a missing object into ``_Missing``."""

    def __init__(self, where: str, action: str) -> None:
        self.where, self.action = where, action

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or isinstance(exc, StorageError | _Missing):
            return
        where = self.where
        cause = exc.__context__ if isinstance(exc, S3UploadFailedError) else exc
        if isinstance(cause, botocore.exceptions.ClientError):
            error = cause.response.get("Error", {})
            code = str(error.get("Code", ""))
            if code in _MISSING:
                raise _Missing() from None
            message = f"{where}: {self.action} failed ({code}: {error.get('Message', '')})"
            if code in _DENIED:
                raise StorageAccessDenied(message) from None
            raise StorageError(message) from None
        if isinstance(cause, botocore.exceptions.NoCredentialsError):
            raise StorageAccessDenied(
                f"{where}: no AWS credentials (give aws_conn_id, or configure boto3's default "
                "chain)"
            ) from None
        if isinstance(cause, botocore.exceptions.BotoCoreError | S3UploadFailedError):
            raise StorageError(f"{where}: {self.action} failed ({cause})") from None
