"""Checkpoint parts read straight from their mapping give exactly what ``np.load`` gives."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from airflow_rover.core import npz_view
from airflow_rover.core.checkpoint_files import CorruptCheckpoint, read_npz, write_npz


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {
        "table/a/ids": rng.integers(-(2**62), 2**62, 1000),
        "table/a/rows": rng.random((1000, 16), dtype=np.float32),
        "table/a/state/accum": np.asfortranarray(rng.random((7, 3))),
        "table/a/counts": rng.integers(0, 9, 1000).astype(np.uint32),
        "empty": np.empty((0, 16), np.float32),
        "scalar": np.array(3.5),
        "flags": rng.random(33) > 0.5,
        "text": np.array(["ps-0", "a longer name"]),
        "big_endian": np.arange(5, dtype=">i4"),
    }


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for name, value in want.items():
        assert (got[name].dtype, got[name].shape) == (value.dtype, value.shape), name
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_a_part_reads_back_as_np_load_reads_it(tmp_path: Path):
    arrays = _arrays()
    write_npz(tmp_path / "ps-0.npz", arrays.items())
    got = read_npz(tmp_path / "ps-0.npz")
    with np.load(tmp_path / "ps-0.npz") as loaded:
        _same(got, {name: loaded[name] for name in loaded.files})
    _same(got, arrays)
    assert all(v.flags.writeable and v.base is None for v in got.values())  # copies, no map


def test_the_mapping_reader_is_what_reads_a_part(tmp_path: Path, monkeypatch):
    write_npz(tmp_path / "ps-0.npz", _arrays().items())

    def no_np_load(*args, **kwargs):
        raise AssertionError("np.load was used")

    monkeypatch.setattr(np, "load", no_np_load)
    _same(read_npz(tmp_path / "ps-0.npz"), _arrays())


def test_a_compressed_or_pickled_member_falls_back_to_np_load(tmp_path: Path):
    path = tmp_path / "plain.npz"
    np.savez_compressed(path, rows=np.arange(10))
    with open(path, "rb") as fh, pytest.raises(npz_view.NotPlain, match="not a stored"):
        import mmap

        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            npz_view.arrays_from_map(fh, mapped)
    with zipfile.ZipFile(path) as archive:
        assert archive.infolist()[0].compress_type == zipfile.ZIP_DEFLATED


def test_a_changed_byte_is_still_caught_before_any_array_is_read(tmp_path: Path):
    path = tmp_path / "ps-0.npz"
    write_npz(path, _arrays().items())
    data = bytearray(path.read_bytes())
    data[200] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match="checksum mismatch"):
        read_npz(path)
