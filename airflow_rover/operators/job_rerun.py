"""What a training task does with the job its directory already holds when it runs again (a
retry, a cleared task, a re-triggered run): resume it, return its result, or train anew.

The job's fingerprint (``data.fingerprint``) decides: the same data, spec and model code
resume an unfinished job or return a finished one; anything else trains a new model, and the
date's previous model stays published until the new one replaces it.
"""

from __future__ import annotations

import enum
import logging
import shutil
from dataclasses import dataclass
from typing import Any

from airflow_rover.core.job_dir import JobDir, discard_dirs
from airflow_rover.core.job_status import UNREACHABLE
from airflow_rover.core.spec import JobSpec
from airflow_rover.core.states import ACTIVE_STATES, JobState
from airflow_rover.launchers.base import JobDirInUse
from airflow_rover.storage import CheckpointStore, checkpoint_samples

log = logging.getLogger(__name__)


class Rerun(enum.Enum):
    FRESH = "fresh"  # no job here yet
    REATTACH = "reattach"  # the same job is running: follow it
    RESUME = "resume"  # the same job ended unfinished: launch it again from its checkpoint
    RETURN = "return"  # the same job succeeded: its result is the task's
    RETRAIN = "retrain"  # the job here trained something else: a new job replaces it


@dataclass(frozen=True)
class Decision:
    rerun: Rerun
    message: str  # for the task log, in plain words
    replaced: str | None = None  # RETRAIN: the id of the job the new one replaces


def rerun_decision(job_dir: JobDir, spec: JobSpec, status: dict[str, Any]) -> Decision:
    """What to do with ``job_dir``'s job for ``spec`` (which carries its fingerprint), given
    the job's last ``status`` (the hook's: the master's, else ``state.json``).

    The job there may be another run's of the same directory (a backfill or a re-triggered
    run of a date whose model lives there): once it has ended it is replaced, or its result
    returned, like this run's own; while it runs, ``JobDirInUse`` is raised and nothing of
    it is touched. Only this run's own job is ever resumed (checkpoints name their job)."""
    earlier = job_dir.read_json(job_dir.spec_file)
    if earlier is None:
        return Decision(Rerun.FRESH, f"Training job {spec.job_id} in {job_dir.root}: a new job")
    owner, state = earlier.get("job_id"), status.get("state")
    own = owner == spec.job_id
    where = f"job {owner} in {job_dir.root}"
    if state in ACTIVE_STATES or state == UNREACHABLE:
        if not own:
            raise JobDirInUse(
                f"{job_dir.root} is the directory of job {owner!r}, {state} now, not of "
                f"{spec.job_id!r}: one job at a time trains there; wait for it or stop it"
            )
        if earlier.get("fingerprint") == spec.fingerprint:
            return Decision(Rerun.REATTACH, f"Reattaching to {where}: it is {state}")
    if earlier.get("fingerprint") != spec.fingerprint:
        return _retrain(job_dir, spec, earlier, state)
    if state == JobState.SUCCEEDED:
        return Decision(Rerun.RETURN, _already_trained(where, job_dir, status))
    if not own:
        return _retrain(job_dir, spec, earlier, state)
    return Decision(Rerun.RESUME, f"Resuming {where} ({state}): {_resume_point(job_dir)}")


def _retrain(job_dir: JobDir, spec: JobSpec, earlier: dict[str, Any], state: Any) -> Decision:
    before, now = earlier.get("fingerprint"), spec.fingerprint
    why = (
        f"its data, spec or model code changed (fingerprint {before} -> {now})"
        if before != now
        else "it was another run's and did not succeed"
    )
    model = (
        "the model published there stays in place until the new one succeeds"
        if job_dir.model_dir.exists()
        else "no model was published there yet"
    )
    return Decision(
        Rerun.RETRAIN,
        f"Training job {spec.job_id} in {job_dir.root}: it replaces job {earlier.get('job_id')} "
        f"({state}), as {why}; {model}",
        replaced=earlier.get("job_id"),
    )


def _already_trained(where: str, job_dir: JobDir, status: dict[str, Any]) -> str:
    result = status.get("result") or {}
    auc = result.get("auc")
    scored = f", held-out AUC {auc:.4f}" if isinstance(auc, float) else ""
    return (
        f"Not training again: {where} already trained this data with this spec and model "
        f"({result.get('samples_trained')} samples{scored}); returning its result, model at "
        f"{job_dir.model_dir}. To train again, change the data, the spec or the model code, or "
        f"delete {job_dir.root}"
    )


def _resume_point(job_dir: JobDir) -> str:
    checkpoint = job_dir.latest_checkpoint()
    if checkpoint is None:
        return "no local checkpoint: from the newest at checkpoint_uri if any, else the start"
    try:
        done, total = checkpoint_samples(job_dir.read_json(checkpoint / "queue.json") or {})
    except ValueError:
        return f"from checkpoint {checkpoint.name}"
    return f"from checkpoint {checkpoint.name}, {done:,} of {total:,} samples done"


def clear_job(job_dir: JobDir) -> None:
    """Remove what the job in ``job_dir`` left (spec, status, checkpoints, logs, its
    shared-memory snapshots), keeping ``kept_names``: the next job there starts from
    nothing. Its master must be gone."""
    kept = kept_names(job_dir)
    gone = [p for p in job_dir.root.iterdir() if p.name not in kept]
    folders = [p for p in gone if p.is_dir() and not p.is_symlink()]
    discard_dirs([p for p in folders if not p.name.startswith(".")], "(a new job replaces them)")
    for path in gone:
        if path not in folders:
            path.unlink(missing_ok=True)
    try:
        shutil.rmtree(job_dir.flash_dir)
    except FileNotFoundError:
        pass
    except OSError as exc:  # its slots name the old checkpoints: a new PS never restores them
        log.warning("could not delete %s: %s", job_dir.flash_dir, exc)


def kept_names(job_dir: JobDir) -> set[str]:
    """What of a job directory outlives the job in it: the published model and the saved
    ones, and the job's credentials and launch lock (the next job there reuses them)."""
    paths = (job_dir.model_dir, job_dir.saved_models, job_dir.token_file, job_dir.launch_lock_file)
    return {p.name for p in (*paths, job_dir.tls_cert_file, job_dir.tls_key_file)}


def clear_stored_checkpoints(store: CheckpointStore) -> int:
    """Delete every checkpoint at ``store`` (an earlier run's of this same job: the caller
    checked), ``LATEST`` first so none is resumed half-deleted; returns how many."""
    names = store.list_checkpoints()
    store.delete("LATEST")
    for name in names:
        store.delete(name)
    return len(names)
