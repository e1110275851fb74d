"""ECRM's RPCs as arrays: every ``Ecrm`` call is a dict of arrays (``rpc.frames``), so text
and int maps are spelled as arrays, and a parity RPC carries a channel's messages in a frame."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from airflow_rover.core.ecrm.codecs import Fields
from airflow_rover.core.ecrm.propagation import ParityDelta, TableDelta
from airflow_rover.core.ledger import NO_KEY


def text(value: str) -> np.ndarray:
    return np.frombuffer(value.encode(), dtype=np.uint8)


def read_text(value: np.ndarray) -> str:
    return value.tobytes().decode()


def ints(values: Mapping[int, int]) -> dict[str, np.ndarray]:
    keys = sorted(values)
    return {
        "keys": np.array(keys, dtype=np.int64),
        "values": np.array([values[k] for k in keys], dtype=np.int64),
    }


def read_ints(reply: Mapping[str, np.ndarray]) -> dict[int, int]:
    return {int(k): int(v) for k, v in zip(reply["keys"], reply["values"], strict=True)}


def encode_frame(
    source: int,
    epoch: int,
    entries: list[tuple[ParityDelta | None, int | None]],
    dense: Fields | None,
) -> dict[str, np.ndarray]:
    """One parity RPC: messages in channel order with the batch key each came from (a push
    with no row for this holder sends its key alone; an update held by a rebuild and applied
    later, its message alone), and (now and then) the source's dense variables."""
    deltas = [d for d, _ in entries if d is not None]
    out = {
        "op": text("parity"),
        "source": np.array([source, epoch], dtype=np.int64),
        "batch_keys": np.array([k for _, k in entries if k is not None], dtype=np.int64),
        "delta_keys": np.array(
            [NO_KEY if k is None else k for d, k in entries if d is not None], dtype=np.int64
        ),
        "n": np.array([len(deltas)], dtype=np.int64),
    }
    for i, d in enumerate(deltas):
        out[f"d{i}/meta"] = np.array(
            [d.source, d.epoch, d.holder, d.holder_epoch, d.seq], dtype=np.int64
        )
        for j, part in enumerate(d.tables):
            out[f"d{i}/t{j}/table"] = text(part.table)
            out[f"d{i}/t{j}/ids"] = part.ids
            out.update({f"d{i}/t{j}/f/{name}": v for name, v in part.fields.items()})
    if dense:
        out.update({f"replica/{k}": v for k, v in dense.items()})
    return out


def decode_frame(frame: Mapping[str, np.ndarray]) -> list[ParityDelta]:
    """The messages of ``encode_frame``'s frame (its keys read once: a frame holds hundreds)."""
    fields: dict[tuple[int, int], dict[str, np.ndarray]] = {}
    for key, value in frame.items():
        if key.startswith("d") and "/f/" in key:
            head, name = key.split("/f/", 1)
            d, t = head.split("/")
            fields.setdefault((int(d[1:]), int(t[1:])), {})[name] = value
    deltas = []
    for i in range(int(frame["n"][0])):
        source, epoch, holder, holder_epoch, seq = (int(x) for x in frame[f"d{i}/meta"])
        parts = []
        j = 0
        while f"d{i}/t{j}/table" in frame:
            table = read_text(frame[f"d{i}/t{j}/table"])
            parts.append(TableDelta(table, frame[f"d{i}/t{j}/ids"], fields.get((i, j), {})))
            j += 1
        deltas.append(ParityDelta(source, epoch, holder, holder_epoch, seq, tuple(parts)))
    return deltas
