"""A trained model appears at ``<job dir>/model`` all at once: it is saved into a folder of
its own under ``models/``, and then ``model`` is pointed at that folder by renaming a new
link over the old one. A reader sees either the whole previous model or the whole new one.
A run that fails before that leaves the previous model in place.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from pathlib import Path

from airflow_rover.core.checkpoint_files import fsync_path
from airflow_rover.core.job_dir import JobDir, discard_dirs

log = logging.getLogger(__name__)


def new_model_folder(job_dir: JobDir) -> Path:
    """An unused folder under ``models/`` to save a model into (not created)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return job_dir.saved_models / f"{stamp}-{secrets.token_hex(3)}"


def published_folder(job_dir: JobDir) -> Path | None:
    """The folder ``model`` points at (None: no model published through a link)."""
    link = job_dir.model_dir
    if not link.is_symlink():
        return None
    return (link.parent / os.readlink(link)).resolve()


def publish_model(job_dir: JobDir, folder: Path) -> None:
    """Point ``model`` at ``folder`` (one of ``models/``) in one rename; keep the model it
    pointed at before (a reader may still be loading it) and delete the older ones. A
    ``model`` folder saved before models were published by link is moved under ``models/``
    first (the one moment ``model`` is absent)."""
    link = job_dir.model_dir
    if folder.parent.resolve() != job_dir.saved_models.resolve():
        raise ValueError(f"{folder}: a model is published from {job_dir.saved_models}")
    previous = published_folder(job_dir)
    if link.is_dir() and not link.is_symlink():
        previous = new_model_folder(job_dir)
        job_dir.saved_models.mkdir(exist_ok=True)
        os.rename(link, previous)
        previous = previous.resolve()
    tmp = link.with_name(f".model.{secrets.token_hex(4)}.tmp")
    os.symlink(os.path.relpath(folder, link.parent), tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(link.parent)
    keep = {folder.resolve(), previous}
    older = [p for p in job_dir.saved_models.iterdir() if p.is_dir() and p.resolve() not in keep]
    discard_dirs([p for p in older if not p.name.startswith(".")], "(models replaced)")
    log.info("model published: %s -> %s", link, folder.name)
