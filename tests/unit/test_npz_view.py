"""Checkpoint parts read straight from their mapping give exactly what ``np.load`` gives."""

from __future__ import annotations

import io
import os
import signal
import time
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
        # headers numpy's parser reads (not the plain pattern):
        "when": np.array(["2026-11-27T10:00"], dtype="datetime64[ns]"),
        "records": np.array([(1, 2.5)], dtype=[("id", "<i8"), ("w", "<f4")]),
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


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
@pytest.mark.parametrize(
    "array",
    [
        np.zeros((3, 16), np.float32),
        np.zeros(7, np.int64),
        np.array(2.0),
        np.zeros((0,), np.uint32),
        np.asfortranarray(np.zeros((4, 5))),
        np.zeros((2, 3, 4), ">u2"),
        np.zeros(2, "U12"),
        np.zeros(2, "datetime64[s]"),
        np.zeros(2, [("a", "<i4"), ("b", "<f8", (2,))]),
    ],
    ids=lambda a: f"{a.dtype}-{a.shape}",
)
def test_a_header_reads_as_numpy_reads_it(array: np.ndarray, version: tuple[int, int]):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=version)
    raw = buf.getvalue()[: buf.getvalue().index(b"\n") + 1]
    head = io.BytesIO(raw)
    np.lib.format.read_magic(head)
    read = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    assert npz_view._header(raw, version[0]) == read(head)


def test_a_forked_child_reads_parts_on_readers_of_its_own(tmp_path: Path):
    from airflow_rover.core.checkpoint_files import read_npz_parts

    paths = [tmp_path / f"ps-{i}.npz" for i in range(3)]
    for path in paths:
        write_npz(path, _arrays().items())
    assert len(list(read_npz_parts(paths))) == 3  # the parent's pool exists now
    pid = os.fork()
    if pid == 0:  # the child: a pool whose threads did not survive the fork would hang here
        ok = all(not isinstance(a, Exception) for _, a in read_npz_parts(paths))
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's read hung")
    assert os.waitstatus_to_exitcode(done[1]) == 0
