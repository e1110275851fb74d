"""The arrays of an uncompressed ``.npz``, read straight from a memory mapping of the file.

``np.load`` reads each member through ``zipfile``, which checks the member's CRC-32 and copies
it through a buffered stream. A checkpoint part is hashed whole with SHA-256 before it is read
(``checkpoint_files.read_npz``), so the CRC says nothing more: here each member's ``.npy``
header is parsed where the zip's local header puts it, and the array is one copy out of the
mapping that was just hashed. Compressed members, pickled object arrays and anything else
this does not handle fall back to ``np.load``.
"""

from __future__ import annotations

import io
import mmap
import re
import struct
import zipfile
from typing import Any

import numpy as np

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., name length, extra length
_LOCAL_SIGNATURE = b"PK\x03\x04"
_NPY_MAGIC = b"\x93NUMPY"
_HEADER_LENGTH = {1: struct.Struct("<H"), 2: struct.Struct("<I")}  # by .npy major version
# What numpy's own writer puts in a header: a plain dtype, the order, the shape.
_PLAIN_HEADER = re.compile(
    rb"\{'descr': '([<>|=][a-zA-Z]\d*)', 'fortran_order': (True|False), 'shape': \(([\d, ]*)\), \}"
)


class NotPlain(ValueError):
    """A member this reader does not read (compressed, or not a plain ``.npy``)."""


def arrays_from_map(fh: Any, mapped: mmap.mmap) -> dict[str, np.ndarray]:
    """Every ``name.npy`` member of the zip open as ``fh`` and mapped as ``mapped``, by
    ``name`` (as ``np.load`` keys them); raises ``NotPlain`` for what it does not read."""
    with zipfile.ZipFile(fh) as archive:
        members = archive.infolist()
    out = {}
    for info in members:
        if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
            raise NotPlain(f"{info.filename}: not a stored .npy member")
        out[info.filename[: -len(".npy")]] = _member(mapped, info)
    return out


def _member(mapped: mmap.mmap, info: zipfile.ZipInfo) -> np.ndarray:
    start = info.header_offset
    signature, name_len, extra_len = _LOCAL_HEADER.unpack_from(mapped, start)
    if signature != _LOCAL_SIGNATURE:
        raise NotPlain(f"{info.filename}: no local header at {start}")
    data = start + _LOCAL_HEADER.size + name_len + extra_len
    end = data + info.file_size
    magic = mapped[data : data + len(_NPY_MAGIC) + 2]
    plain = len(magic) == len(_NPY_MAGIC) + 2 and magic.startswith(_NPY_MAGIC) and not magic[-1]
    length = _HEADER_LENGTH.get(magic[-2]) if plain else None
    if length is None:
        raise NotPlain(f"{info.filename}: not a .npy of version 1.0 or 2.0")
    header_start = data + len(magic) + length.size
    (header_len,) = length.unpack_from(mapped, data + len(magic))
    if header_start + header_len > end:
        raise NotPlain(f"{info.filename}: its header runs past the member")
    shape, fortran, dtype = _header(mapped[data : header_start + header_len], magic[-2])
    if dtype.hasobject:
        raise NotPlain(f"{info.filename}: object arrays are not read")
    count = int(np.prod(shape, dtype=np.int64))
    offset = header_start + header_len
    if offset + count * dtype.itemsize > end:
        raise NotPlain(f"{info.filename}: shorter than its header says")
    flat = np.frombuffer(mapped, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape, order="F" if fortran else "C").copy(order="K")


def _header(raw: bytes, major: int) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    """Shape, Fortran order and dtype of a ``.npy`` header (magic to its end): numpy's own
    layout read by a pattern (numpy's parser evaluates the dict, 20 us a member), anything
    else by numpy."""
    brace = raw.find(b"{")
    plain = _PLAIN_HEADER.match(raw, brace) if brace >= 0 else None
    if plain is not None:
        descr, fortran, dims = plain.groups()
        shape = tuple(int(d) for d in dims.split(b",") if d.strip())
        return shape, fortran == b"True", np.dtype(descr.decode())
    head = io.BytesIO(raw)
    np.lib.format.read_magic(head)
    read = (
        np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    )
    shape, fortran, dtype = read(head)
    return shape, fortran, dtype
