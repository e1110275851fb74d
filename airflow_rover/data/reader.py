"""Format-agnostic sample access: the training runtime reads data only through this interface.

A dataset directory holds ``manifest.json`` whose ``format`` names the on-disk layout;
``open_dataset`` dispatches on it through a small registry, so a new layout (Parquet, TFRecord,
...) is one ``register_format`` call and no change to the trainers. Readers serve contiguous
index ranges because the master hands out work as index-range shards.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from airflow_rover.core.data_schema import DataSchema
from airflow_rover.core.spec import JobSpec
from airflow_rover.data.batch import (
    Batch,
    CategoricalColumn,
    Schema,
    check_range,
)

MANIFEST_NAME = "manifest.json"


@runtime_checkable
class SampleReader(Protocol):
    """Random access to a dataset's samples by index range."""

    @property
    def schema(self) -> Schema: ...

    @property
    def num_samples(self) -> int: ...

    def read(self, start: int, stop: int) -> Batch:
        """Samples ``[start, stop)``; ValueError naming start/stop if out of range."""
        ...


ReaderFactory = Callable[[Path, Mapping[str, Any]], SampleReader]

_FORMATS: dict[str, ReaderFactory] = {}


def register_format(name: str, factory: ReaderFactory) -> None:
    """Make ``open_dataset`` understand manifests with ``"format": name``.

    ``factory(path, manifest)`` receives the dataset directory and the parsed manifest.
    Re-registering a name replaces its factory (useful for tests and plugins).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    _FORMATS[name] = factory


def registered_formats() -> tuple[str, ...]:
    """Names ``open_dataset`` accepts, sorted."""
    return tuple(sorted(_FORMATS))


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse ``<path>/manifest.json``; ValueError naming the path if missing or malformed (a
    directory that does not exist is told apart from one without a manifest)."""
    directory = Path(path)
    manifest_path = directory / MANIFEST_NAME
    try:
        text = manifest_path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        raise ValueError(_no_manifest(directory)) from None
    except OSError as exc:
        raise ValueError(f"{manifest_path}: cannot read manifest: {exc}") from exc
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{manifest_path}: not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict):
        raise ValueError(f"{manifest_path}: manifest must be a JSON object")
    return manifest


def _no_manifest(directory: Path) -> str:
    """Why ``directory`` has no readable manifest: it is missing, not a directory, or lacks one."""
    if not directory.exists():
        return f"{directory} does not exist"
    if not directory.is_dir():
        return (
            f"{directory} is not a directory: a dataset is a directory, or Parquet files (.parquet)"
        )
    return (
        f"{directory} has no {MANIFEST_NAME}: a dataset directory holds {MANIFEST_NAME} (its "
        "format, num_samples, num_dense and categorical columns with their vocab_size) and the "
        "format's files, e.g. dense.npy, categorical.npy and label.npy for npy-columns "
        f"(accepted formats: {', '.join(registered_formats())}), or Parquet files (.parquet); "
        "`rover data gen` writes one (docs/data-formats.md)"
    )


def schema_from_manifest(manifest: Mapping[str, Any], where: str | os.PathLike[str]) -> Schema:
    """Build the Schema recorded in a manifest; ValueError naming ``where`` if malformed."""
    try:
        num_dense = manifest["num_dense"]
        columns = tuple(
            CategoricalColumn(
                name=str(column["name"]),
                vocab_size=column["vocab_size"],
                raw=column.get("raw", False),
            )
            for column in manifest["categorical"]
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{where}: manifest lacks a valid num_dense/categorical: {exc}") from exc
    if isinstance(num_dense, bool) or not isinstance(num_dense, int) or num_dense < 0:
        raise ValueError(f"{where}: num_dense must be an integer >= 0, got {num_dense!r}")
    for column in columns:
        if not isinstance(column.raw, bool):
            raise ValueError(
                f"{where}: raw of {column.name} must be true or false, got {column.raw!r}"
            )
        size = column.vocab_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(
                f"{where}: vocab_size of {column.name} must be an integer >= 1, got {size!r}"
            )
    return Schema(num_dense=num_dense, categorical=columns)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (dataset files can exceed RAM)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_checksums(path: str | os.PathLike[str], manifest: Mapping[str, Any]) -> None:
    """Check every file listed under ``files`` against its sha256; ValueError on mismatch.

    Format-agnostic: any layout that lists its files in the manifest gets this for free.
    """
    directory = Path(path)
    files = manifest.get("files")
    if not isinstance(files, Mapping) or not files:
        raise ValueError(f"{directory}: manifest has no 'files' checksums to verify")
    for name, expected in files.items():
        file_path = directory / name
        try:
            actual = sha256_file(file_path)
        except OSError as exc:
            raise ValueError(f"{file_path}: cannot read file listed in manifest: {exc}") from exc
        if actual != expected:
            raise ValueError(
                f"{file_path}: sha256 mismatch (manifest {expected}, file {actual}); "
                "the dataset is corrupt or was modified"
            )


def open_dataset(
    path: str | os.PathLike[str],
    *,
    verify: bool = False,
    data_format: str = "auto",
    schema: DataSchema | None = None,
) -> SampleReader:
    """Open the dataset ``path`` (``docs/data-formats.md``): a directory with a manifest with
    the reader its format names; else the files ``path`` names, of ``data_format`` (``auto``:
    by their extension), their columns read as ``schema`` says (None: inferred)."""
    directory = Path(path)
    if data_format in ("auto", "npy-columns") and (directory / MANIFEST_NAME).is_file():
        return _open_manifest(directory, verify)
    if data_format == "npy-columns":
        read_manifest(directory)  # raises, saying what an npy-columns dataset holds
    from airflow_rover.data.sources import NoDataFiles, files_of_format

    try:
        fmt, files = files_of_format(str(path), data_format)
    except NoDataFiles:
        if data_format != "auto" or "://" in str(path) or _is_glob(str(path)):
            raise
        raise ValueError(_no_manifest(directory)) from None
    opener = _FILE_FORMATS.get(fmt)
    if opener is None:
        raise ValueError(f"{path}: reading {fmt} files is not supported yet")
    return opener(files, schema)


def open_split(spec: JobSpec, path: str) -> SampleReader:
    """One of ``spec``'s datasets, in its format and schema, as every process of the job
    opens it."""
    return open_dataset(path, data_format=spec.data_format, schema=spec.data_schema)


def _is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def _open_parquet(files: list[str], schema: DataSchema | None) -> SampleReader:
    from airflow_rover.data.parquet import ParquetReader

    return ParquetReader(files, schema)


def _open_tfrecord(files: list[str], schema: DataSchema | None) -> SampleReader:
    from airflow_rover.data.tfrecord import TFRecordReader

    return TFRecordReader(files, schema)


def _open_csv(files: list[str], schema: DataSchema | None) -> SampleReader:
    from airflow_rover.data.csv_files import CsvReader

    return CsvReader(files, schema)


FileReaderFactory = Callable[[list[str], "DataSchema | None"], SampleReader]
_FILE_FORMATS: dict[str, FileReaderFactory] = {
    "parquet": _open_parquet,
    "tfrecord": _open_tfrecord,
    "csv": _open_csv,
}


def _open_manifest(directory: Path, verify: bool) -> SampleReader:
    manifest = read_manifest(directory)
    fmt = manifest.get("format")
    factory = _FORMATS.get(fmt) if isinstance(fmt, str) else None
    if factory is None:
        raise ValueError(
            f"{directory}: unknown dataset format {fmt!r}; "
            f"accepted formats: {', '.join(registered_formats())}"
        )
    if verify:
        verify_checksums(directory, manifest)
    return factory(directory, manifest)


class NpyColumnsReader:
    """Reader for the ``npy-columns`` layout: one memory-mapped .npy per feature kind.

    Memory mapping makes opening O(1) and a range read touch only the pages it needs, so any
    worker can read any shard of a dataset far larger than its RAM.
    """

    FORMAT = "npy-columns"
    _ARRAYS = (("dense", "dense.npy"), ("categorical", "categorical.npy"), ("label", "label.npy"))

    def __init__(
        self, path: str | os.PathLike[str], manifest: Mapping[str, Any] | None = None
    ) -> None:
        self.path = Path(path)
        manifest = read_manifest(self.path) if manifest is None else manifest
        self._schema = schema_from_manifest(manifest, self.path)
        num_samples = manifest.get("num_samples")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 0:
            raise ValueError(
                f"{self.path}: num_samples must be an integer >= 0, got {num_samples!r}"
            )
        self._num_samples = num_samples
        expected = {
            "dense": (np.float32, (num_samples, self._schema.num_dense)),
            "categorical": (np.int64, (num_samples, self._schema.num_categorical)),
            "label": (np.float32, (num_samples,)),
        }
        arrays: dict[str, np.ndarray] = {}
        for key, filename in self._ARRAYS:
            file_path = self.path / filename
            try:
                array = np.load(file_path, mmap_mode="r")
            except (OSError, ValueError) as exc:
                raise ValueError(f"{file_path}: cannot open as .npy: {exc}") from exc
            dtype, shape = expected[key]
            if array.dtype != dtype or array.shape != shape:
                raise ValueError(
                    f"{file_path}: expected {np.dtype(dtype).name} {shape}, "
                    f"got {array.dtype} {array.shape}"
                )
            arrays[key] = array
        self._dense = arrays["dense"]
        self._categorical = arrays["categorical"]
        self._label = arrays["label"]

    @property
    def schema(self) -> Schema:
        return self._schema

    @property
    def num_samples(self) -> int:
        return self._num_samples

    def __len__(self) -> int:
        return self._num_samples

    def __reduce__(self) -> tuple[type[NpyColumnsReader], tuple[Path]]:
        """Pickle as the path (re-mapped on load), never as the mapped data itself."""
        return (NpyColumnsReader, (self.path,))

    def __repr__(self) -> str:
        return f"NpyColumnsReader({str(self.path)!r}, num_samples={self._num_samples})"

    def read(self, start: int, stop: int) -> Batch:
        """Copy samples ``[start, stop)`` out of the mapped files into a fresh Batch."""
        check_range(start, stop, self._num_samples)
        return Batch(
            dense=np.array(self._dense[start:stop]),
            categorical=np.array(self._categorical[start:stop]),
            label=np.array(self._label[start:stop]),
        )


register_format(NpyColumnsReader.FORMAT, NpyColumnsReader)
