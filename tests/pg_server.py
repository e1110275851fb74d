"""A throwaway PostgreSQL server from Debian's ``postgresql`` packages, for the tests that need
a database several hosts can share (the budget registry, the history store).

``start_server`` runs ``initdb`` into a fresh folder under /tmp and ``pg_ctl start`` on a free
port of 127.0.0.1 (its unix socket in that folder too), as an unprivileged user: the server
refuses to run as root, so as root it runs as Debian's ``postgres`` user (``nobody`` if there is
none). Host connections need the password it returns; ``stop`` stops only that server
(``pg_ctl stop -m fast``) and removes its folder. Missing binaries are installed as root with
apt, under the lock the UI tests' Chromium install takes, or the test is skipped.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from debian_packages import ensure_installed

PACKAGES = ("postgresql",)
DEBIAN_BINDIRS = "/usr/lib/postgresql/*/bin"  # Debian keeps initdb and pg_ctl off PATH
BINARIES = ("initdb", "pg_ctl", "postgres")
SUPERUSER = "rover"
RUN_AS = ("postgres", "nobody")  # as root: Debian's server user, else nobody
START_ATTEMPTS = 3  # a free port can be taken between finding it and binding it
# A throwaway server: durability buys nothing and costs seconds on a busy disk.
SETTINGS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off", "max_connections=200")


@dataclass(frozen=True)
class PostgresServer:
    """A running server: where it listens and how to log in."""

    host: str
    port: int
    user: str
    password: str
    root: Path  # data/, the socket and the log live here
    run_as: str | None  # the account the server runs as (None: this process's)
    bindir: Path

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of ``database`` on this server (psycopg2, with the password)."""
        return (
            f"postgresql+psycopg2://{self.user}:{self.password}@{self.host}:{self.port}/{database}"
        )

    def create_database(self, name: str) -> str:
        """Create the database ``name``; its SQLAlchemy URL."""
        self._run("createdb", "-h", str(self.root), "-p", str(self.port), "-U", self.user, name)
        return self.url(name)

    def stop(self) -> None:
        """Stop this server (fast: open sessions are ended) and remove its folder."""
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, binary: str, *args: str) -> None:
        _run(self.bindir / binary, args, self.run_as, self.root)


def _bindir() -> Path | None:
    """The folder of the server's binaries: the one ``pg_ctl`` on PATH is in, else the newest
    Debian version's."""
    on_path = shutil.which("pg_ctl")
    folders = [Path(os.path.realpath(on_path)).parent] if on_path else []
    versions = sorted(Path("/").glob(DEBIAN_BINDIRS.lstrip("/")), key=_version, reverse=True)
    for folder in [*folders, *versions]:
        if all(os.access(folder / name, os.X_OK) for name in BINARIES):
            return folder
    return None


def _version(bindir: Path) -> int:
    name = bindir.parent.name
    return int(name) if name.isdigit() else 0


def ensure_binaries() -> Path:
    """The folder of ``initdb``, ``pg_ctl`` and ``postgres`` (installed as root when missing)."""
    return ensure_installed(PACKAGES, _bindir, f"initdb in {DEBIAN_BINDIRS}")


def _server_account() -> str | None:
    """Who runs the server: as root, the first of ``RUN_AS`` that exists; else this user."""
    if os.geteuid() != 0:
        return None
    for name in RUN_AS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError(f"running as root and none of the users {RUN_AS} exists to run postgres")


def _run(binary: Path, args: tuple[str, ...], run_as: str | None, cwd: Path) -> None:
    kwargs: dict[str, Any] = {}
    if run_as is not None:
        account = pwd.getpwnam(run_as)
        kwargs = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    done = subprocess.run(
        [str(binary), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{binary.name} {' '.join(args)} failed ({done.returncode}):\n"
            f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_server(say: Callable[[str], None] = print) -> PostgresServer:
    """``initdb`` and ``pg_ctl start`` a new server (see the module docstring); ``say`` gets
    the start-up time."""
    bindir = ensure_binaries()
    run_as = _server_account()
    began = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="rover-pg-"))
    try:
        if run_as is not None:
            account = pwd.getpwnam(run_as)
            os.chown(root, account.pw_uid, account.pw_gid)
        password = secrets.token_hex(16)
        (root / "pwfile").write_text(password + "\n")
        if run_as is not None:
            os.chown(root / "pwfile", account.pw_uid, account.pw_gid)
        (root / "pwfile").chmod(0o600)
        _run(
            bindir / "initdb",
            (
                "-D", str(root / "data"), "-U", SUPERUSER, f"--pwfile={root / 'pwfile'}",
                "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8",
                "--locale=C", "--no-sync", "--no-instructions",
            ),
            run_as,
            root,
        )  # fmt: skip
        (root / "pwfile").unlink()
        server = _start(bindir, root, run_as, password)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    say(
        f"postgres {bindir.parent.name} on 127.0.0.1:{server.port} "
        f"(as {run_as or 'this user'}): initdb + start {time.monotonic() - began:.2f} s"
    )
    return server


def _start(bindir: Path, root: Path, run_as: str | None, password: str) -> PostgresServer:
    for attempt in range(START_ATTEMPTS):
        port = _free_port()
        options = " ".join(
            [
                f"-p {port}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={root}",
                *(f"-c {s}" for s in SETTINGS),
            ]
        )
        try:
            _run(
                bindir / "pg_ctl",
                ("-D", str(root / "data"), "-l", str(root / "server.log"), "-o", options,
                 "-w", "-t", "60", "start"),
                run_as,
                root,
            )  # fmt: skip
        except RuntimeError:
            if attempt == START_ATTEMPTS - 1:
                log = root / "server.log"
                raise RuntimeError(
                    "postgres did not start:\n"
                    + (log.read_text()[-3000:] if log.exists() else "(no log)")
                ) from None
            continue
        return PostgresServer("127.0.0.1", port, SUPERUSER, password, root, run_as, bindir)
    raise AssertionError("unreachable")
