"""Which raw id a position of a positional table holds, as a parity field.

A positional table (``ParityPlacement(positional=...)``) numbers rows by their position on
their PS, which only the owner can map to an id. So each coded row carries one more field,
``KEY_FIELD``: the id's two 32-bit halves and a presence flag, as float64 (``[hi, lo, 1]``; a
position that holds no coded row is ``[0, 0, 0]``). Both codecs decode it exactly: the sum
codec adds integers below ``2**32`` in float64, which is exact for any number of members, and
XOR works on the bit patterns. Decoding a lost position's key field says whether it held a row
and which id.
"""

from __future__ import annotations

import numpy as np

KEY_FIELD = "key"
KEY_DTYPE = np.dtype(np.float64)
_HALF = 2**32


def key_fields(ids: np.ndarray) -> np.ndarray:
    """The key field of rows holding ``ids`` (any int64, or uint64 read as int64)."""
    bits = np.asarray(ids, dtype=np.int64).view(np.uint64)
    out = np.empty((bits.size, 3), dtype=KEY_DTYPE)
    out[:, 0] = bits >> np.uint64(32)
    out[:, 1] = bits & np.uint64(_HALF - 1)
    out[:, 2] = 1.0
    return out


def no_keys(n: int) -> np.ndarray:
    """The key field of ``n`` positions holding no coded row."""
    return np.zeros((n, 3), dtype=KEY_DTYPE)


def decode_keys(table: str, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mask of positions holding a row, their ids) from decoded key fields. Anything but an
    exact ``[hi, lo, 1]`` or ``[0, 0, 0]`` means the parity is not what its members sent:
    raised, naming the table, rather than rebuilding a row under a wrong id."""
    key = np.asarray(key, dtype=KEY_DTYPE).reshape(-1, 3)
    present = key[:, 2] == 1.0
    halves = key[:, :2]
    whole = (halves == np.floor(halves)) & (halves >= 0) & (halves < _HALF)
    valid = np.where(present, whole.all(axis=1), (key == 0.0).all(axis=1))
    if not valid.all():
        bad = int(np.flatnonzero(~valid)[0])
        raise ValueError(
            f"table {table!r}: a decoded row key is {key[bad].tolist()}, neither an id nor "
            "an empty position: the parity does not match its members"
        )
    bits = (halves[present, 0].astype(np.uint64) << np.uint64(32)) | halves[present, 1].astype(
        np.uint64
    )
    return present, bits.view(np.int64)
