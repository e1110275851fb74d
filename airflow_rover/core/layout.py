"""Where a job keeps its files, and how its processes find each other.

A job directory is the job's identity on the local launcher: the operator writes ``job.json``
and ``token`` there, the master announces itself in ``master.json`` and mirrors its status to
``state.json`` (atomically, so a reader never sees half a file), nodes log to ``logs/``, and the
trained model lands in ``model/``.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_rover.core.spec import JobSpec

ENV_JOB_DIR = "ROVER_JOB_DIR"
ENV_NODE_ID = "ROVER_NODE_ID"
ENV_MASTER_ADDR = "ROVER_MASTER_ADDR"
ENV_TOKEN_FILE = "ROVER_TOKEN_FILE"


@dataclass(frozen=True)
class JobLayout:
    root: Path

    @property
    def spec_file(self) -> Path:
        return self.root / "job.json"

    @property
    def token_file(self) -> Path:
        return self.root / "token"

    @property
    def master_file(self) -> Path:
        return self.root / "master.json"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    def log_file(self, node_id: str) -> Path:
        return self.logs / f"{node_id}.log"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint_dir(self, number: int) -> Path:
        return self.checkpoints / f"ckpt-{number:06d}"

    def latest_checkpoint(self) -> Path | None:
        """The last complete checkpoint: ``checkpoints/LATEST`` names it, and it is written
        only after every part of the checkpoint is on disk."""
        try:
            name = (self.checkpoints / "LATEST").read_text().strip()
        except FileNotFoundError:
            return None
        return self.checkpoints / name

    def commit_checkpoint(self, directory: Path) -> None:
        atomic_write_text(self.checkpoints / "LATEST", directory.name)

    # -- reading and writing -----------------------------------------------------------------
    def write_spec(self, spec: JobSpec) -> None:
        atomic_write_text(self.spec_file, spec.model_dump_json(indent=2))

    def read_spec(self) -> JobSpec:
        return JobSpec.model_validate_json(self.spec_file.read_text())

    def ensure_token(self) -> str:
        """The job's bearer token: created once (0600), then reused by every try and process."""
        if self.token_file.exists():
            return self.token_file.read_text().strip()
        self.root.mkdir(parents=True, exist_ok=True)
        token = secrets.token_urlsafe(32)
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(token)
        return token

    def read_token(self) -> str:
        return self.token_file.read_text().strip()

    def master_info(self) -> dict[str, Any]:
        """What the master announced (``address``, ``pid``); empty before it listens."""
        return self.read_json(self.master_file) or {}

    def read_json(self, path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary sibling and rename: readers see the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True))


@dataclass(frozen=True)
class NodeContext:
    """What a PS, worker or evaluator process is told by its launcher, through the environment."""

    job_dir: Path
    node_id: str
    master_addr: str
    token: str

    @property
    def layout(self) -> JobLayout:
        return JobLayout(self.job_dir)

    @classmethod
    def from_env(cls) -> NodeContext:
        missing = [
            v
            for v in (ENV_JOB_DIR, ENV_NODE_ID, ENV_MASTER_ADDR, ENV_TOKEN_FILE)
            if not os.environ.get(v)
        ]
        if missing:
            raise RuntimeError(f"node started without its environment: {missing} unset")
        return cls(
            job_dir=Path(os.environ[ENV_JOB_DIR]),
            node_id=os.environ[ENV_NODE_ID],
            master_addr=os.environ[ENV_MASTER_ADDR],
            token=Path(os.environ[ENV_TOKEN_FILE]).read_text().strip(),
        )
