"""A saved model's folder as the PS wrote it (``model.json``, ``ps-<i>.npz``), read back
whole: what the serving export bakes into its SavedModel."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from airflow_rover.core.checkpoint_files import read_npz
from airflow_rover.core.embedding_placement import EmbeddingGroup, EmbeddingPlacement
from airflow_rover.core.spec import FeatureConfig


@dataclass(frozen=True)
class GroupRows:
    """One embedding group as the PS saved it: the ids trained and their rows."""

    group: EmbeddingGroup
    ids: np.ndarray  # int64 (n,), fused ids
    rows: np.ndarray  # float32 (n, dim)


def read_model(folder: Path) -> tuple[dict[str, Any], list[GroupRows], dict[str, np.ndarray]]:
    """The model card, every group's trained rows and the dense weights by variable path."""
    card = json.loads((folder / "model.json").read_text())
    features = FeatureConfig.model_validate(card["features"])
    parts = [read_npz(folder / name) for name in card["partitions"]]
    groups = []
    for group in EmbeddingPlacement.from_features(features).groups:
        prefix = f"table/{group.name}/"
        ids = [p[prefix + "ids"] for p in parts if prefix + "ids" in p]
        rows = [p[prefix + "rows"] for p in parts if prefix + "rows" in p]
        groups.append(
            GroupRows(
                group,
                np.concatenate(ids).astype(np.int64) if ids else np.zeros(0, np.int64),
                np.concatenate(rows).astype(np.float32)
                if rows
                else np.zeros((0, group.dim), np.float32),
            )
        )
    dense = {k[len("dense/") :]: v for p in parts for k, v in p.items() if k.startswith("dense/")}
    return card, groups, dense


def model_seed(card: dict[str, Any], folder: Path) -> int:
    """The job's seed (initial rows depend on it): in the card, else in the job's spec."""
    if "seed" in card:
        return int(card["seed"])
    job_json = folder.parent.parent / "job.json"
    if job_json.exists():
        return int(json.loads(job_json.read_text()).get("training", {}).get("seed", 0))
    raise ValueError(f"{folder}: model.json has no seed and no job.json is next to models/")
