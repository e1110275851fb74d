"""A resize's hand-over of rows, cut into messages of bounded size: a PS takes requests only up
to its job's limit (``rpc.ps_service.receive_limit``), and one table's moving rows can be
gigabytes."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

TABLE_PREFIX = "table/"


def in_pieces(arrays: dict[str, np.ndarray], budget: int) -> Iterator[dict[str, np.ndarray]]:
    """``arrays`` as messages of at most ``budget`` bytes of rows each (a row larger than that
    goes alone). Rows are ``table/<name>/<field>`` arrays, aligned per table along their first
    axis (``ids``, ``rows``, ``counts``, ``state/<slot>``): each piece has a run of a table's
    rows in every field, so ``EmbeddingTable.absorb`` takes pieces one by one. Every other
    array (dense variables, the ledger) goes whole in the first piece, which always comes."""
    tables: dict[str, dict[str, np.ndarray]] = {}
    piece: dict[str, np.ndarray] = {}
    for key, value in arrays.items():
        if key.startswith(TABLE_PREFIX):
            name, field = key[len(TABLE_PREFIX) :].split("/", 1)
            tables.setdefault(name, {})[field] = value
        else:
            piece[key] = value
    room, fresh = budget, True  # the first piece holds rows only up to the same budget
    for name, fields in tables.items():
        n = len(fields["ids"])
        row = max(1, sum(v.nbytes for v in fields.values()) // max(n, 1))
        start = 0
        while start < n:
            take = min(n - start, max(room, 0) // row) or (1 if fresh else 0)
            if take == 0:  # full: the rest goes in the next piece
                yield piece
                piece, room, fresh = {}, budget, True
                continue
            for field, value in fields.items():
                piece[f"{TABLE_PREFIX}{name}/{field}"] = value[start : start + take]
            start += take
            room -= take * row
            fresh = False
    yield piece
