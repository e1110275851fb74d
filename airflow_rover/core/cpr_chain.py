"""A PS's chain of CPR partial saves on disk, kept short by folding it off the training path.

MFU/SSU save ``r*N`` rows every ``r*T_save``; restoring replays the saves (``core.cpr``'s
``latest_rows``). Left alone, a chain since the last full save grows without end and a restore
reads several tables' worth of bytes, the hot rows many times over (MFU saves them in nearly
every save). ``PartialChain`` folds the chain into one base file (each row's newest saved copy)
whenever the base and the chain together hold more bytes than the PS's full table (and a
slack), or more files than its owner allows, in a background thread: a save costs only its own
rows, and a restore reads about one full table (the base, at most every row once) plus the
saves since the last fold.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from airflow_rover.core.checkpoint_files import read_npz_parts, write_npz
from airflow_rover.core.cpr import latest_rows

TABLE_PREFIX = "table/"


def merge_saves(
    saves: Sequence[Mapping[str, np.ndarray]], ascending: bool = True
) -> dict[str, np.ndarray]:
    """Partial saves of one PS (oldest first, ``table/<name>/<field>`` arrays with an
    ``ids`` field per table) merged into one: each row's fields from its newest save."""
    tables = sorted(
        {
            k[len(TABLE_PREFIX) :].split("/", 1)[0]
            for s in saves
            for k in s
            if k.startswith(TABLE_PREFIX)
        }
    )
    out: dict[str, np.ndarray] = {}
    for name in tables:
        prefix = f"{TABLE_PREFIX}{name}/"
        parts = [
            (s[f"{prefix}ids"], {k[len(prefix) :]: v for k, v in s.items() if k.startswith(prefix)})
            for s in saves
            if f"{prefix}ids" in s
        ]
        ids, fields = latest_rows(parts, ascending=ascending)
        fields["ids"] = ids
        out.update({f"{prefix}{k}": v for k, v in fields.items()})
    return out


def read_saves(paths: Sequence[Path]) -> list[dict[str, np.ndarray]]:
    """The saves at ``paths``, checksums checked, in order (raises on a damaged one)."""
    saves = []
    for _, arrays in read_npz_parts(paths):
        if isinstance(arrays, Exception):
            raise arrays
        saves.append(arrays)
    return saves


class PartialChain:
    """One PS's partial saves since ``root`` began: a folded base file plus the saves since.

    ``add`` each save as it is written, with the bytes the PS's full table takes now;
    ``paths`` are what a restore reads (``read`` merges them). With ``background=False`` the
    fold runs inside ``add`` (tests, and callers that have no training to keep going).
    ``max_files`` bounds the files a restore opens (each costs about 0.5 ms beyond its bytes:
    the open, its checksum's trailer, the zip's directory, a header per array): CPR's runtime
    restores its last flash checkpoint and at most ``1/r - 1`` saves since, ``1/r`` files.
    """

    def __init__(
        self,
        root: Path,
        background: bool = True,
        slack: float = 0.25,
        max_files: int | None = None,
    ) -> None:
        if slack < 0:
            raise ValueError(f"slack={slack!r}: must be >= 0")
        if max_files is not None and max_files < 2:
            raise ValueError(f"max_files={max_files!r}: must be >= 2 (the base and a save)")
        self.root = root
        self.background = background
        self.slack = slack
        self.max_files = max_files
        self.base: Path | None = None
        self.chain: list[Path] = []
        self.folds = 0
        self.fold_s = 0.0  # spent folding, off the training path
        self.read_bytes = 0  # what the last ``read`` read
        self._sizes: dict[Path, int] = {}  # of the base and the chain's files, as written
        self._lock = threading.Lock()  # base and chain: a fold swaps them, a restore lists them
        self._thread: threading.Thread | None = None
        self._error: Exception | None = None

    def paths(self) -> list[Path]:
        with self._lock:
            return ([self.base] if self.base else []) + list(self.chain)

    def held_bytes(self) -> int:
        with self._lock:
            return sum(self._sizes[p] for p in ([self.base] if self.base else []) + self.chain)

    def add(self, path: Path, table_bytes: int) -> None:
        """A save was written at ``path``; fold once the base and the chain hold more than
        ``1 + slack`` tables (the slack spaces the folds out: the base alone nears a table
        once most rows were saved) or more than ``max_files`` files."""
        if table_bytes < 0:
            raise ValueError(f"table_bytes={table_bytes!r}: must be >= 0")
        self._raise_fold_error()
        size = path.stat().st_size
        with self._lock:
            self.chain.append(path)
            self._sizes[path] = size
        if self.folding or not self._over(table_bytes):  # only ``add`` folds
            return
        if not self.background:
            self._fold()
            self._raise_fold_error()
            return
        self._thread = threading.Thread(target=self._fold, name="cpr-fold", daemon=True)
        self._thread.start()

    def _over(self, table_bytes: int) -> bool:
        if self.max_files is not None and len(self.paths()) > self.max_files:
            return True
        return self.held_bytes() > (1 + self.slack) * table_bytes

    @property
    def folding(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Until the fold in flight (if any) is done; raises what it raised."""
        if self._thread is not None:
            self._thread.join()
        self._raise_fold_error()

    def read(self) -> dict[str, np.ndarray]:
        """Every row ever saved, its newest copy (ids in any order); ``read_bytes`` says how
        many bytes of files it read. The chain cannot change meanwhile."""
        with self._lock:
            paths = ([self.base] if self.base else []) + list(self.chain)
            self.read_bytes = sum(self._sizes[p] for p in paths)
            return merge_saves(read_saves(paths), ascending=False)

    def _fold(self) -> None:
        start = time.perf_counter()
        try:
            with self._lock:
                base, chain = self.base, list(self.chain)
            folded = ([base] if base else []) + chain
            merged = merge_saves(read_saves(folded))
            target = self.root / f"fold-{self.folds:05d}.npz"
            written = write_npz(target, merged.items())
            with self._lock:  # saves added meanwhile stay in the chain, after the new base
                self.base = target
                self.chain = self.chain[len(chain) :]
                self.folds += 1
                for path in folded:
                    del self._sizes[path]
                self._sizes[target] = written.bytes
            for path in folded:
                path.unlink(missing_ok=True)
        except Exception as exc:  # reported by the next add or wait
            self._error = exc
        finally:
            self.fold_s += time.perf_counter() - start

    def _raise_fold_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"folding the partial saves under {self.root} failed") from error
