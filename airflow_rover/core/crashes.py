"""A node's crash, told apart from bad luck: what killed it (a signature: the exception's type,
its message with the numbers taken out, and where it was raised) and whether the same thing
happened often enough, in enough places, that no restart can fix it.

A worker holding a shard when it died may have died of that shard's data (a poison shard: the
queue quarantines it after ``recovery.max_shard_failures`` deaths). The same exception on
*different* shards, or from nodes that held none (at start-up, the evaluator, a PS), is the
job's own: the model or the data as a whole. ``RepeatedFailures`` says when.
"""

from __future__ import annotations

import os
import re
import sysconfig
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

MESSAGE_CHARS = 2000  # of the exception's message kept in a crash record
TAIL_CHARS = 6000  # of the formatted traceback kept
SIGNATURE_CHARS = 300  # of the normalised first line that the signature compares
_STDLIB = (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"])
# Frames in these packages are plumbing: the place a user looks for is where the user's code
# (or ours) called into them.
_PLUMBING = (
    "tensorflow",
    "keras",
    "tf_keras",
    "absl",
    "numpy",
    "google/protobuf",
    "grpc",
    "httpx",
    "httpcore",
)
_GENERATED = ("__autograph_generated_file", "<")  # AutoGraph's copies, <frozen ...>, <string>
# a number on its own (an id, a count, a row, an address), not one inside a name like C1
_NUMBER = re.compile(r"\b(0x[0-9a-fA-F]+|\d+(\.\d+)?([eE][-+]?\d+)?)\b")
_SPACE = re.compile(r"\s+")
_TF_NODE = re.compile(r"^\s*\{\{function_node [^}]*\}\}\s*")  # TensorFlow's op context
_PYTHON_ERROR = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit): ")
# TensorFlow's lines around the error of a Python function it ran (a py_function, tf.data)
_BOILERPLATE = ("Graph execution error:", "Detected at node", "File ", "Traceback ")


def headline(message: str) -> str:
    """The line of ``message`` that says what went wrong: the Python error TensorFlow
    relays from inside a graph or input pipeline where there is one, else its first line."""
    lines = [_TF_NODE.sub("", line).strip() for line in message.splitlines()]
    lines = [line for line in lines if line]
    relayed = next((line for line in lines if _PYTHON_ERROR.match(line)), None)
    if relayed is not None:
        return relayed
    return next((line for line in lines if not line.startswith(_BOILERPLATE)), "")


def normalise(message: str) -> str:
    """``message``'s headline with every number on its own replaced by ``N``: two nodes
    that died of the same mistake on different rows or ids read the same."""
    return _SPACE.sub(" ", _NUMBER.sub("N", headline(message))).strip()[:SIGNATURE_CHARS]


def _is_plumbing(filename: str) -> bool:
    path = filename.replace(os.sep, "/")
    if filename.startswith(_STDLIB) and "site-packages" not in path:
        return True
    if path.rsplit("/", 1)[-1].startswith(_GENERATED):
        return True  # a temporary file of another name in every process
    return any(f"/{package}/" in path for package in _PLUMBING)


def raised_at(exc: BaseException) -> str:
    """``dir/file.py:function:line`` of the innermost frame of ``exc``'s traceback outside
    TensorFlow, Keras, numpy, the wire and the standard library (else the innermost one)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    frame = next((f for f in reversed(frames) if not _is_plumbing(f.filename)), frames[-1])
    short = "/".join(frame.filename.replace(os.sep, "/").split("/")[-2:])
    return f"{short}:{frame.name}:{frame.lineno}"


@dataclass(frozen=True)
class Crash:
    """What a node's uncaught exception was (it reports this to the master before exiting).
    ``transient``: a kind of error a restart may well fix (a network error, a timeout, out of
    memory): never taken for a deterministic failure."""

    exc_type: str
    message: str
    where: str
    transient: bool = False
    tail: str = field(default="", compare=False)

    @classmethod
    def of(cls, exc: BaseException, transient: bool = False, message: str | None = None) -> Crash:
        """``exc``'s record; ``message``: what it says, where ``str(exc)`` says it badly."""
        kind = type(exc)
        module = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
        formatted = "".join(traceback.format_exception(exc))
        return cls(
            exc_type=f"{module}{kind.__qualname__}",
            message=(str(exc) if message is None else message)[:MESSAGE_CHARS],
            where=raised_at(exc),
            transient=transient,
            tail=formatted[-TAIL_CHARS:],
        )

    @property
    def signature(self) -> str:
        """Equal for the same mistake on any node, whatever row or id it met."""
        return f"{self.exc_type}: {normalise(self.message)} @ {self.where}"

    def summary(self) -> str:
        """One line for people: the exception's short name, its first line, where."""
        return (
            f"{self.exc_type.rsplit('.', 1)[-1]}: {headline(self.message)[:500]} (at {self.where})"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Death:
    """One node death with a crash record: which node, and the shard its worker was training
    (None: it held none, or it is not a worker)."""

    node_id: str
    crash: Crash
    shard_id: int | None = None


@dataclass(frozen=True)
class Verdict:
    """The job cannot be fixed by a restart: ``deaths`` died of the same ``signature``."""

    signature: str
    crash: Crash
    deaths: tuple[Death, ...]

    @property
    def nodes(self) -> list[str]:
        return sorted({d.node_id for d in self.deaths})

    @property
    def shards(self) -> list[int]:
        return sorted({d.shard_id for d in self.deaths if d.shard_id is not None})


class RepeatedFailures:
    """Counts deaths by signature; a signature seen in ``threshold`` different places (shards,
    or deaths of nodes that held no shard) is deterministic. Deaths on one shard stay that
    shard's (the poison-shard quarantine handles them); transient crashes never count."""

    def __init__(self, threshold: int) -> None:
        if threshold < 2:
            raise ValueError(f"threshold must be >= 2 (one death proves nothing), got {threshold}")
        self.threshold = threshold
        self._deaths: dict[str, list[Death]] = {}

    def record(self, death: Death) -> Verdict | None:
        """Count ``death``; the verdict once its signature is deterministic, else None."""
        if death.crash.transient:
            return None
        deaths = self._deaths.setdefault(death.crash.signature, [])
        deaths.append(death)
        places = {
            ("shard", d.shard_id) if d.shard_id is not None else ("death", i)
            for i, d in enumerate(deaths)
        }
        if len(places) < self.threshold:
            return None
        return Verdict(death.crash.signature, death.crash, tuple(deaths))
