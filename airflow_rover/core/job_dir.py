"""Where a job keeps its files, and how its processes find each other.

A job directory is the job's identity on the local launcher: the operator writes ``job.json``
and ``token`` there, the master announces itself in ``master.json`` and mirrors its status to
``state.json`` (atomically, so a reader never sees half a file), nodes log to ``logs/``, and the
trained model lands in ``model/``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_rover.core.checkpoint_files import (
    CHECKPOINT_PREFIX,
    checkpoint_number,
    fsync_path,
    verify_checkpoint,
)
from airflow_rover.core.job_tls import JobTLS
from airflow_rover.core.spec import JobSpec

log = logging.getLogger(__name__)

ENV_JOB_DIR = "ROVER_JOB_DIR"
ENV_NODE_ID = "ROVER_NODE_ID"
ENV_MASTER_ADDR = "ROVER_MASTER_ADDR"
ENV_TOKEN_FILE = "ROVER_TOKEN_FILE"
ENV_FLASH_DIR = "ROVER_FLASH_DIR"
# Where a PS or a data worker listens and what address it announces (pods: all interfaces, a
# stable DNS name and port; local processes: loopback and a free port).
ENV_BIND_HOST = "ROVER_BIND_HOST"
ENV_ADVERTISE_HOST = "ROVER_ADVERTISE_HOST"
ENV_PS_PORT = "ROVER_PS_PORT"
ENV_DATA_PORT = "ROVER_DATA_PORT"
STANDBY_PREFIX = "ps-standby-"  # node ids of spare PS processes (recovery.standby_ps)
TRASH_PREFIX = ".trash-"  # directories being discarded (``discard_dirs``)


@dataclass(frozen=True)
class JobDir:
    root: Path

    @property
    def spec_file(self) -> Path:
        return self.root / "job.json"

    @property
    def token_file(self) -> Path:
        return self.root / "token"

    @property
    def tls_cert_file(self) -> Path:
        """The job's certificate (``core.job_tls``), where it has one: Airflow trusts it."""
        return self.root / "tls.crt"

    @property
    def tls_key_file(self) -> Path:
        return self.root / "tls.key"

    @property
    def master_file(self) -> Path:
        return self.root / "master.json"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def oom_grown_file(self) -> Path:
        """The nodes grown after an OOM: each grows once per job, relaunched masters too."""
        return self.root / "oom_grown.json"

    @property
    def keeper_file(self) -> Path:
        """The master deaths the master's keeper relaunched after."""
        return self.root / "keeper.json"

    @property
    def launch_lock_file(self) -> Path:
        """Locked by a local launch from its check for a running job until its master listens."""
        return self.root / "launch.lock"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def model_dir(self) -> Path:
        """The job's published model: a link to one folder of ``saved_models``."""
        return self.root / "model"

    @property
    def saved_models(self) -> Path:
        return self.root / "models"

    def log_file(self, node_id: str) -> Path:
        return self.logs / f"{node_id}.log"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint_dir(self, number: int) -> Path:
        return self.checkpoints / f"{CHECKPOINT_PREFIX}{number:06d}"

    def latest_checkpoint(self) -> Path | None:
        """The checkpoint to resume from: the newest committed one whose every part verifies.

        ``checkpoints/LATEST`` names the last committed checkpoint; it and the ones before it
        are tried newest first, and one with a part missing, incomplete or failing its checksum
        (``core.checkpoint_files.verify_checkpoint``) is skipped with the reason logged. The
        master (its queue) and every PS (its partition) call this, so they pick the same one.
        """
        try:
            named = (self.checkpoints / "LATEST").read_text().strip()
        except FileNotFoundError:
            return None
        limit = checkpoint_number(named)
        candidates = [
            d
            for d in self.checkpoint_dirs()
            if limit is None or (checkpoint_number(d.name) or 0) <= limit
        ]
        for directory in reversed(candidates):
            reason = verify_checkpoint(directory)
            if reason is None:
                if directory.name != named:
                    log.warning("resuming from %s instead of %s (LATEST)", directory.name, named)
                return directory
            log.warning("checkpoint %s skipped: %s", directory.name, reason)
        return None

    def partial_dir(self, base: int, seq: int) -> Path:
        """CPR partial save ``seq`` taken after checkpoint ``base`` (its most-used rows)."""
        return self.checkpoints / f"partial-{base:06d}-{seq:04d}"

    def partial_dirs(self, base: int | None = None) -> list[Path]:
        """The partial saves after checkpoint ``base`` (every one for None), oldest first."""
        pattern = "partial-*" if base is None else f"partial-{base:06d}-*"
        return sorted(p for p in self.checkpoints.glob(pattern) if p.is_dir())

    def checkpoint_dirs(self) -> list[Path]:
        """Every ``ckpt-<n>`` directory, committed or not, oldest first."""
        found = [
            p
            for p in self.checkpoints.glob("ckpt-*")
            if p.is_dir() and checkpoint_number(p.name) is not None
        ]
        return sorted(found, key=lambda p: checkpoint_number(p.name) or 0)

    def commit_checkpoint(self, directory: Path) -> None:
        """Name ``directory`` in ``LATEST`` (atomically, durably): call it only once every
        part and ``queue.json`` are on disk."""
        fsync_path(directory)
        atomic_write_text(self.checkpoints / "LATEST", directory.name)
        fsync_path(self.checkpoints)

    def standby_assignment(self, standby_id: str) -> Path:
        """Written once a spare PS process is to become a lost PS: holds that PS's node id."""
        return self.root / "standby" / standby_id

    def ecrm_rebuild_marker(self, ps_index: int) -> Path:
        """Present while PS ``ps_index`` is to be rebuilt from parity (ECRM): its replacement
        starts empty instead of restoring the last checkpoint."""
        return self.root / "ecrm" / f"ps-{ps_index}.rebuild"

    def discard(self, directories: list[Path], why: str) -> None:
        """``discard_dirs`` of directories of this job."""
        discard_dirs(directories, why)

    @property
    def flash_dir(self) -> Path:
        """Where this job's PS keep their flash (shared-memory) snapshots."""
        return flash_dir_for(self.checkpoints)

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

    def write_tls(self, cert: bytes, key: bytes) -> None:
        """Keep the job's certificate and key (0600, like the token) for whoever must recreate
        the job's Secret; each is replaced whole."""
        self.root.mkdir(parents=True, exist_ok=True)
        for path, data, mode in (
            (self.tls_key_file, key, 0o600),
            (self.tls_cert_file, cert, 0o644),
        ):
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)

    def tls(self) -> JobTLS | None:
        """The job's certificate and key in this directory; None for a job without TLS."""
        if not self.tls_cert_file.exists():
            return None
        return JobTLS(self.tls_cert_file, self.tls_key_file)

    def master_info(self) -> dict[str, Any]:
        """What the master announced (``address``, ``pid``); empty before it listens."""
        return self.read_json(self.master_file) or {}

    def read_json(self, path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None


def flash_dir_for(checkpoints: Path) -> Path:
    """The shared-memory folder of the job whose checkpoints live in ``checkpoints``:
    ``$ROVER_FLASH_DIR`` or ``/dev/shm`` (the temp dir where there is none), one subfolder per
    job, named by a hash of the job's checkpoint path."""
    root = os.environ.get(ENV_FLASH_DIR)
    if not root:
        shm = Path("/dev/shm")
        root = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()
    key = hashlib.sha256(str(checkpoints.resolve()).encode()).hexdigest()[:16]
    return Path(root) / f"airflow-rover-{key}"


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary sibling and rename: readers see the old file or the new one, and
    once this returns the new one survives a crash. On an error the temporary is removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def discard_dirs(directories: list[Path], why: str) -> None:
    """Take ``directories`` out of the job's sight at once, then delete them. Each is first
    renamed to a hidden name, which raises if it cannot be done (the caller must not go on
    as if they were gone); a hidden one whose deletion fails is only logged (nothing reads
    it) and removed by the next discard in that folder."""
    hidden = []
    for directory in directories:
        trash = directory.with_name(f"{TRASH_PREFIX}{directory.name}.{secrets.token_hex(4)}")
        os.rename(directory, trash)
        hidden.append(trash)
    folders = {d.parent for d in directories}
    hidden += [p for f in folders for p in f.glob(f"{TRASH_PREFIX}*") if p not in hidden]
    for trash in hidden:
        try:
            shutil.rmtree(trash)
        except OSError as exc:
            log.warning("could not delete %s (hidden, never read): %s", trash, exc)
    if directories:
        log.info("discarded %d directories %s", len(directories), why)


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True))


@dataclass(frozen=True)
class NodeContext:
    """What a PS, worker or evaluator process is told by its launcher, through the environment."""

    job_dir: JobDir
    node_id: str
    master_addr: str
    token: str
    tls: JobTLS | None = None

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
            job_dir=JobDir(Path(os.environ[ENV_JOB_DIR])),
            node_id=os.environ[ENV_NODE_ID],
            master_addr=os.environ[ENV_MASTER_ADDR],
            token=Path(os.environ[ENV_TOKEN_FILE]).read_text().strip(),
            tls=JobTLS.from_env(),
        )
