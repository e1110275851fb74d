"""What must match between a model a job starts from (``init_from``) and the job: the model,
the dense width, and where each table's rows live (its group, offset, vocabulary and dim).

A row is keyed by its fused id in a group of tables of one dim (``core.embedding_placement``):
a table added, removed or resized moves the rows after it, so such a source would hand rows
to the wrong ids. Any difference is an error naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_rover.core.embedding_placement import ID_GROUP_PREFIX, EmbeddingPlacement
from airflow_rover.core.spec import FeatureConfig

TableSpot = tuple[str, int, int, int]  # group, offset, vocab_size, dim


def layout_of(model: str | None, features: FeatureConfig) -> dict[str, Any]:
    """The layout of a model: ``model`` (None: unknown), ``num_dense`` and, per table,
    ``[group, offset, vocab_size, dim]`` (JSON-friendly)."""
    tables: dict[str, list[Any]] = {}
    for group in EmbeddingPlacement.from_features(features).groups:
        for t in group.tables:
            tables[t.name] = [group.name, t.offset, t.vocab_size, group.dim]
    return {"model": model, "num_dense": features.num_dense, "tables": tables}


def layout_differences(source: Mapping[str, Any], job: Mapping[str, Any]) -> list[str]:
    """What differs from the ``source``'s layout to the ``job``'s, one sentence each (an
    unknown model is not compared)."""
    out: list[str] = []
    if source.get("model") is not None and source.get("model") != job.get("model"):
        out.append(f"model {source.get('model')!r} (source) != {job.get('model')!r} (this job)")
    if source.get("num_dense") != job.get("num_dense"):
        out.append(f"num_dense {source.get('num_dense')} (source) != {job.get('num_dense')}")
    old, new = _tables(source), _tables(job)
    for name in sorted(set(old) - set(new)):
        out.append(f"table {name!r} is in the source, not in this job")
    for name in sorted(set(new) - set(old)):
        out.append(f"table {name!r} is in this job, not in the source")
    for name in sorted(set(old) & set(new)):
        (g0, o0, v0, d0), (g1, o1, v1, d1) = old[name], new[name]
        if d0 != d1:
            out.append(f"table {name!r}: dim {d0} (source) != {d1}")
        elif v0 != v1 and not (g0 == g1 and g0.startswith(ID_GROUP_PREFIX)):
            # a table of index 'ids' is keyed by raw ids: its vocab_size is only a hint
            out.append(f"table {name!r}: vocab_size {v0} (source) != {v1}")
        elif (g0, o0) != (g1, o1):
            out.append(f"table {name!r}: rows at {g0}+{o0} in the source, {g1}+{o1} here")
    return out


def _tables(layout: Mapping[str, Any]) -> dict[str, TableSpot]:
    tables = layout.get("tables")
    if not isinstance(tables, Mapping):
        return {}
    return {str(k): (str(v[0]), int(v[1]), int(v[2]), int(v[3])) for k, v in tables.items()}
