"""What a job trains on and with, as one digest: a task run again trains again when the
digest differs from its finished job's, and returns that job's result when it is the same.

The digest covers the spec fields that decide the model (data, model, features, training),
the content of both splits, the source of a user's model module and, for a job continuing a
model (``init_from``), that model's location and the eviction it starts with. Resources, recovery,
checkpoints and the deadline are left out: they change how a job runs, not what it learns.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from airflow_rover.core.spec import REFERENCE_MODELS, JobSpec
from airflow_rover.data.reader import MANIFEST_NAME, read_manifest
from airflow_rover.data.sources import file_stamps

MODEL_FIELDS = ("train_data", "eval_data", "model", "features", "embedding_dim", "training")
"""The spec fields in the digest."""
CHUNK = 1 << 20


def training_fingerprint(spec: JobSpec) -> str:
    """The digest of what ``spec`` trains (hex, 32 characters)."""
    fields = spec.model_dump(mode="json", include=set(MODEL_FIELDS))
    parts: dict[str, Any] = {
        "spec": fields,
        "train_data": dataset_digest(spec.train_data),
        "eval_data": dataset_digest(spec.eval_data) if spec.eval_data else None,
        "model_source": model_source_digest(spec.model),
    }
    if spec.init is not None:  # another model to start from is another training
        parts["init"] = spec.init.model_dump(mode="json")
    if spec.preprocess is not None:  # older digests unchanged
        parts["preprocess"] = [spec.preprocess, model_source_digest(spec.preprocess)]
    if spec.data_format != "auto" or spec.data_schema is not None:  # older digests unchanged
        parts["data"] = spec.model_dump(mode="json", include={"data_format", "data_schema"})
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def dataset_digest(path: str) -> str:
    """The content of the dataset directory ``path``: its manifest and, for each file it
    lists, the size and the checksum the manifest records. Without recorded checksums every
    file under the directory is read and hashed. A dataset without a manifest (Parquet,
    TFRecord, CSV files): each file's path, size and modification time."""
    directory = Path(path)
    if not (directory / MANIFEST_NAME).is_file():
        return files_digest(path)
    manifest = read_manifest(directory)
    digest = hashlib.blake2b(digest_size=16)
    digest.update(json.dumps(manifest, sort_keys=True).encode())
    files = manifest.get("files")
    if isinstance(files, dict) and files:
        for name in sorted(files):
            digest.update(f"{name}:{(directory / name).stat().st_size}\n".encode())
        return digest.hexdigest()
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(directory)}:{file.stat().st_size}\n".encode())
        digest.update(_file_digest(file).encode())
    return digest.hexdigest()


def files_digest(uri: str) -> str:
    """The files ``uri`` names (a directory, a glob, a file): for each, its path, size and
    modification time (a partition rewritten by the ETL trains again)."""
    digest = hashlib.blake2b(digest_size=16)
    for stamp in file_stamps(uri):
        digest.update(f"{stamp}\n".encode())
    return digest.hexdigest()


def model_source_digest(model: str) -> str | None:
    """The source file of a ``package.module:factory`` model (None for a reference model, or
    a module without a source file): a changed model trains again."""
    if model in REFERENCE_MODELS:
        return None
    module = model.partition(":")[0]
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = found.origin if found is not None else None
    if not origin or not os.path.isfile(origin):
        return None
    return _file_digest(Path(origin))


def _file_digest(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
