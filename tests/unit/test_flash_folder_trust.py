"""The flash-snapshot folder is this user's alone, and a slot is checked before a PS restores
from it: a folder another user could have made or entered is refused (never used as found),
and a slot whose metadata points outside the job or past its own bytes is ignored."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from airflow_rover.core.job_dir import ENV_FLASH_DIR, JobDir, atomic_write_json
from airflow_rover.core.private_dir import UnsafeFolder
from airflow_rover.ps.flash import (
    FlashCheckpointer,
    ShmSlot,
    choose_restore,
    orphan_slots,
    sweep_stale_slots,
)

ROWS = np.arange(48, dtype=np.float32).reshape(6, 8)


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "shm"
    root.mkdir(mode=0o1777)
    monkeypatch.setenv(ENV_FLASH_DIR, str(root))
    return root


@pytest.fixture
def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _snapshot(layout: JobDir, pid: int, target: Path) -> ShmSlot:
    """A snapshot of ``ROWS`` in the slot of PS 0 run by ``pid``, persisted to ``target``."""
    slot = ShmSlot(layout.flash_dir, 0, pid)
    flash = FlashCheckpointer(slot)
    flash.begin(ROWS.nbytes)
    flash.copy([("table/t/rows", ROWS)])
    flash.finish(target, owner=os.getpid(), pause_s=0.0)
    flash.wait(30)
    slot.close()
    return slot


def _running_master(layout: JobDir) -> None:
    atomic_write_json(layout.master_file, {"address": "http://x", "pid": os.getpid()})


def _rewrite_meta(slot: ShmSlot, **changes: Any) -> None:
    meta = json.loads(slot.meta_path.read_text())
    meta.update(changes)
    slot.meta_path.write_text(json.dumps(meta))


# -- the folder ----------------------------------------------------------------------------------
def test_the_folder_and_its_files_are_private(shm: Path, tmp_path: Path, dead_pid: int) -> None:
    layout = JobDir(tmp_path / "job")
    slot = _snapshot(layout, dead_pid, layout.checkpoint_dir(1) / "ps-0.npz")
    assert _mode(layout.flash_dir) == 0o700
    assert _mode(slot.data_path) == 0o600
    assert _mode(slot.meta_path) == 0o600


def test_a_pre_created_folder_open_to_others_is_refused(shm: Path, tmp_path: Path) -> None:
    layout = JobDir(tmp_path / "job")
    layout.flash_dir.mkdir()
    os.chmod(layout.flash_dir, 0o777)
    with pytest.raises(UnsafeFolder, match=r"mode 0777, open to other users .*ROVER_FLASH_DIR"):
        FlashCheckpointer.for_job(layout.checkpoints, 0)
    assert _mode(layout.flash_dir) == 0o777  # refused, not repaired behind the user's back


def test_a_link_at_the_folder_name_is_refused(shm: Path, tmp_path: Path) -> None:
    layout = JobDir(tmp_path / "job")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    layout.flash_dir.symlink_to(elsewhere)
    with pytest.raises(UnsafeFolder, match="is a symbolic link"):
        FlashCheckpointer.for_job(layout.checkpoints, 0)
    with pytest.raises(UnsafeFolder, match="is a symbolic link"):
        ShmSlot(layout.flash_dir, 0).reserve(1024)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_of_another_user_is_refused(shm: Path, tmp_path: Path) -> None:
    layout = JobDir(tmp_path / "job")
    layout.flash_dir.mkdir(mode=0o700)
    os.chown(layout.flash_dir, 4242, 4242)
    with pytest.raises(UnsafeFolder, match="belongs to uid 4242"):
        FlashCheckpointer.for_job(layout.checkpoints, 0)


def test_slots_planted_in_an_open_folder_are_neither_restored_nor_deleted(
    shm: Path, tmp_path: Path, dead_pid: int
) -> None:
    layout = JobDir(tmp_path / "job")
    slot = _snapshot(layout, dead_pid, layout.checkpoint_dir(1) / "ps-0.npz")
    os.chmod(layout.flash_dir, 0o777)
    _running_master(layout)
    assert orphan_slots(layout.flash_dir, 0) == []
    choice = choose_restore(layout, 0)
    assert choice.slot is None and choice.why == "no snapshot in shared memory"
    assert slot.data_path.exists() and slot.meta_path.exists()


def test_the_stale_slot_sweep_never_follows_a_link_to_someone_elses_files(
    shm: Path, tmp_path: Path, dead_pid: int
) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    precious = victim / f"ps-0-{dead_pid}.data"
    precious.write_bytes(b"not a slot")
    old = time.time() - 7200
    os.utime(precious, (old, old))
    (shm / "airflow-rover-0123456789abcdef").symlink_to(victim)
    sweep_stale_slots(shm)
    assert precious.read_bytes() == b"not a slot"


# -- the slot ------------------------------------------------------------------------------------
def test_a_sound_newer_snapshot_of_the_running_master_is_chosen(
    shm: Path, tmp_path: Path, dead_pid: int
) -> None:
    """The baseline the refusals below differ from by one field."""
    layout = JobDir(tmp_path / "job")
    _snapshot(layout, dead_pid, layout.checkpoint_dir(2) / "ps-0.npz")
    _running_master(layout)
    choice = choose_restore(layout, 0)
    assert choice.slot is not None and choice.newer, choice.why


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"target": "{outside}/ckpt-000002/ps-0.npz"}, "is not ps-0.npz of a checkpoint in"),
        ({"target": "{checkpoints}/ckpt-000002/ps-1.npz"}, "is not ps-0.npz of a checkpoint"),
        ({"target": "{checkpoints}/ckpt-000002/../../x/ps-0.npz"}, "is not ps-0.npz"),
        ({"arrays": [["table/t/rows", "|O", [6, 8], 0, 384]]}, "not a number type"),
        ({"arrays": [["table/t/rows", "<f4", [6, 9], 0, 192]]}, "does not match its 192 bytes"),
        ({"arrays": [["table/t/rows", "<f4", [6, 8], 1 << 40, 192]]}, "ends past the snapshot"),
        ({"arrays": [["table/t/rows", "<f4", [-6, -8], 0, 192]]}, "must be whole numbers"),
        ({"arrays": [["table/t/rows", "<f4", [6, 8], 0.5, 192]]}, "must be whole numbers"),
        ({"arrays": [["table/t/rows", "<f4"]]}, "unreadable metadata"),
        ({"arrays": [["table/t/rows", "no-such-type", [6, 8], 0, 192]]}, "unreadable metadata"),
    ],
)
def test_a_slot_whose_metadata_does_not_hold_is_not_restored(
    shm: Path, tmp_path: Path, dead_pid: int, change: dict[str, Any], why: str
) -> None:
    layout = JobDir(tmp_path / "job")
    slot = _snapshot(layout, dead_pid, layout.checkpoint_dir(2) / "ps-0.npz")
    places = {"outside": str(tmp_path / "outside"), "checkpoints": str(layout.checkpoints)}
    if "target" in change:
        change = {"target": change["target"].format(**places)}
    _rewrite_meta(slot, **change, persisted=None)
    _running_master(layout)
    choice = choose_restore(layout, 0)
    assert choice.slot is None
    assert choice.why.startswith("shared memory refused: ") and why in choice.why
    assert not (tmp_path / "outside").exists()  # nothing was written where the slot pointed
