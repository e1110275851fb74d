"""Entry point of a worker or evaluator node (started by a launcher, configured by environment)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING

import grpc

from airflow_rover.core.allocator import keep_freed_memory
from airflow_rover.core.job_dir import NodeContext
from airflow_rover.core.node_job import node_job
from airflow_rover.core.parent_death import die_with_parent
from airflow_rover.core.spec import JobSpec
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.data.reader import SampleReader, open_split
from airflow_rover.rpc.crash_report import report_crash
from airflow_rover.rpc.master_api import EXIT_PS_LOST, ClusterInfo
from airflow_rover.rpc.master_client import MasterClient, quiet_request_logs
from airflow_rover.rpc.ps_client import PSClient

if TYPE_CHECKING:  # it imports TensorFlow: the functions that use it import it when called
    from airflow_rover.worker.ps_model import PSModel

log = logging.getLogger("airflow_rover.worker")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="airflow_rover.worker")
    parser.add_argument("--role", default="worker", choices=["worker", "evaluator"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    quiet_request_logs()
    keep_freed_memory()  # megabyte messages without page faults
    die_with_parent()  # a local node ends with its master
    ctx = NodeContext.from_env()
    master = MasterClient(ctx.master_addr, ctx.token, ctx.tls)
    try:
        _run(args.role, ctx, master)
    except Exception as exc:  # the master learns what killed this node, then it dies of it
        report_crash(master, ctx.node_id, exc)
        raise


def _run(role: str, ctx: NodeContext, master: MasterClient) -> None:
    """Build the model, then train (a worker) or score the held-out split (the evaluator)."""
    stop = threading.Event()  # set when the master says so; SIGTERM ends the process at once
    started = time.monotonic()
    _configure_tensorflow()
    spec = ctx.job_dir.read_spec()
    cluster = master.cluster()
    optimizer = Optimizer(spec.training.optimizer, spec.training.learning_rate)
    # Opened once, before the node says it is ready: on S3 that lists the files and reads
    # their footers, start-up work that would otherwise delay the first shard.
    evaluates = role == "evaluator" and spec.eval_data is not None
    data = open_split(spec, spec.eval_data if evaluates and spec.eval_data else spec.train_data)
    model = _ps_model(spec, ctx, role, cluster, optimizer, data)
    if role == "worker":
        model.warm_up()
    log.info("%s ready: model built in %.1f s", ctx.node_id, time.monotonic() - started)
    master.ready(ctx.node_id)
    if role == "worker":
        _train(ctx, spec, model, optimizer, master, cluster.ps_set_version, stop, data)
        # the first worker done scores the held-out split, warm (``master.wrap_up``)
        if spec.eval_data and master.claim_evaluation(ctx.node_id):
            _evaluate(ctx.node_id, spec, model, master, open_split(spec, spec.eval_data))
    else:
        _evaluate(ctx.node_id, spec, model, master, data)
    model.ps.close()  # the client of the last PS set it trained against
    master.close()


def _configure_tensorflow() -> None:
    import tensorflow as tf

    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)


def _ps_model(
    spec: JobSpec,
    ctx: NodeContext,
    role: str,
    cluster: ClusterInfo,
    optimizer: Optimizer,
    data: SampleReader,
) -> PSModel:
    """The job's model (Keras seeded with the job's seed) on a client of ``cluster``'s PS;
    a worker reads a lost PS's rows itself where the checkpoint policy can (ECRM)."""
    import keras

    from airflow_rover.worker.models import load_factory
    from airflow_rover.worker.ps_model import PSModel

    features = spec.resolved_features
    reads = None
    if role == "worker":
        policy = spec.checkpoint.build()
        reads = policy.degraded_reads(node_job(spec, ctx.job_dir), optimizer)
    if reads is not None:  # worked out now, so a lost PS's first decoded read does not wait
        threading.Thread(target=reads.warm, args=(len(cluster.ps),), daemon=True).start()
    ps = PSClient(cluster.ps, ctx.token, ecrm=reads, tls=ctx.tls)
    keras.utils.set_random_seed(spec.training.seed)
    return PSModel(
        load_factory(spec.model)(features),
        features,
        [c.name for c in data.schema.categorical],
        ps,
        [c.name for c in data.schema.lists],
    )


def _train(
    ctx: NodeContext,
    spec: JobSpec,
    model: PSModel,
    optimizer: Optimizer,
    master: MasterClient,
    ps_set_version: int,
    stop: threading.Event,
    data: SampleReader,
) -> None:
    """Train until the queue is done; a PS lost for good ends the process with
    ``EXIT_PS_LOST`` (not a failure)."""
    from airflow_rover.data.preprocessing import load_preprocess
    from airflow_rover.worker.input_pipeline import InputConfig
    from airflow_rover.worker.profile_report import profile_file, write_profile
    from airflow_rover.worker.relaunch import PS_LOST_CODES, PSLost
    from airflow_rover.worker.training import train

    node_id = ctx.node_id
    inputs = InputConfig(
        load_preprocess(spec.preprocess),
        spec.preprocess,
        spec.data_workers.enabled,
        ctx.token,
        ctx.tls,
        spec.data_workers.ready_batches,
    )
    try:
        model.offer_initial_weights()  # a PS lost now: EXIT_PS_LOST too (not a failure)
        progress = train(
            node_id,
            model,
            optimizer,
            data,
            master,
            spec.training.batch_size,
            stop,
            ps_set_version,
            spec.training.progress_report_s,
            inputs,
        )
    except PSLost as exc:
        log.error("a parameter server went away and is not back: %s", exc)
        sys.exit(EXIT_PS_LOST)
    except grpc.RpcError as exc:
        if exc.code() not in PS_LOST_CODES:
            raise
        log.error("a parameter server went away: %s", exc)
        sys.exit(EXIT_PS_LOST)
    log.info("%s done: %d steps, %d samples", node_id, progress.steps, progress.samples)
    write_profile(profile_file(ctx.job_dir.log_file(node_id)), progress, model.ps, model.traces())


def _evaluate(
    node_id: str, spec: JobSpec, model: PSModel, master: MasterClient, data: SampleReader
) -> None:
    """Score the held-out split and report it to the master."""
    from airflow_rover.data.preprocessing import load_preprocess
    from airflow_rover.worker.evaluation import evaluate

    if spec.eval_data is None:
        raise SystemExit("evaluator started for a job without eval_data")
    preprocess = load_preprocess(spec.preprocess)
    report = evaluate(model, data, preprocess, spec.preprocess, node_id=node_id)
    master.report_evaluation(report)
    log.info(
        "evaluation: auc=%.4f logloss=%.4f on %d samples",
        report.auc,
        report.logloss,
        report.samples,
    )


if __name__ == "__main__":
    main()
