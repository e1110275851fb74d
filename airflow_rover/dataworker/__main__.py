"""Entry point of a data worker node (started by a launcher, configured by environment)."""

from __future__ import annotations

import argparse
import logging
import os
import threading

from airflow_rover.core.job_dir import (
    ENV_ADVERTISE_HOST,
    ENV_BIND_HOST,
    ENV_DATA_PORT,
    NodeContext,
)
from airflow_rover.core.parent_death import die_with_parent
from airflow_rover.core.stop_signals import stop_on_signals
from airflow_rover.data.batch_ids import ElementEncoder
from airflow_rover.data.preprocessing import load_preprocess
from airflow_rover.data.reader import open_split
from airflow_rover.dataworker.server import DataWorkerService, start_server
from airflow_rover.rpc import master_api
from airflow_rover.rpc.crash_report import report_crash
from airflow_rover.rpc.master_client import MasterClient, quiet_request_logs

log = logging.getLogger("airflow_rover.dataworker")

LEAVE_GRACE_S = 170.0  # told to leave: the calls in flight finish, within this
STOP_GRACE_S = 2.0  # stopped by a signal


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="airflow_rover.dataworker")
    parser.add_argument("--role", default="data", choices=["data"])
    parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    quiet_request_logs()
    die_with_parent()  # a local node ends with its master
    ctx = NodeContext.from_env()
    master = MasterClient(ctx.master_addr, ctx.token, ctx.tls)
    try:
        _serve(ctx, master)
    except Exception as exc:  # the master learns what killed this node, then it dies of it
        report_crash(master, ctx.node_id, exc)
        raise


def _serve(ctx: NodeContext, master: MasterClient) -> None:
    spec = ctx.job_dir.read_spec()
    data = open_split(spec, spec.train_data)
    encoder = ElementEncoder(
        spec.resolved_features,
        [c.name for c in data.schema.categorical],
        [c.name for c in data.schema.lists],
    )
    service = DataWorkerService(data, load_preprocess(spec.preprocess), encoder, spec.preprocess)
    server, port = start_server(
        service,
        ctx.token,
        os.environ.get(ENV_BIND_HOST, "127.0.0.1"),
        int(os.environ.get(ENV_DATA_PORT, "0")),
        ctx.tls,
    )
    stop = threading.Event()
    stop_on_signals(stop)
    master.ready(ctx.node_id, f"{os.environ.get(ENV_ADVERTISE_HOST, '127.0.0.1')}:{port}")
    log.info("%s serving batches on port %d", ctx.node_id, port)
    leaving = _beat_until_told(ctx.node_id, master, service, stop, spec.training.progress_report_s)
    if leaving:
        log.info("%s leaving: no new calls, finishing those in flight", ctx.node_id)
    stopped = server.stop(grace=LEAVE_GRACE_S if leaving else STOP_GRACE_S)
    while not stopped.wait(0.5):
        if stop.is_set():  # a signal cuts the drain short
            server.stop(grace=None).wait()
            break
    log.info("%s stopped after %d batches", ctx.node_id, service.served.batches)
    try:  # the last count, for the job's status (the master may be gone by now)
        master.heartbeat(ctx.node_id, _beat(service))
    except Exception as exc:
        log.info("final heartbeat not delivered: %s", exc)
    master.close()


def _beat_until_told(
    node_id: str,
    master: MasterClient,
    service: DataWorkerService,
    stop: threading.Event,
    report_s: float,
) -> bool:
    """Report what was served until a heartbeat's reply says leave (True) or a signal stops
    the node (False)."""
    while not stop.wait(report_s):
        try:
            if master.heartbeat(node_id, _beat(service)):
                return True
        except Exception as exc:  # a missed beat is not fatal
            log.warning("heartbeat failed: %s", exc)
    return False


def _beat(service: DataWorkerService) -> master_api.Heartbeat:
    served = service.served
    return master_api.Heartbeat(
        steps=served.batches, samples=served.samples, step_time_ms=served.ms_per_batch
    )


if __name__ == "__main__":
    main()
