"""The job's last committed checkpoints, for a reader of its status: when each was taken, how
far training had got, its size and where its durable copy is. Each entry is made once, at the
commit (its size summed from the files then), never on a status request."""

from __future__ import annotations

import collections
import json
import logging
import time
from pathlib import Path
from typing import Any

from airflow_rover.core.checkpoint_files import QUEUE_FILE
from airflow_rover.core.job_dir import checkpoint_number
from airflow_rover.storage import CheckpointMirror, checkpoint_samples

log = logging.getLogger(__name__)

KEEP = 50


def checkpoint_entry(
    directory: Path, mirror: CheckpointMirror | None, at: float | None = None
) -> dict[str, Any]:
    """The history entry of the committed checkpoint ``directory`` (``.../ckpt-<n>``):
    ``samples`` from its ``queue.json`` (None when that cannot be read), ``bytes`` the sum of
    its files, ``uri`` its copy in ``checkpoint_uri`` (named as the mirror names it) or,
    without one, the local directory."""
    samples: int | None
    try:
        samples = checkpoint_samples(json.loads((directory / QUEUE_FILE).read_text()))[0]
    except (OSError, ValueError) as exc:
        log.warning("checkpoint %s: no sample count in its %s: %s", directory.name, QUEUE_FILE, exc)
        samples = None
    files = [p for p in directory.rglob("*") if p.is_file()] if directory.is_dir() else []
    return {
        "id": checkpoint_number(directory.name) or 0,
        "at": time.time() if at is None else at,
        "samples": samples,
        "bytes": sum(p.stat().st_size for p in files),
        "uri": str(directory) if mirror is None else mirror.store.uri_of(directory.name),
    }


class CheckpointHistory:
    """The last ``keep`` committed checkpoints, oldest first (JSON-ready entries)."""

    def __init__(self, keep: int = KEEP) -> None:
        self._entries: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)

    @classmethod
    def on_disk(
        cls, directories: list[Path], last: int, mirror: CheckpointMirror | None
    ) -> CheckpointHistory:
        """The history a master starts with: the committed checkpoints still in the job
        directory (the last two; numbered ``last`` or lower, with their ``queue.json``),
        each timed by its ``queue.json``."""
        history = cls()
        for directory in directories:
            manifest = directory / QUEUE_FILE
            number = checkpoint_number(directory.name)
            if number is None or number > last or not manifest.is_file():
                continue
            history.add(checkpoint_entry(directory, mirror, at=manifest.stat().st_mtime))
        return history

    def add(self, entry: dict[str, Any]) -> None:
        self._entries.append(entry)

    def to_json(self) -> list[dict[str, Any]]:
        """The status's ``recovery.checkpoint_history``."""
        return [dict(e) for e in self._entries]
