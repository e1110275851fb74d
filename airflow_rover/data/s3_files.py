"""Dataset files on S3 (or any S3 API): listed with boto3 (keys, sizes, ETags), read with
pyarrow's S3 filesystem (ranged reads: a row group's bytes, not the whole object).

Credentials and the endpoint come from the environment, as boto3's default chain reads them
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``): the task sets them
from ``aws_conn_id`` (``storage.s3.AwsSettings.to_env``), the job's processes inherit them.
"""

from __future__ import annotations

import fnmatch
import functools
import os
from dataclasses import dataclass
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.fs as pafs

S3_SCHEME = "s3://"
_GLOB_CHARS = "*?["
DEFAULT_REGION = "us-east-1"


@dataclass(frozen=True)
class S3Object:
    """One listed object: its ``s3://bucket/key`` URI, size and ETag."""

    uri: str
    size: int
    etag: str


class StorageUnavailable(RuntimeError):
    """S3 did not answer, or answered that it is busy or failing: worth a retry of the task,
    unlike a missing bucket or refused credentials (``ValueError``)."""


_BUSY_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError"}


def _failure(uri: str, doing: str, exc: Exception) -> Exception:
    """What a boto3 error ``exc`` means for ``uri``: StorageUnavailable when a retry may see it
    pass, else ValueError naming ``uri``."""
    import botocore.exceptions

    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        code = str(error.get("Code", "?"))
        if status >= 500 or code in _BUSY_CODES:
            return StorageUnavailable(f"{uri}: S3 is unavailable ({code}) to {doing}: {exc}")
        return ValueError(f"{uri}: cannot {doing} ({code}): {exc}")
    unreachable = (
        botocore.exceptions.EndpointConnectionError,
        botocore.exceptions.ConnectionClosedError,
        botocore.exceptions.ConnectTimeoutError,
        botocore.exceptions.ReadTimeoutError,
    )
    if isinstance(exc, unreachable):
        return StorageUnavailable(f"{uri}: cannot reach S3 to {doing}: {exc}")
    return ValueError(f"{uri}: cannot {doing}: {exc}")  # credentials missing, a bad setting


def split_uri(uri: str) -> tuple[str, str]:
    """``(bucket, key)`` of ``s3://bucket/key``; ValueError naming ``uri`` without a bucket."""
    if not uri.startswith(S3_SCHEME):
        raise ValueError(f"{uri}: not an s3:// URI")
    bucket, _, key = uri[len(S3_SCHEME) :].partition("/")
    if not bucket:
        raise ValueError(f"{uri}: no bucket; expected s3://bucket/prefix")
    return bucket, key


def _endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def _region() -> str:
    return os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or DEFAULT_REGION


def _client() -> Any:
    return boto3.session.Session().client("s3", endpoint_url=_endpoint(), region_name=_region())


def list_objects(uri: str) -> list[S3Object]:
    """The objects ``uri`` names: one object's key, every object under a prefix (a
    "directory"), or the keys matching a glob (listing the prefix before its first
    wildcard); sorted by key. ValueError naming ``uri`` on a missing bucket or no access;
    StorageUnavailable when S3 cannot be reached or is failing."""
    bucket, key = split_uri(uri)
    wildcard = min((key.index(c) for c in _GLOB_CHARS if c in key), default=-1)
    prefix = key if wildcard < 0 else key[:wildcard]
    found = _list(bucket, prefix, uri)
    if wildcard >= 0:
        found = [o for o in found if fnmatch.fnmatchcase(split_uri(o.uri)[1], key)]
    elif not any(split_uri(o.uri)[1] == key for o in found):  # a prefix: a whole "directory"
        directory = key if not key or key.endswith("/") else f"{key}/"
        found = [o for o in found if split_uri(o.uri)[1].startswith(directory)]
    else:
        found = [o for o in found if split_uri(o.uri)[1] == key]
    return sorted(found, key=lambda o: o.uri)


def _list(bucket: str, prefix: str, uri: str) -> list[S3Object]:
    import botocore.exceptions

    objects = []
    try:
        pages = _client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            for item in page.get("Contents", []):
                objects.append(
                    S3Object(
                        f"{S3_SCHEME}{bucket}/{item['Key']}",
                        int(item["Size"]),
                        str(item.get("ETag", "")).strip('"'),
                    )
                )
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        raise _failure(uri, "list the objects", exc) from None
    return objects


def head_object(uri: str) -> S3Object:
    """The object ``uri``'s size and ETag (one HEAD request); ValueError naming ``uri``."""
    import botocore.exceptions

    bucket, key = split_uri(uri)
    try:
        head = _client().head_object(Bucket=bucket, Key=key)
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        raise _failure(uri, "read the object's size and ETag", exc) from None
    return S3Object(uri, int(head["ContentLength"]), str(head.get("ETag", "")).strip('"'))


@functools.cache
def _filesystem(endpoint: str | None, region: str, key: str | None) -> pafs.S3FileSystem:
    options: dict[str, Any] = {"region": region}
    if endpoint:
        scheme, _, rest = endpoint.partition("://")
        options.update(endpoint_override=rest or scheme, scheme=scheme if rest else "https")
    if key:
        options.update(
            access_key=key,
            secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
            session_token=os.environ.get("AWS_SESSION_TOKEN"),
        )
    return pafs.S3FileSystem(**options)


def open_input(uri: str) -> pa.NativeFile:
    """A random-access file on the object ``uri`` (ranged GETs)."""
    bucket, key = split_uri(uri)
    fs = _filesystem(_endpoint(), _region(), os.environ.get("AWS_ACCESS_KEY_ID"))
    return fs.open_input_file(f"{bucket}/{key}")
