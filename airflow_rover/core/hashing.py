"""Stable hashing: which PS owns a row, and a row's seeded initial value.

Both are pure functions of (table, id, seed), never of process state or creation order, so a
row lands on the same PS in every process and a lost row can be re-created identically.
"""

from __future__ import annotations

import hashlib

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, vectorised: a fast, well-mixed 64-bit hash of each element."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64, copy=True) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def name_salt(name: str) -> np.uint64:
    """A 64-bit salt from a name, the same in every process (unlike ``hash(str)``)."""
    return np.uint64(int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big"))


def partition_of(table: str, ids: np.ndarray, num_ps: int) -> np.ndarray:
    """Index of the PS that owns each ``(table, id)`` row."""
    keys = ids.astype(np.uint64) ^ name_salt(table)
    return (splitmix64(keys) % np.uint64(num_ps)).astype(np.int64)


def owner_of(name: str, num_ps: int) -> int:
    """Index of the PS that holds the dense variable ``name``."""
    return int(splitmix64(np.array([name_salt(name)]))[0] % np.uint64(num_ps))


def initial_rows(table: str, ids: np.ndarray, dim: int, seed: int, scale: float) -> np.ndarray:
    """Seeded initial embedding rows, uniform in [-scale, scale), as float32 (len(ids), dim)."""
    base = splitmix64(ids.astype(np.uint64) ^ name_salt(table) ^ np.uint64(seed & (2**64 - 1)))
    with np.errstate(over="ignore"):
        bits = splitmix64(base[:, None] + np.arange(dim, dtype=np.uint64)[None, :])
    unit = (bits >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))
    return (unit * np.float32(2 * scale) - np.float32(scale)).astype(np.float32)
