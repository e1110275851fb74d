"""A JobMaster behind its real HTTP app, with nodes that are only records: what the master API
tests (``test_master_api.py`` and the tests beside it) drive. The launcher records what the
master starts and stops and reports the exit codes a test sets."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from airflow_rover.core.deadline import JobDeadline
from airflow_rover.core.job_dir import JobDir
from airflow_rover.core.policies import CheckpointPolicyConfig
from airflow_rover.core.spec import (
    AutoscaleConfig,
    DataWorkersConfig,
    JobSpec,
    RecoveryConfig,
    ResourcePlan,
    TrainingConfig,
)
from airflow_rover.data.synthetic import GeneratedDataset, SyntheticConfig, generate_dataset
from airflow_rover.launchers.base import write_job
from airflow_rover.master.app import create_app
from airflow_rover.master.job import JobMaster
from airflow_rover.master.node_launcher import NodeLauncher

TOKEN = "job-token-0123456789"
P = "/api/v1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NUM_TRAIN = 2000
SHARD_SIZE = 250
EPOCHS = 2
NUM_SHARDS = EPOCHS * NUM_TRAIN // SHARD_SIZE  # 16
BATCH_SIZE = 64
BATCHES_PER_SHARD = -(-SHARD_SIZE // BATCH_SIZE)  # 4: 64 + 64 + 64 + 58 samples


class FakeLauncher(NodeLauncher):
    """Records what the master starts and stops; exit codes are whatever the test sets."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []
        self.stopped: list[str] = []
        self.stop_all_calls = 0
        self.codes: dict[str, int | None] = {}

    def start(self, node_id: str, role: str) -> None:
        self.started.append((node_id, role))
        self.codes[node_id] = None

    def exit_codes(self) -> dict[str, int | None]:
        return dict(self.codes)

    def stop(self, node_id: str) -> None:
        self.stopped.append(node_id)

    def stop_all(self) -> None:
        self.stop_all_calls += 1

    def exit(self, node_id: str, code: int) -> None:
        assert node_id in self.codes, f"{node_id} was never started"
        self.codes[node_id] = code


@dataclass
class Job:
    master: JobMaster
    launcher: FakeLauncher
    api: TestClient
    layout: JobDir

    def get(self, path: str, **kw) -> dict:
        reply = self.api.get(P + path, headers=AUTH, **kw)
        assert reply.status_code == 200, reply.text
        return reply.json()

    def post(self, path: str, body: dict | None = None) -> dict:
        reply = self.api.post(P + path, json=body if body is not None else {}, headers=AUTH)
        assert reply.status_code == 200, reply.text
        return reply.json()

    def status(self) -> dict:
        return self.get("/status")

    def lease(self, worker: str) -> dict:
        return self.post("/shards/lease", {"node_id": worker})

    def done(self, worker: str, shard_id: int) -> bool:
        return self.post(f"/shards/{shard_id}/done", {"node_id": worker})["accepted"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> GeneratedDataset:
    root = tmp_path_factory.mktemp("data")
    return generate_dataset(root, SyntheticConfig(num_train=NUM_TRAIN, num_eval=500, seed=0))


def new_job(
    dataset: GeneratedDataset,
    root: Path,
    with_eval: bool = False,
    lease_s: float = 60.0,
    num_workers: int = 2,
    recovery: RecoveryConfig | None = None,
    num_ps: int = 1,
    checkpoint: CheckpointPolicyConfig | None = None,
    deadline: JobDeadline | None = None,
    checkpoint_uri: str | None = None,
    autoscale: AutoscaleConfig | None = None,
    data_workers: DataWorkersConfig | None = None,
) -> Job:
    """A pending job in ``root/job`` (close its ``api`` when done)."""
    spec = JobSpec(
        job_id="unit-job.1",
        train_data=str(dataset.train_dir),
        eval_data=str(dataset.eval_dir) if with_eval else None,
        embedding_dim=4,
        plan=ResourcePlan(num_workers=num_workers, num_ps=num_ps),
        training=TrainingConfig(
            shard_size=SHARD_SIZE, epochs=EPOCHS, shard_lease_s=lease_s, batch_size=BATCH_SIZE
        ),
        recovery=recovery or RecoveryConfig(),
        checkpoint=checkpoint or CheckpointPolicyConfig(),
        deadline=deadline,
        checkpoint_uri=checkpoint_uri,
        autoscale=autoscale or AutoscaleConfig(),
        data_workers=data_workers or DataWorkersConfig(),
    )
    layout = JobDir(root / "job")
    spec = write_job(layout, spec)
    launcher = FakeLauncher()
    master = JobMaster(layout, spec, launcher, TOKEN)
    return Job(master, launcher, TestClient(create_app(master, TOKEN)), layout)


@pytest.fixture
def make_job(dataset: GeneratedDataset, tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """``new_job`` in the test's folder, closed after the test."""
    jobs: list[Job] = []

    def make(**kwargs: Any) -> Job:
        jobs.append(new_job(dataset, tmp_path, **kwargs))
        return jobs[-1]

    yield make
    for job in jobs:
        job.api.close()


def start_running(job: Job, ps_address: str = "127.0.0.1:1") -> None:
    """Drive the master to RUNNING: it starts ps-0, ps-0 reports ready, it starts the workers."""
    job.master.step()
    assert job.launcher.started == [("ps-0", "ps")]
    assert job.status()["state"] == "pending"
    assert job.post("/nodes/ps-0/ready", {"address": ps_address}) == {"ok": True}
    job.master.step()
    assert job.status()["state"] == "running"


def observable(job: Job) -> dict:
    """Everything a request could change, minus clocks."""
    status = job.master.status()
    del status["duration_s"]
    return {"status": status, "queue": job.master.queue.to_dict()}
