"""Entry point of a parameter-server node (started by a launcher, configured by environment)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from airflow_rover.core.checkpoint_files import read_npz_parts
from airflow_rover.core.ecrm import ParityPlacement
from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.hashing import partition_of
from airflow_rover.core.job_dir import (
    ENV_ADVERTISE_HOST,
    ENV_BIND_HOST,
    ENV_PS_PORT,
    STANDBY_PREFIX,
    JobDir,
    NodeContext,
    checkpoint_number,
)
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.ps.flash import FlashCheckpointer, choose_restore, orphan_slots
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc.master_client import MasterClient

log = logging.getLogger("airflow_rover.ps")


def restore(
    new_ps: Callable[[], ParameterServer], layout: JobDir, node_id: str, index: int
) -> ParameterServer:
    """A PS with its partition loaded from the newest verified checkpoint, or from its snapshot
    in shared memory where ``choose_restore`` says so (the checkpoint if that fails)."""
    flash = FlashCheckpointer.for_job(layout.checkpoints, index)
    choice = choose_restore(layout, index)
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
    if choice.checkpoint is not None and not from_newer_slot:
        apply_partial_saves(ps, layout, choice.checkpoint, node_id)
    ps.flash = flash
    return ps


def apply_partial_saves(
    ps: ParameterServer, layout: JobDir, checkpoint: Path, node_id: str
) -> None:
    """CPR-MFU/SSU: the rows saved after ``checkpoint`` (most-used or sampled ones, fresher
    than the checkpoint) replace theirs, oldest save first; a damaged one is skipped."""
    number = checkpoint_number(checkpoint.name)
    if number is None:
        return
    parts = [d / f"ps-{ps.index}.npz" for d in layout.partial_dirs(number)]
    applied = 0
    for part, arrays in read_npz_parts([p for p in parts if p.exists()]):
        if isinstance(arrays, Exception):
            log.warning("%s: partial save %s skipped: %s", node_id, part.parent.name, arrays)
            continue
        for name, table in ps.tables.items():
            prefix = f"table/{name}/"
            rows = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
            if rows and rows["ids"].size:
                mine = partition_of(name, rows["ids"].astype(np.int64), ps.num_ps) == ps.index
                table.absorb({k: v[mine] for k, v in rows.items()})
                applied += int(mine.sum())
    if applied:
        log.info("%s: %d rows from partial saves after %s", node_id, applied, checkpoint.name)


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


STANDBY_POLL_S = 0.005


def wait_as_standby(ctx: NodeContext) -> str:
    """A spare PS (``recovery.standby_ps``): imports done, wait until the launcher says which
    lost PS this process is, then log to that PS's log. Under ECRM the parity placement is
    worked out meanwhile, so a rebuild starts without it."""
    # numpy (2.4) imports numpy.ma on the first np.unique: ~80 ms under the import lock, which
    # had stalled the first pulls a replacement served
    np.unique(np.arange(2))
    spec = ctx.layout.read_spec()
    if spec.checkpoint.policy == "ecrm":
        groups = EmbeddingPlacement.from_features(spec.resolved_features).groups
        vocab = {g.name: g.vocab_size for g in groups}
        ParityPlacement(spec.plan.num_ps, spec.checkpoint.ecrm.k, vocab).warm()
    assignment = ctx.layout.standby_assignment(ctx.node_id)
    log.info("%s: a spare PS, waiting to take over a lost one", ctx.node_id)
    while not assignment.exists():
        time.sleep(STANDBY_POLL_S)
    node_id = assignment.read_text().strip()
    assignment.unlink()
    with open(ctx.layout.log_file(node_id), "ab") as log_file:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
            os.dup2(log_file.fileno(), stream.fileno())
    log.info("%s takes over as %s", ctx.node_id, node_id)
    return node_id


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set ``stop``, from a thread of their own. A handler runs on the main
    thread between two bytecodes, possibly while that thread holds ``stop``'s lock (inside
    ``stop.wait()``, or inside the ``set`` of a signal before): setting it there deadlocks for
    good. Seen: a PS signalled twice as its master died hung in nested ``set`` calls, orphaned."""

    def handler(_signum: int, _frame: object) -> None:
        threading.Thread(target=stop.set, name="stop", daemon=True).start()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="airflow_rover.ps")
    parser.add_argument("--role", default="ps", choices=["ps"])
    parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    ctx = NodeContext.from_env()
    master = MasterClient(ctx.master_addr, ctx.token)  # ~30 ms: a spare has it made already
    if ctx.node_id.startswith(STANDBY_PREFIX):
        ctx = dataclasses.replace(ctx, node_id=wait_as_standby(ctx))
    spec = ctx.layout.read_spec()
    index = int(ctx.node_id.rsplit("-", 1)[1])

    def new_ps() -> ParameterServer:
        return ParameterServer(
            index,
            max(spec.plan.num_ps, index + 1),
            EmbeddingPlacement.from_features(spec.resolved_features),
            Optimizer(spec.training.optimizer, spec.training.learning_rate),
            spec.training.seed,
        )

    rebuild = spec.checkpoint.policy == "ecrm" and ctx.layout.ecrm_rebuild_marker(index).exists()
    if rebuild:  # the rebuild needs where every row's parity is: worked out while starting
        groups = EmbeddingPlacement.from_features(spec.resolved_features).groups
        vocab = {g.name: g.vocab_size for g in groups}
        placement = ParityPlacement(spec.plan.num_ps, spec.checkpoint.ecrm.k, vocab)
        threading.Thread(target=placement.warm, name="ecrm-placement", daemon=True).start()
    if index < spec.plan.num_ps and not rebuild:
        ps = restore(new_ps, ctx.layout, ctx.node_id, index)
    else:  # joining a resize: empty until the others hand over its rows (``reshard``); or
        # replacing a lost PS under ECRM: empty until rebuilt from parity (``ps.ecrm``)
        ps = new_ps()
        ps.flash = FlashCheckpointer.for_job(ctx.layout.checkpoints, index)
        for orphan in orphan_slots(ctx.layout.flash_dir, index):
            orphan.remove()  # an earlier PS of this index (the job was smaller in between)
    cpr = spec.checkpoint.cpr
    if spec.checkpoint.policy == "cpr" and cpr.variant == "ssu":
        for table in ps.tables.values():
            table.enable_ssu(cpr.r, cpr.ssu_sample_period, spec.training.seed + index)
    host = os.environ.get(ENV_BIND_HOST, "127.0.0.1")
    server, port = start_server(ps, ctx.token, host, port=int(os.environ.get(ENV_PS_PORT, "0")))
    stop = threading.Event()
    stop_on_signals(stop)
    advertised = os.environ.get(ENV_ADVERTISE_HOST, "127.0.0.1")
    master.ready(ctx.node_id, f"{advertised}:{port}")
    log.info("%s serving on port %d", ctx.node_id, port)
    stop.wait()
    server.stop(grace=2).wait()
    log.info("%s stopped", ctx.node_id)


if __name__ == "__main__":
    main()
