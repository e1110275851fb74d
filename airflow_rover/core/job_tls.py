"""The job's TLS certificate, where its processes reach each other over a network (Kubernetes):
one self-signed certificate per job, made when the job is submitted. Its servers (the master's
API, every PS) present it with its key; its clients trust it and nothing else. Locally the
processes talk over loopback, without TLS.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_TLS_CERT_FILE = "ROVER_TLS_CERT_FILE"
ENV_TLS_KEY_FILE = "ROVER_TLS_KEY_FILE"


@dataclass(frozen=True)
class JobTLS:
    """Where the job's certificate (PEM) is and, for a process that serves, its key."""

    cert_file: Path
    key_file: Path | None = None

    def cert(self) -> bytes:
        return self.cert_file.read_bytes()

    def key(self) -> bytes:
        if self.key_file is None:
            raise ValueError(f"no key beside {self.cert_file}: only a server needs it")
        return self.key_file.read_bytes()

    @classmethod
    def from_env(cls) -> JobTLS | None:
        """The files a launcher names in ``ROVER_TLS_CERT_FILE`` and ``ROVER_TLS_KEY_FILE``
        (only the certificate where the process serves nothing); None without them."""
        cert = os.environ.get(ENV_TLS_CERT_FILE)
        if not cert:
            return None
        key = os.environ.get(ENV_TLS_KEY_FILE)
        return cls(Path(cert), Path(key) if key else None)
