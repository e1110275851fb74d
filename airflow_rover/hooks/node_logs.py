"""The new lines of a job's logs (``logs/<node>.log``, the master's included), read a bounded
slice at a time, for the trigger to pass into the Airflow task's log, prefixed by node.

Each poll reads what every file gained since the last poll: at most ``bytes_per_file`` per file
(the newest bytes), at most ``lines_per_node`` lines per node and ``lines_per_poll`` lines in
all (the newest; shared fairly between the nodes), each cut at ``line_chars``; one line says
what was skipped and where the whole logs are. The HTTP client's request lines and
TensorFlow's C++ notes are left out, and so is any line holding the job's token.

Where each file was read up to lives in memory only (the trigger serializes no offsets): a
stream created anew, after a triggerer restart or by a retry that reattaches to a running job,
starts each file at its last ``bytes_per_file`` and says what came before. A file that shrank
or was replaced (a node relaunched with a fresh log) is read again from its start, saying so.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from airflow_rover.core.job_dir import JobDir
from airflow_rover.master.crash_watch import HTTP_REQUEST_LINE
from airflow_rover.worker.tensorflow_notes import TENSORFLOW_NOTE

CUT_MARK = " [... cut]"
SUMMARY = "[logs]"  # the prefix of the stream's own lines about what it skipped


@dataclass(frozen=True)
class StreamLimits:
    """How much of the logs one poll passes on (the rest stays in the files)."""

    bytes_per_file: int = 32 * 1024
    lines_per_node: int = 20
    lines_per_poll: int = 100
    line_chars: int = 1000

    def __post_init__(self) -> None:
        for name in ("bytes_per_file", "lines_per_node", "lines_per_poll", "line_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"StreamLimits.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class _Cursor:
    """How far one file was read: its identity, the offset, an unfinished last line."""

    file_id: tuple[int, int]  # (st_dev, st_ino): a replaced file is another file
    offset: int = 0
    partial: bytes = b""
    discarding: bool = False  # inside a line already cut or skipped, until its newline


@dataclass
class _Read:
    """What one poll found in one node's file."""

    path: Path
    lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped_bytes: int = 0


class NodeLogStream:
    """Poll the logs in ``job_dir``'s ``logs/`` folder for new lines, within ``limits``."""

    def __init__(self, job_dir: JobDir, limits: StreamLimits | None = None) -> None:
        self.job_dir = job_dir
        self.limits = limits or StreamLimits()
        self._cursors: dict[str, _Cursor] = {}
        self._token: str | None = None

    def poll(self) -> list[str]:
        """The lines to log now, each prefixed by its node (``[worker-1] ...``), the summary
        of what was skipped first. Blocking file I/O: call it in a thread."""
        if self._token is None:
            self._token = _read_token(self.job_dir)
        files = _log_files(self.job_dir.logs)
        for gone in set(self._cursors) - set(files):
            del self._cursors[gone]
        reads = {node: self._read(node, path) for node, path in files.items()}
        wanted = {node: min(len(r.lines), self.limits.lines_per_node) for node, r in reads.items()}
        shares = fair_shares(wanted, self.limits.lines_per_poll)
        skipped: list[tuple[str, int, int]] = []
        out: list[str] = []
        for node, read in reads.items():
            keep = shares.get(node, 0)
            out += [f"[{node}] {note}" for note in read.notes]
            out += [f"[{node}] {line}" for line in read.lines[len(read.lines) - keep :]]
            if keep < len(read.lines) or read.skipped_bytes:
                skipped.append((node, len(read.lines) - keep, read.skipped_bytes))
        if skipped:
            out.insert(0, self._summary(skipped))
        return out

    def _summary(self, skipped: list[tuple[str, int, int]]) -> str:
        parts = [_skipped_part(node, lines, size) for node, lines, size in skipped[:5]]
        more = f" and {len(skipped) - 5} more node(s)" if len(skipped) > 5 else ""
        return (
            f"{SUMMARY} skipped {', '.join(parts)}{more} (at most "
            f"{self.limits.lines_per_node} lines per node and {self.limits.lines_per_poll} in "
            f"all per poll); the whole logs are in {self.job_dir.logs}"
        )

    # -- one file ----------------------------------------------------------------------------
    def _read(self, node: str, path: Path) -> _Read:
        """Read what ``path`` gained: at most ``bytes_per_file``, the newest."""
        read = _Read(path)
        try:
            with open(path, "rb") as fh:
                stat = os.fstat(fh.fileno())
                cursor = self._cursor(node, (stat.st_dev, stat.st_ino), stat.st_size, read)
                start = max(cursor.offset, stat.st_size - self.limits.bytes_per_file)
                if start > cursor.offset:  # a gap: resume at a line's start
                    read.skipped_bytes = start - cursor.offset
                    fh.seek(start - 1)
                    cursor.partial = b""
                    cursor.discarding = fh.read(1) != b"\n"
                fh.seek(start)
                data = fh.read(stat.st_size - start)
        except OSError:  # gone between the listing and the read, or unreadable: next poll
            return read
        cursor.offset = start + len(data)
        read.lines = self._lines(cursor, data, read)
        return read

    def _cursor(self, node: str, file_id: tuple[int, int], size: int, read: _Read) -> _Cursor:
        """The file's cursor; a new one (from the start) for a file that shrank or was
        replaced since the last poll."""
        cursor = self._cursors.get(node)
        if cursor is not None and cursor.file_id != file_id:
            read.notes.append("(its log was replaced: reading the new one from its start)")
            cursor = None
        elif cursor is not None and size < cursor.offset:
            read.notes.append(
                f"(its log shrank from {cursor.offset} to {size} bytes: reading it from the start)"
            )
            cursor = None
        if cursor is None:
            cursor = self._cursors[node] = _Cursor(file_id)
        return cursor

    def _lines(self, cursor: _Cursor, data: bytes, read: _Read) -> list[str]:
        """The complete lines in ``cursor.partial + data`` worth showing; an unfinished last
        line waits for the next poll, unless it is longer than a line is shown (then its start
        is shown, cut, and the rest dropped up to its newline)."""
        pieces = (cursor.partial + data).split(b"\n")
        cursor.partial = pieces.pop()
        if cursor.discarding and pieces:
            pieces.pop(0)  # the end of a line cut or skipped earlier
            cursor.discarding = False
        if cursor.discarding:
            cursor.partial = b""
        lines = [self._text(piece, read) for piece in pieces]
        # An unfinished line longer than a shown line: its start now (the rest is dropped),
        # holding enough past the cut to see a token that straddles it.
        hold = self.limits.line_chars + len(self._token or "")
        if len(cursor.partial) > hold:
            lines.append(self._text(cursor.partial[:hold], read, cut=self.limits.line_chars))
            cursor.partial, cursor.discarding = b"", True
        return [line for line in lines if line is not None]

    def _text(self, piece: bytes, read: _Read, cut: int | None = None) -> str | None:
        """The line to show of ``piece`` (its first ``cut`` bytes when given), or None."""
        text = piece.decode("utf-8", "replace").rstrip("\r")
        if self._token and self._token in text:
            read.notes.append("(a line holding the job's token was withheld)")
            return None
        if not worth_showing(text):
            return None
        if cut is not None:
            text = piece[:cut].decode("utf-8", "replace") + CUT_MARK
        return _cut(text, self.limits.line_chars)


def worth_showing(line: str) -> bool:
    """Not blank, not the HTTP client's request line, not one of TensorFlow's C++ notes."""
    return bool(line.strip()) and HTTP_REQUEST_LINE not in line and not TENSORFLOW_NOTE.match(line)


def fair_shares(wanted: dict[str, int], total: int) -> dict[str, int]:
    """Split ``total`` lines between the nodes: each gets what it wants, up to an equal share
    of what the nodes wanting less left over (max-min fairness)."""
    shares: dict[str, int] = {}
    left = total
    ordered = sorted(wanted, key=lambda n: wanted[n])
    for i, node in enumerate(ordered):
        shares[node] = min(wanted[node], left // (len(ordered) - i))
        left -= shares[node]
    return shares


_NODE_LOG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _log_files(logs: Path) -> dict[str, Path]:
    """``<node>.log`` in ``logs``: the master's first, then the nodes in natural order
    (worker-2 before worker-10)."""
    try:
        paths = [p for p in logs.iterdir() if p.suffix == ".log" and _NODE_LOG.match(p.stem)]
    except OSError:
        return {}
    paths.sort(key=lambda p: (p.stem != "master", _natural(p.stem)))
    return {p.stem: p for p in paths}


def _natural(name: str) -> list[tuple[int, int | str]]:
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name)]


def _read_token(job_dir: JobDir) -> str | None:
    try:
        return job_dir.read_token() or None
    except OSError:
        return None


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars or text.endswith(CUT_MARK) else text[:chars] + CUT_MARK


def _skipped_part(node: str, lines: int, size: int) -> str:
    parts = [f"{lines} line(s)"] if lines else []
    if size:
        parts.append(f"{_size(size)} unread")
    return f"{' and '.join(parts)} of {node}"


def _size(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"
