"""A compact binary frame for named tensors: the parameter-server data path.

Layout: ``b"RVT1"``, u32 count, then per tensor: u16 name length, name (UTF-8), u8 dtype code,
u8 ndim, ndim x u64 dims, padding to 8 bytes, raw little-endian data. Decoding is zero-copy
(``np.frombuffer`` views into the message). No per-float encoding, no JSON.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

_MAGIC = b"RVT1"
_DTYPES: tuple[np.dtype, ...] = (
    np.dtype("<f4"),
    np.dtype("<f8"),
    np.dtype("<i4"),
    np.dtype("<i8"),
    np.dtype("<u4"),
    np.dtype("<u8"),
    np.dtype("u1"),
    np.dtype("<f2"),
)
_CODE = {dt: i for i, dt in enumerate(_DTYPES)}


class CodecError(ValueError):
    """A frame that is not a valid tensor message (rejected, never half-applied)."""


def encode(tensors: dict[str, np.ndarray]) -> bytes:
    parts: list[bytes | memoryview] = [_MAGIC, struct.pack("<I", len(tensors))]
    offset = 8
    for name, value in tensors.items():
        arr = np.asarray(value)  # not ascontiguousarray: it turns 0-d arrays into 1-d
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        dtype = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        code = _CODE.get(np.dtype(dtype))
        if code is None:
            raise CodecError(f"tensor {name!r}: dtype {arr.dtype} is not supported")
        raw_name = name.encode()
        header = struct.pack(f"<H{len(raw_name)}sBB", len(raw_name), raw_name, code, arr.ndim)
        header += struct.pack(f"<{arr.ndim}Q", *arr.shape)
        pad = -(offset + len(header)) % 8
        parts.append(header + b"\0" * pad)
        parts.append(arr.astype(dtype, copy=False).reshape(-1).view(np.uint8).data)
        offset += len(header) + pad + arr.nbytes
    return b"".join(parts)


def decode(message: bytes) -> dict[str, np.ndarray]:
    view = memoryview(message)
    if bytes(view[:4]) != _MAGIC:
        raise CodecError("not a tensor frame (bad magic)")
    try:
        (count,) = struct.unpack_from("<I", view, 4)
        pos = 8
        out: dict[str, np.ndarray] = {}
        for _ in range(count):
            (name_len,) = struct.unpack_from("<H", view, pos)
            pos += 2
            name = bytes(view[pos : pos + name_len]).decode()
            pos += name_len
            code, ndim = struct.unpack_from("<BB", view, pos)
            pos += 2
            shape = struct.unpack_from(f"<{ndim}Q", view, pos)
            pos += 8 * ndim
            pos += -pos % 8
            if code >= len(_DTYPES):
                raise CodecError(f"tensor {name!r}: unknown dtype code {code}")
            dtype = _DTYPES[code]
            count_items = math.prod(shape)  # Python ints: absurd dims cannot overflow
            nbytes = count_items * dtype.itemsize
            if pos + nbytes > len(view):
                raise CodecError(f"tensor {name!r}: frame truncated")
            out[name] = np.frombuffer(view, dtype=dtype, count=count_items, offset=pos).reshape(
                shape
            )
            pos += nbytes
    except CodecError:
        raise
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        raise CodecError(f"malformed tensor frame: {exc}") from exc
    if pos != len(view):
        raise CodecError("trailing bytes after the last tensor")
    return out


def one(message: dict[str, np.ndarray], name: str) -> Any:
    """The single value ``message[name]`` holds; a missing field raises KeyError and any
    other shape (empty, 0-d, several values) ValueError naming it: the caller's error, not
    the server's."""
    value = np.asarray(message[name])
    if value.ndim != 1 or value.size != 1:
        raise ValueError(f"{name}: expected one value, got an array of shape {value.shape}")
    return value[0]
