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


_JUMP = np.uint64(2862933555777941757)


def jump_hash(keys: np.ndarray, num_buckets: int) -> np.ndarray:
    """Jump consistent hash (Lamping and Veach, 2014), vectorised: a bucket per 64-bit key such
    that going from n to n+1 buckets moves only 1/(n+1) of the keys, all into the new bucket.
    So resizing the PS from p to p' moves the fewest rows any placement could."""
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    key = keys.astype(np.uint64, copy=True)
    bucket = np.zeros(key.shape, dtype=np.int64)
    nxt = np.zeros(key.shape, dtype=np.int64)
    active = np.ones(key.shape, dtype=bool)
    with np.errstate(over="ignore"):
        while active.any():
            bucket[active] = nxt[active]
            key[active] = key[active] * _JUMP + np.uint64(1)
            step = (bucket[active] + 1) * (float(1 << 31) / ((key[active] >> np.uint64(33)) + 1.0))
            nxt[active] = step.astype(np.int64)
            active &= nxt < num_buckets
    return bucket


def partition_of(table: str, ids: np.ndarray, num_ps: int) -> np.ndarray:
    """Index of the PS that owns each ``(table, id)`` row (consistent under a PS resize)."""
    if num_ps == 1:
        return np.zeros(ids.shape, dtype=np.int64)
    return jump_hash(splitmix64(ids.astype(np.uint64) ^ name_salt(table)), num_ps)


def owner_of(name: str, num_ps: int) -> int:
    """Index of the PS that holds the dense variable ``name``."""
    return int(jump_hash(splitmix64(np.array([name_salt(name)])), num_ps)[0])


INIT_SCALE = 0.05  # embedding rows start uniform in [-INIT_SCALE, INIT_SCALE)


def initial_rows(table: str, ids: np.ndarray, dim: int, seed: int, scale: float) -> np.ndarray:
    """Seeded initial embedding rows, uniform in [-scale, scale), as float32 (len(ids), dim)."""
    base = splitmix64(ids.astype(np.uint64) ^ name_salt(table) ^ np.uint64(seed & (2**64 - 1)))
    with np.errstate(over="ignore"):
        bits = splitmix64(base[:, None] + np.arange(dim, dtype=np.uint64)[None, :])
    unit = (bits >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))
    return (unit * np.float32(2 * scale) - np.float32(scale)).astype(np.float32)


# Categorical values hashed into a table's buckets (docs/data-formats.md): fixed forever, as a
# changed function would scramble every trained table, and simple to reproduce when serving.
FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)


def hash_ints(values: np.ndarray) -> np.ndarray:
    """``splitmix64`` of integer ids (negative ones as their two's complement), as uint64."""
    return splitmix64(np.asarray(values).astype(np.int64, copy=False).view(np.uint64))


def fnv1a64(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """FNV-1a 64 of each byte string ``data[offsets[i]:offsets[i + 1]]`` (Arrow's layout of a
    string array), vectorised over the strings: one pass per byte position."""
    offsets = np.asarray(offsets, dtype=np.int64)
    data = np.asarray(data, dtype=np.uint8)
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    hashes = np.full(starts.shape, FNV_OFFSET, dtype=np.uint64)
    longest = int(lengths.max()) if lengths.size else 0
    rows = np.arange(starts.size)
    with np.errstate(over="ignore"):
        for position in range(longest):
            rows = rows[lengths[rows] > position]
            byte = data[starts[rows] + position].astype(np.uint64)
            hashes[rows] = (hashes[rows] ^ byte) * FNV_PRIME
    return hashes


def hash_strings(strings: list[str] | list[bytes]) -> np.ndarray:
    """``splitmix64(fnv1a64(utf8(s)))`` of each string, as uint64 (the same as for an Arrow
    string array's buffers)."""
    encoded = [s.encode() if isinstance(s, str) else bytes(s) for s in strings]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    return splitmix64(fnv1a64(offsets, data))


def to_buckets(hashes: np.ndarray, buckets: int) -> np.ndarray:
    """Bucket ``hash mod buckets`` of each uint64 hash, as int64 ids in ``[0, buckets)``."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    return (hashes % np.uint64(buckets)).astype(np.int64)
