"""Folders only this process's user can enter, in places every local user can write.

A job's flash snapshots live under ``/dev/shm`` (or ``$ROVER_FLASH_DIR``), where anyone may
create a folder first: one made by another user, left open to others, or a symbolic link to
somewhere else would let them read the model or plant a slot the next PS restores. So the
folder is created 0700 and, when it was already there, used only if it is a real directory
owned by this user that nobody else can enter.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


class UnsafeFolder(PermissionError):
    """A folder this process would share with other users: refused, never repaired."""


def ensure_private_dir(path: Path) -> Path:
    """``path`` created 0700, or checked by ``check_private_dir`` when it exists. Another
    process of the job may remove the folder once it is empty: then it is made again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        try:
            check_private_dir(path)
            break
        except FileNotFoundError:
            if attempt == 2:
                raise
    return path


def check_private_dir(path: Path) -> None:
    """Raise ``UnsafeFolder`` unless ``path`` is a directory (not a link to one) owned by this
    process's user, with no permission for group or others."""
    info = os.lstat(path)
    fix = "remove it, or set ROVER_FLASH_DIR to a folder only this user can write"
    if stat.S_ISLNK(info.st_mode):
        raise UnsafeFolder(f"{path} is a symbolic link, not a folder of this job: {fix}")
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeFolder(f"{path} is not a folder: {fix}")
    if info.st_uid != os.geteuid():
        raise UnsafeFolder(
            f"{path} belongs to uid {info.st_uid}, not to this process's uid {os.geteuid()}: {fix}"
        )
    if info.st_mode & 0o077:
        mode = stat.S_IMODE(info.st_mode)
        raise UnsafeFolder(f"{path} has mode {mode:04o}, open to other users (want 0700): {fix}")


def is_private_dir(path: Path) -> bool:
    try:
        check_private_dir(path)
    except OSError:
        return False
    return True
