"""Entry point of a parameter-server node (started by a launcher, configured by environment)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from airflow_rover.core.allocator import keep_freed_memory
from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.incremental import UNKNOWN_DAY
from airflow_rover.core.job_dir import (
    ENV_ADVERTISE_HOST,
    ENV_BIND_HOST,
    ENV_PS_PORT,
    STANDBY_PREFIX,
    JobDir,
    NodeContext,
)
from airflow_rover.core.node_job import node_job
from airflow_rover.core.parent_death import die_with_parent
from airflow_rover.core.spec import JobSpec
from airflow_rover.core.stop_signals import stop_on_signals
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.ps.flash import FlashCheckpointer, choose_restore, orphan_slots
from airflow_rover.ps.initial import InitialLoad, load_initial
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc.crash_report import report_crash
from airflow_rover.rpc.master_api import InitialRows
from airflow_rover.rpc.master_client import MasterClient, quiet_request_logs
from airflow_rover.rpc.ps_service import receive_limit

log = logging.getLogger("airflow_rover.ps")


def restore(
    new_ps: Callable[[], ParameterServer],
    job_dir: JobDir,
    node_id: str,
    index: int,
    after_checkpoint: Callable[[ParameterServer, Path], None] | None = None,
    initial: Callable[[ParameterServer], None] | None = None,
) -> ParameterServer:
    """A PS with its partition loaded from the newest verified checkpoint, or from its snapshot
    in shared memory where ``choose_restore`` says so (the checkpoint if that fails);
    ``after_checkpoint``: the policy's additions to a restore from the checkpoint itself
    (not from a newer snapshot); ``initial``: how a job with neither starts (its
    ``init_from`` source): the job's own state always comes first."""
    flash = FlashCheckpointer.for_job(job_dir.checkpoints, index)
    choice = choose_restore(job_dir, index)
    ps = None
    from_newer_slot = False  # partial saves after the checkpoint are older than that snapshot
    if choice.slot is not None and choice.slot_meta is not None:
        ps = new_ps()
        try:
            arrays = choice.slot.arrays(choice.slot_meta)
            try:
                ps.restore(arrays)
            finally:
                del arrays
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("%s: restoring from shared memory failed (%s); using disk", node_id, exc)
            ps = None
        else:
            from_newer_slot = choice.newer
            flash.adopt(choice.slot, choice.slot_meta)
            log.info(
                "%s restored from shared memory: %s (%d batches applied)",
                node_id,
                choice.why,
                len(ps.ledger.applied),
            )
    for orphan in choice.orphans:  # a crashed predecessor's memory: given back
        if ps is None or orphan is not choice.slot:
            orphan.remove()
    if ps is None:
        ps = new_ps()
        if choice.checkpoint is not None:
            restore_checkpoint(ps, choice.checkpoint, node_id)
        elif initial is not None:
            initial(ps)
    if choice.checkpoint is not None and not from_newer_slot and after_checkpoint is not None:
        after_checkpoint(ps, choice.checkpoint)
    ps.flash = flash
    return ps


def restore_checkpoint(ps: ParameterServer, checkpoint: Path, node_id: str) -> None:
    """Load this PS's partition from ``checkpoint``; one taken with another PS count (the job
    was resized since) is re-partitioned from all its parts."""
    parts = sorted(checkpoint.glob("ps-*.npz"))
    if len(parts) == ps.num_ps:
        part = checkpoint / f"ps-{ps.index}.npz"
        with np.load(part) as saved:
            ps.restore(dict(saved))
        log.info("%s restored %s (%d batches applied)", node_id, part, len(ps.ledger.applied))
        return
    loaded = []
    for part in parts:
        with np.load(part) as saved:
            loaded.append(dict(saved))
    ps.restore_repartitioned(loaded)
    log.info(
        "%s restored its rows of %s, saved by %d PS (%d batches applied)",
        node_id,
        checkpoint.name,
        len(parts),
        len(ps.ledger.applied),
    )


def initial_loader(
    spec: JobSpec, ctx: NodeContext, took: Callable[[InitialLoad], None]
) -> Callable[[ParameterServer], None] | None:
    """How a PS of a job with ``init_from`` and no checkpoint of its own starts: its rows of
    the source (``ps.initial``), logged with what it took and evicted, and given to ``took``."""
    source = spec.init
    if source is None:
        return None

    def load(ps: ParameterServer) -> None:
        loaded = load_initial(ps, source, spec.day)
        took(loaded)
        log.info(
            "%s started from %s (%s): %d rows, %d dense variables from %d partition(s); "
            "%d rows evicted (not seen for more than %s days)",
            ctx.node_id,
            source.location,
            source.origin or "init_from",
            loaded.rows,
            loaded.dense,
            loaded.parts,
            loaded.evicted,
            source.evict_after_days,
        )

    return load


STANDBY_POLL_S = 0.005


def wait_as_standby(ctx: NodeContext) -> str:
    """A spare PS (``recovery.standby_ps``): imports done, wait until the launcher says which
    lost PS this process is, then log to that PS's log. Meanwhile the policy works out what a
    replacement needs (ECRM: the parity placement, so a rebuild starts without it)."""
    # numpy (2.4) imports numpy.ma on the first np.unique: ~80 ms under the import lock, which
    # had stalled the first pulls a replacement served
    np.unique(np.arange(2))
    spec = ctx.job_dir.read_spec()
    spec.checkpoint.build().on_standby_ps(node_job(spec, ctx.job_dir))
    assignment = ctx.job_dir.standby_assignment(ctx.node_id)
    log.info("%s: a spare PS, waiting to take over a lost one", ctx.node_id)
    while not assignment.exists():
        time.sleep(STANDBY_POLL_S)
    node_id = assignment.read_text().strip()
    assignment.unlink()
    with open(ctx.job_dir.log_file(node_id), "ab") as log_file:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
            os.dup2(log_file.fileno(), stream.fileno())
    log.info("%s takes over as %s", ctx.node_id, node_id)
    return node_id


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="airflow_rover.ps")
    parser.add_argument("--role", default="ps", choices=["ps"])
    parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    quiet_request_logs()
    keep_freed_memory()  # megabyte messages without page faults
    die_with_parent()  # a local node ends with its master
    ctx = NodeContext.from_env()
    master = MasterClient(ctx.master_addr, ctx.token, ctx.tls)  # ~30 ms: a spare has it made
    try:
        serve(ctx, master)
    except Exception as exc:  # the master learns what killed this PS, then it dies of it
        report_crash(master, ctx.node_id, exc)
        raise


def serve(ctx: NodeContext, master: MasterClient) -> None:
    """Restore (or start empty), serve until told to stop."""
    if ctx.node_id.startswith(STANDBY_PREFIX):
        ctx = dataclasses.replace(ctx, node_id=wait_as_standby(ctx))
    spec = ctx.job_dir.read_spec()
    index = int(ctx.node_id.rsplit("-", 1)[1])

    def new_ps() -> ParameterServer:
        ps = ParameterServer(
            index,
            max(spec.plan.num_ps, index + 1),
            EmbeddingPlacement.from_features(spec.resolved_features),
            Optimizer(spec.training.optimizer, spec.training.learning_rate),
            spec.training.seed,
        )
        for table in ps.tables.values():
            table.day = UNKNOWN_DAY if spec.day is None else spec.day
        return ps

    policy, job = spec.checkpoint.build(), node_job(spec, ctx.job_dir)

    def after_checkpoint(ps: ParameterServer, checkpoint: Path) -> None:
        policy.after_restore(ps, job, checkpoint)

    loads: list[InitialLoad] = []  # what it took of ``init_from`` (none: it did not)
    if index < spec.plan.num_ps and not policy.ps_starts_empty(job, index):
        initial = initial_loader(spec, ctx, loads.append)
        ps = restore(new_ps, ctx.job_dir, ctx.node_id, index, after_checkpoint, initial)
    else:  # joining a resize: empty until the others hand over its rows (``reshard``); or
        # replacing a lost PS under ECRM: empty until rebuilt from parity (``ps.ecrm``)
        ps = new_ps()
        ps.flash = FlashCheckpointer.for_job(ctx.job_dir.checkpoints, index)
        for orphan in orphan_slots(ctx.job_dir.flash_dir, index):
            orphan.remove()  # an earlier PS of this index (the job was smaller in between)
    policy.setup_ps(ps, job)
    host = os.environ.get(ENV_BIND_HOST, "127.0.0.1")
    server, port = start_server(
        ps,
        ctx.token,
        host,
        port=int(os.environ.get(ENV_PS_PORT, "0")),
        receive_bytes=receive_limit(spec.resolved_features, spec.training.batch_size),
        tls=ctx.tls,
    )
    stop = threading.Event()
    stop_on_signals(stop)
    advertised = os.environ.get(ENV_ADVERTISE_HOST, "127.0.0.1")
    took = InitialRows(loaded=loads[0].rows, evicted=loads[0].evicted) if loads else None
    master.ready(ctx.node_id, f"{advertised}:{port}", took)
    log.info("%s serving on port %d", ctx.node_id, port)
    stop.wait()
    server.stop(grace=2).wait()
    log.info("%s stopped", ctx.node_id)


if __name__ == "__main__":
    main()
