"""Entry point of a parameter-server node (started by a launcher, configured by environment)."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

import numpy as np

from airflow_rover.core.embedding_layout import EmbeddingLayout
from airflow_rover.core.features import resolve_features
from airflow_rover.core.layout import NodeContext
from airflow_rover.master.client import MasterClient
from airflow_rover.ps.optimizers import Optimizer
from airflow_rover.ps.server import ParameterServer, start_server

log = logging.getLogger("airflow_rover.ps")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="airflow_rover.ps")
    parser.add_argument("--role", default="ps", choices=["ps"])
    parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    ctx = NodeContext.from_env()
    spec = ctx.layout.read_spec()
    index = int(ctx.node_id.rsplit("-", 1)[1])
    ps = ParameterServer(
        index,
        spec.plan.num_ps,
        EmbeddingLayout.from_features(resolve_features(spec)),
        Optimizer(spec.training.optimizer, spec.training.learning_rate),
        spec.training.seed,
    )
    checkpoint = ctx.layout.latest_checkpoint()
    part = checkpoint / f"ps-{index}.npz" if checkpoint else None
    if part is not None and part.exists():
        with np.load(part) as saved:
            ps.restore(dict(saved))
        log.info("%s restored %s (%d batches applied)", ctx.node_id, part, len(ps.ledger.applied))
    server, port = start_server(ps, ctx.token)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    master = MasterClient(ctx.master_addr, ctx.token)
    master.ready(ctx.node_id, f"127.0.0.1:{port}")
    log.info("%s serving on port %d", ctx.node_id, port)
    stop.wait()
    server.stop(grace=2).wait()
    log.info("%s stopped", ctx.node_id)


if __name__ == "__main__":
    main()
