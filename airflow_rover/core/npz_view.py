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
import struct
import zipfile
from typing import Any

import numpy as np

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., name length, extra length
_LOCAL_SIGNATURE = b"PK\x03\x04"
_MAX_NPY_HEADER = 65536 + 16


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
    head = io.BytesIO(mapped[data : data + min(info.file_size, _MAX_NPY_HEADER)])
    version = np.lib.format.read_magic(head)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(head)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(head)
    else:
        raise NotPlain(f"{info.filename}: .npy version {version}")
    if dtype.hasobject:
        raise NotPlain(f"{info.filename}: object arrays are not read")
    count = int(np.prod(shape, dtype=np.int64))
    offset = data + head.tell()
    if offset + count * dtype.itemsize > data + info.file_size:
        raise NotPlain(f"{info.filename}: shorter than its header says")
    flat = np.frombuffer(mapped, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape, order="F" if fortran else "C").copy(order="K")
