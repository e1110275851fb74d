"""Synthetic npy-columns data whose ``user`` column holds raw 64-bit ids, each with an effect
of its own on the click: what tells a collisionless table (index 'ids') from a vocabulary
the ids are hashed into, where ids sharing a row average their effects away.

The same samples can be written with the ids hashed into ``buckets`` as the readers hash int
columns (``core.hashing``): the vocabulary job of a comparison (``bench/raw_ids.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import expit

from airflow_rover.core.hashing import hash_ints, to_buckets
from airflow_rover.data.reader import MANIFEST_NAME, NpyColumnsReader, sha256_file

SPLITS = ("train", "eval")


@dataclass(frozen=True)
class RawIdConfig:
    """The samples: ``num_ids`` distinct raw ids drawn uniformly from the whole int64 range,
    each with a logit effect of standard deviation ``effect``; a small ``item`` vocabulary
    and ``num_dense`` dense features with weaker effects."""

    num_train: int = 20_000
    num_eval: int = 5_000
    num_ids: int = 2_000
    num_items: int = 50
    num_dense: int = 2
    effect: float = 1.5
    seed: int = 0


@dataclass(frozen=True)
class RawIdData:
    """Where the splits are, and the distinct raw ids of each (sorted)."""

    train_dir: Path
    eval_dir: Path
    train_ids: np.ndarray
    eval_ids: np.ndarray


def write_raw_id_dataset(
    root: Path, config: RawIdConfig = RawIdConfig(), buckets: int | None = None
) -> RawIdData:
    """``root/train`` and ``root/eval``: the ``user`` column as raw int64 ids (manifest
    ``"raw": true``), or with ``buckets`` hashed into ``[0, buckets)`` (a vocabulary)."""
    rng = np.random.default_rng(config.seed)
    info = np.iinfo(np.int64)
    pool = np.unique(rng.integers(info.min, info.max, config.num_ids, np.int64, endpoint=True))
    user_effect = rng.normal(0.0, config.effect, pool.size)
    item_effect = rng.normal(0.0, 0.5, config.num_items)
    dense_weight = rng.normal(0.0, 0.5, config.num_dense)
    seen = []
    for split, n in zip(SPLITS, (config.num_train, config.num_eval), strict=True):
        user = rng.integers(0, pool.size, n)
        item = rng.integers(0, config.num_items, n)
        dense = rng.standard_normal((n, config.num_dense)).astype(np.float32)
        logit = user_effect[user] + item_effect[item] + dense @ dense_weight - 0.5
        label = (rng.random(n) < expit(logit)).astype(np.float32)
        raw = pool[user]
        ids = raw if buckets is None else to_buckets(hash_ints(raw), buckets)
        categorical = np.stack([ids, item], axis=1).astype(np.int64)
        _write_split(root / split, config, dense, categorical, label, buckets)
        seen.append(np.unique(raw))
    return RawIdData(root / "train", root / "eval", seen[0], seen[1])


def _write_split(
    out: Path,
    config: RawIdConfig,
    dense: np.ndarray,
    categorical: np.ndarray,
    label: np.ndarray,
    buckets: int | None,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    arrays = {"dense.npy": dense, "categorical.npy": categorical, "label.npy": label}
    for name, array in arrays.items():
        np.save(out / name, array)
    user = {"name": "user", "vocab_size": config.num_ids, "raw": True}
    if buckets is not None:
        user = {"name": "user", "vocab_size": buckets}
    manifest = {
        "format": NpyColumnsReader.FORMAT,
        "version": 1,
        "num_samples": int(label.size),
        "num_dense": config.num_dense,
        "categorical": [user, {"name": "item", "vocab_size": config.num_items}],
        "seed": config.seed,
        "files": {name: sha256_file(out / name) for name in arrays},
    }
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")


def collision_share(ids: np.ndarray, buckets: int) -> float:
    """The share of distinct ``ids`` that share their bucket with another one when hashed
    into ``buckets`` as the readers hash ints."""
    distinct = np.unique(ids)
    if distinct.size == 0:
        return 0.0
    _, inverse, counts = np.unique(
        to_buckets(hash_ints(distinct), buckets), return_inverse=True, return_counts=True
    )
    return float((counts[inverse] > 1).mean())
