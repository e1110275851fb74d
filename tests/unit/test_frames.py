"""The PS tensor frame: exact round trips, zero-copy decoding, and clean rejection of bad frames."""

from __future__ import annotations

import contextlib
import random
import struct

import numpy as np
import pytest

from airflow_rover.rpc import frames
from airflow_rover.rpc.frames import CodecError, decode, encode

SUPPORTED = ["<f4", "<f8", "<i4", "<i8", "<u4", "<u8", "u1", "<f2"]
SHAPES = [(), (1,), (0,), (7,), (2, 3), (3, 1, 5), (1, 1, 1, 2), (0, 3), (3, 0), (2, 0, 4)]


def _sample(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        values = rng.standard_normal(shape) * 1e3
    else:
        info = np.iinfo(dt)
        values = rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt)
    return np.asarray(values, dtype=dt)


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert got.dtype == want.dtype.newbyteorder("<")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", SUPPORTED)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip(dtype: str, shape: tuple[int, ...]) -> None:
    """Every supported dtype and shape (empty included) decodes to the exact same array."""
    value = _sample(dtype, shape)
    out = decode(encode({"t": value}))
    assert list(out) == ["t"]
    _assert_same(out["t"], value)


def test_round_trip_many_tensors_keeps_names_order_and_values() -> None:
    """Several tensors, odd sizes (forcing padding) and non-ASCII names survive in order."""
    tensors = {
        "ids/C1": np.array([3, 1, 4], dtype=np.int64),
        "flag": np.array([1], dtype=np.uint8),
        "grad/Ünïcode-表": _sample("<f4", (3, 5), seed=1),
        "odd": np.arange(5, dtype=np.uint8),
        "half": _sample("<f2", (3,), seed=2),
        "dense/w": _sample("<f8", (2, 2), seed=3),
        "": np.array([7], dtype=np.uint32),
    }
    out = decode(encode(tensors))
    assert list(out) == list(tensors)
    for name, value in tensors.items():
        _assert_same(out[name], value)
    assert decode(encode({})) == {}


def test_special_float_values_round_trip_bit_exactly() -> None:
    """NaN, infinities, -0.0 and subnormals are carried as raw bits, not re-encoded."""
    value = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, np.finfo(np.float32).max], "<f4")
    out = decode(encode({"x": value}))["x"]
    assert out.tobytes() == value.tobytes()


def test_non_contiguous_input() -> None:
    """Transposed and strided views are encoded by value."""
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    for view in (base.T, base[:, ::2], base[::-1]):
        _assert_same(decode(encode({"v": view}))["v"], np.ascontiguousarray(view))


@pytest.mark.parametrize("dtype", [">f4", ">f8", ">i4", ">i8", ">u4", ">u8", ">f2"])
def test_big_endian_input_is_converted(dtype: str) -> None:
    """Big-endian arrays are sent little-endian with the same values."""
    value = _sample(dtype.replace(">", "<"), (4, 3), seed=5).astype(dtype)
    out = decode(encode({"be": value}))["be"]
    assert out.dtype == np.dtype(dtype).newbyteorder("<")
    np.testing.assert_array_equal(out, value)


@pytest.mark.parametrize(
    "value",
    [
        np.array([True, False]),
        np.array([1, 2], dtype=np.int16),
        np.array([1, 2], dtype=np.int8),
        np.array([1, 2], dtype=np.uint16),
        np.array([1 + 2j], dtype=np.complex64),
        np.array(["ab"]),
        np.array([b"ab"]),
        np.array([object()], dtype=object),
        np.array(["2024-01-01"], dtype="datetime64[D]"),
    ],
    ids=lambda v: str(v.dtype),
)
def test_unsupported_dtype_is_rejected_by_name(value: np.ndarray) -> None:
    """An unsupported dtype raises CodecError naming the tensor and the dtype."""
    with pytest.raises(CodecError, match=r"tensor 'bad': dtype .* is not supported"):
        encode({"ok": np.zeros(2, np.float32), "bad": value})


def test_decoding_is_zero_copy() -> None:
    """Decoded arrays are read-only views into the received message, not copies."""
    tensors = {"a": _sample("<f4", (64, 8)), "b": np.arange(10, dtype=np.int64)}
    message = encode(tensors)
    raw = np.frombuffer(message, dtype=np.uint8)
    out = decode(message)
    for name, arr in out.items():
        assert np.shares_memory(arr, raw), name
        assert not arr.flags.writeable
        assert arr.flags.aligned  # the 8-byte padding keeps every tensor aligned
    # The arrays sit exactly where the frame says, at 8-byte aligned offsets.
    start = out["a"].__array_interface__["data"][0] - raw.__array_interface__["data"][0]
    assert start % 8 == 0
    assert message[start : start + out["a"].nbytes] == tensors["a"].tobytes()


def test_decode_of_bytearray_and_memoryview() -> None:
    """Any buffer works: bytearray (writable, still shared) and memoryview slices."""
    message = encode({"x": np.arange(6, dtype=np.float64)})
    buf = bytearray(message)
    out = decode(buf)["x"]
    assert np.shares_memory(out, np.frombuffer(buf, dtype=np.uint8))
    _assert_same(decode(memoryview(message))["x"], np.arange(6, dtype=np.float64))


def _frame() -> bytes:
    return encode(
        {
            "ids/a": np.array([5, 6, 7], dtype=np.int64),
            "grad/é": _sample("<f4", (3, 2), seed=9),
            "c": np.array([1], dtype=np.uint8),
        }
    )


def test_every_truncation_is_rejected() -> None:
    """Each strict prefix of a valid frame raises CodecError (no partial decode)."""
    message = _frame()
    for n in range(len(message)):
        with pytest.raises(CodecError):
            decode(message[:n])


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (b"", "bad magic"),
        (b"RVT2" + b"\0" * 4, "bad magic"),
        (b"\0" * 64, "bad magic"),
        (b"RVT1", "malformed"),
        (b"RVT1" + struct.pack("<I", 1), "malformed"),
        (b"RVT1" + struct.pack("<I", 0) + b"x", "trailing bytes"),
        (encode({"a": np.zeros(2, np.float32)}) + b"\0", "trailing bytes"),
        # Unknown dtype code 200.
        (b"RVT1" + struct.pack("<IH1sBB", 1, 1, b"a", 200, 0) + b"\0" * 16, "unknown dtype code"),
        # A name that is not UTF-8.
        (b"RVT1" + struct.pack("<IH1sBB", 1, 1, b"\xff", 0, 0) + b"\0" * 16, "malformed"),
        # Claims 1000 floats, carries 1.
        (
            b"RVT1" + struct.pack("<IH1sBBQ", 1, 1, b"a", 0, 1, 1000) + b"\0" * 4,
            "truncated",
        ),
        # Claims two tensors, carries one.
        (b"RVT1" + struct.pack("<I", 2) + encode({"a": np.zeros(1, np.uint8)})[8:], "malformed"),
    ],
)
def test_malformed_frames_raise_codec_error(message: bytes, match: str) -> None:
    """Bad magic, short headers, unknown codes, bad names, short data, trailing bytes."""
    with pytest.raises(CodecError, match=match):
        decode(message)


def test_random_garbage_raises_codec_error() -> None:
    """Random bytes, with or without the magic, never decode and never raise anything else."""
    rng = random.Random(1234)
    valid = _frame()
    for _ in range(3000):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 80)))
        for message in (body, frames._MAGIC + body, valid + body[:1] if body else valid + b"?"):
            with pytest.raises(CodecError):
                decode(message)


def _one_tensor_header(dims: tuple[int, ...]) -> bytes:
    header = b"RVT1" + struct.pack("<IH1sBB", 1, 1, b"x", 0, len(dims))
    header += struct.pack(f"<{len(dims)}Q", *dims)
    return header + b"\0" * (-len(header) % 8) + b"\0" * 16


def test_absurd_dimensions_raise_codec_error() -> None:
    """Dims whose product overflows or exceeds the frame are reported as CodecError."""
    for dims in [(2**64 - 1,), (2**63,), (2**32, 2**32), (2**62, 3), (0, 2**63 + 5)]:
        with pytest.raises(CodecError):
            decode(_one_tensor_header(dims))


def test_corrupted_headers_raise_codec_error() -> None:
    """Random byte corruption of a valid frame is either decoded or rejected with CodecError."""
    rng = random.Random(99)
    valid = _frame()
    for _ in range(5000):
        message = bytearray(valid)
        for _ in range(rng.randint(1, 3)):
            message[rng.randrange(len(message))] = rng.randrange(256)
        with contextlib.suppress(CodecError):
            decode(bytes(message))


@pytest.mark.parametrize(
    "value", [np.float32(2.5), np.int64(-3), np.uint8(7), np.array(1.25, dtype="<f8")], ids=repr
)
def test_scalars_stay_zero_dimensional(value: np.generic | np.ndarray) -> None:
    """NumPy scalars and 0-d arrays decode as 0-d arrays (not shape (1,))."""
    out = decode(encode({"s": value}))["s"]
    assert out.shape == ()
    assert out.dtype == np.asarray(value).dtype
    assert out == value
