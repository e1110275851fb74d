"""Debian packages the tests need (a browser, a database server): found, else installed with
apt when the tests run as root (as CI does), else the test is skipped saying what to install."""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

# One apt run on the machine at a time, whichever test process gets there first.
INSTALL_LOCK = Path("/tmp/airflow-rover-chromium-install.lock")
T = TypeVar("T")


def ensure_installed(packages: tuple[str, ...], find: Callable[[], T | None], what: str) -> T:
    """What ``find`` finds of ``packages`` (``what``: how messages name it); as root,
    installs the packages first when it finds nothing; otherwise skips the test."""
    if (found := find()) is not None:
        return found
    if os.geteuid() != 0:
        pytest.skip(
            f"needs Debian's {' and '.join(packages)} package(s) ({what} not installed, and "
            f"not root to install them): apt-get install {' '.join(packages)}"
        )
    with INSTALL_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if find() is None:
            apt_install(packages)
    if (found := find()) is None:
        raise RuntimeError(f"apt-get installed {packages} but {what} is still not found")
    return found


def apt_install(packages: tuple[str, ...]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", *packages],
    ):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}{done.stderr}")
