"""A worker stopped by a smaller plan may have sent requests just before it died; they wait
for the job's lock while the plan is applied and are served after its shards went back to the
queue. They must neither lease it a shard nor complete one: a slice's completion would settle
batches past the slice that nobody trained."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from master_rig import BATCH_SIZE, TOKEN, Job

from airflow_rover.core.embedding_placement import EmbeddingPlacement
from airflow_rover.core.training_optimizers import Optimizer
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc.ps_client import PSClient

Push = tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]
SLOW_MS, FAST_MS = 40.0, 10.0  # worker-1 is 4 times slower: it leases 1-batch slices


def _beat(job: Job, worker: str, step_ms: float) -> None:
    body = {"steps": 10, "samples": 640, "step_time_ms": step_ms}
    assert job.post(f"/nodes/{worker}/heartbeat", body) == {"stop": False}


def _train(client: PSClient, push: Push, shard: dict) -> None:
    """One keyed push per batch of ``shard``, as a worker's would be."""
    for index, _ in enumerate(range(shard["start"], shard["end"], BATCH_SIZE)):
        client.push(*push, key=shard["first_key"] + index)


def test_a_stopped_workers_late_lease_and_report_lose_no_batch(
    make_job, caplog: pytest.LogCaptureFixture
) -> None:
    job = make_job()
    job.master.step()
    layout = EmbeddingPlacement.from_features(job.master.spec.resolved_features)
    ps = ParameterServer(0, 1, layout, Optimizer("adagrad", 0.05), 0)
    server, port = start_server(ps, TOKEN, threads=2)
    client = PSClient([f"127.0.0.1:{port}"], TOKEN)
    group = layout.groups[0]
    push: Push = (
        {group.name: np.arange(10, dtype=np.int64)},
        {group.name: np.full((10, group.dim), 0.01, np.float32)},
        {},
    )
    try:
        job.post("/nodes/ps-0/ready", {"address": f"127.0.0.1:{port}"})
        job.master.step()
        for worker, step_ms in (("worker-0", FAST_MS), ("worker-1", SLOW_MS)):
            job.post(f"/nodes/{worker}/ready", {})
            _beat(job, worker, step_ms)
        assert job.lease("worker-0")["shard"]["shard_id"] == 0
        piece = job.lease("worker-1")["shard"]
        assert piece["end"] - piece["start"] == BATCH_SIZE  # a slice: its first batch only
        client.push(*push, key=piece["first_key"])  # worker-1 trained its slice

        plan = job.post("/plans", {"num_workers": 1, "reason": "a heavier job waits"})
        assert job.post(f"/plans/{plan['id']}/apply")["state"] == "applied"
        assert job.launcher.stopped == ["worker-1"]

        # What worker-1 sent before it died, served now: its next lease, then the report of
        # its slice (sent once the slice's push had landed).
        with caplog.at_level(logging.INFO, logger="airflow_rover.master.dispatch"):
            late = job.lease("worker-1")
        assert late["status"] == "done" and late["shard"] is None, late
        assert "no lease for worker-1: it was stopped" in caplog.text
        assert not job.done("worker-1", piece["shard_id"])

        rest = job.lease("worker-0")["shard"]  # the rest of the sliced shard, next in line
        assert (rest["shard_id"], rest["start"]) == (piece["shard_id"], piece["end"])
        assert rest["first_key"] == piece["first_key"] + 1
        _train(client, push, rest)
        assert job.done("worker-0", rest["shard_id"])
    finally:
        client.close()
        server.stop(None)

    queue = job.master.queue
    sliced = queue.static(piece["shard_id"])
    keys = set(queue.batch_keys.keys(sliced))
    print(f"shard {sliced.shard_id}: keys {sorted(keys)}, applied {sorted(ps.ledger.applied)}")
    assert queue.is_done(sliced.shard_id) and queue.completions[sliced.shard_id] == 1
    assert keys <= ps.ledger.applied  # every batch of the sliced shard reached the PS
