"""The Kubernetes backend against an API server stand-in on loopback (kmock's emulator, see
``tests/fixtures/k8s_emulator.py``): a job's launch, a scale-up, a scale-down, a hot-PS
replacement (in place, and by replacing the pod where the cluster cannot resize) and the cleanup
make exactly the expected create / patch / delete calls, and a re-created trigger creates
nothing twice. The Airflow side goes through the cncf-kubernetes hooks and a kubeconfig
connection; the master side through the kubernetes client, as in its pod."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import stat
import sys
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, cast

import kubernetes_validate
import pytest
import uvicorn
from airflow.triggers.base import TriggerEvent
from kubernetes import client

from airflow_rover.core.job_dir import atomic_write_json
from airflow_rover.core.plans import PlanRecord
from airflow_rover.core.post_scaling import JobProfile, NodeProfile, hot_ps
from airflow_rover.core.spec import (
    AutoscaleConfig,
    DataWorkersConfig,
    FeatureConfig,
    JobSpec,
    ResourcePlan,
    TableConfig,
    TrainingConfig,
)
from airflow_rover.data.synthetic import GeneratedDataset, SyntheticConfig, generate_dataset
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.launchers.kubernetes import manifests as m
from airflow_rover.launchers.kubernetes.backend import KubernetesBackend
from airflow_rover.launchers.kubernetes.config import KubernetesConfig, KubernetesJob
from airflow_rover.launchers.kubernetes.nodes import KubernetesNodeLauncher
from airflow_rover.master.app import create_app
from airflow_rover.master.job import JobMaster
from airflow_rover.rpc.master_api import NodeReady
from airflow_rover.triggers.elastic_job import ElasticJobTrigger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from k8s_emulator import ApiServerStandIn, kubeconfig, serve

NS = "ml"
CONN_ID = "rover_standin"
JOB = KubernetesJob(
    config=KubernetesConfig(
        image="airflow-rover:test", job_volume_claim="rover-jobs", namespace=NS
    ),
    kubernetes_conn_id=CONN_ID,
)
SPEC = JobSpec(
    job_id="daily.train-0123456789",
    train_data="/rover/data/train",  # on the pods' volume: features given, not read from it
    features=FeatureConfig(
        num_dense=13, tables=(TableConfig(name="C1", column="C1", vocab_size=1000, dim=16),)
    ),
    plan=ResourcePlan(num_ps=2, num_workers=2, ps_cpu=2, ps_memory_mb=4096, worker_cpu=1),
)
NAMES = m.JobNames(SPEC.job_id, NS)
SETTLE_GRACE_S = 0.3  # after a poll settles, how long calls it should not make are watched for
POD = NAMES.node_pod


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ApiServerStandIn, client.CoreV1Api]]:
    """The stand-in, a ``kubernetes_conn_id`` connection to it, and a plain client (what the
    master uses in its pod)."""
    param = getattr(request, "param", True)
    resize, capacity = param if isinstance(param, tuple) else (param, None)
    with serve(resize_supported=resize, capacity_cpu=capacity) as (api, url):
        extra = {"kube_config": kubeconfig(url, NS)}
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{CONN_ID.upper()}",
            json.dumps({"conn_type": "kubernetes", "extra": extra}),
        )
        config = client.Configuration()
        config.host = url
        with client.ApiClient(config) as api_client:
            yield api, client.CoreV1Api(api_client)


def launched(tmp_path: Path, v1: client.CoreV1Api) -> tuple[ElasticJobHook, str]:
    """A job launched from Airflow whose master pod runs; returns its hook and the pod's uid."""
    hook = ElasticJobHook(tmp_path / "job", backend=KubernetesBackend(JOB))
    hook.launch(SPEC)
    set_status(v1, NAMES.master_pod, {"phase": "Running"})
    uid = v1.read_namespaced_pod(NAMES.master_pod, NS).metadata.uid
    return hook, str(uid)


def set_status(v1: client.CoreV1Api, pod: str, status: dict[str, Any]) -> None:
    """What the kubelet would report (the stand-in runs nothing)."""
    v1.patch_namespaced_pod_status(pod, NS, {"status": status}, _preload_content=False)


def container_status(state: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "node",
        "image": "airflow-rover:test",
        "imageID": "",
        "ready": "running" in state,
        "restartCount": 0,
        "state": state,
    }


def running(v1: client.CoreV1Api, *pods: str) -> None:
    for pod in pods:
        status = {"phase": "Running", "containerStatuses": [container_status({"running": {}})]}
        set_status(v1, pod, status)


def node_launcher(
    v1: client.CoreV1Api, hook: ElasticJobHook, uid: str, incarnation: int = 0
) -> KubernetesNodeLauncher:
    return KubernetesNodeLauncher(
        v1, JOB.config, NAMES, hook.job_dir, uid, incarnation, poll_s=0.0, wait_s=5.0
    )


def stored(v1: client.CoreV1Api, pod: str) -> dict[str, Any]:
    raw = v1.read_namespaced_pod(pod, NS, _preload_content=False).data
    data: dict[str, Any] = json.loads(raw)
    return data


def requests_of(v1: client.CoreV1Api, pod: str) -> dict[str, str]:
    return stored(v1, pod)["spec"]["containers"][0]["resources"]["requests"]


@pytest.mark.parametrize(
    "cluster", [True, False], ids=["in-place-resize", "no-in-place-resize"], indirect=True
)
def test_launch_scale_up_scale_down_hot_ps_and_cleanup(
    cluster: tuple[ApiServerStandIn, client.CoreV1Api], tmp_path: Path
) -> None:
    api, v1 = cluster
    # Launch (the operator, through the provider's KubernetesHook).
    hook = ElasticJobHook(tmp_path / "job", backend=KubernetesBackend(JOB))
    data_workers = DataWorkersConfig(mode="fixed", count=1, cpu=0.5, memory_mb=1536)
    spec = SPEC.model_copy(update={"data_workers": data_workers})
    hook.launch(spec)
    assert api.calls() == [
        f"create pods/{NAMES.master_pod}",
        f"create secrets/{NAMES.secret}",
        f"create services/{NAMES.master_service}",
        f"create services/{NAMES.ps_service}",
        f"create services/{NAMES.data_service}",
        f"create networkpolicies/{NAMES.network_policy}",
    ]
    for request in list(api):
        kubernetes_validate.validate(request.data, "1.33", strict=True)
    assert KubernetesJob.read(hook.job_dir) == JOB and hook.job_dir.read_spec() == spec
    # The job's certificate, made at launch: in its Secret, and in its directory for Airflow.
    assert secret_cert(v1) == hook.job_dir.tls_cert_file.read_bytes()
    assert stat.S_IMODE(hook.job_dir.tls_key_file.stat().st_mode) == 0o600
    set_status(v1, NAMES.master_pod, {"phase": "Running"})
    uid = str(v1.read_namespaced_pod(NAMES.master_pod, NS).metadata.uid)

    # The master starts its PS, then its workers and its data worker.
    nodes = node_launcher(v1, hook, uid)
    mark = api.count()
    started = ("ps-0", "ps-1", "worker-0", "worker-1", "data-0")
    for node_id in started:
        nodes.start(node_id, node_id.split("-")[0])  # type: ignore[arg-type]
    assert api.calls(mark) == [f"create pods/{POD(n)}" for n in started]
    for pod in (POD(n) for n in started):
        kubernetes_validate.validate(stored(v1, pod), "1.33", strict=True)
    assert requests_of(v1, POD("ps-1")) == {"cpu": "2", "memory": "4096Mi"}
    assert requests_of(v1, POD("worker-1")) == {"cpu": "1", "memory": "2048Mi"}
    assert requests_of(v1, POD("data-0")) == {"cpu": "500m", "memory": "1536Mi"}
    assert all(m.owner_uid(stored(v1, POD(n))) == uid for n in ("ps-0", "worker-1", "data-0"))
    running(v1, *(POD(n) for n in started))
    mark = api.count()
    assert set(nodes.exit_codes().values()) == {None}
    assert api.calls(mark) == ["list pods"]

    # Scale-up: a plan with 3 workers.
    mark = api.count()
    nodes.start("worker-2", "worker")
    assert api.calls(mark) == [f"create pods/{POD('worker-2')}"]
    running(v1, POD("worker-2"))

    # Scale-down back to 2 workers: the pod is deleted and gone before the master goes on.
    mark = api.count()
    nodes.stop("worker-2")
    assert api.calls(mark) == [f"delete pods/{POD('worker-2')}", f"fetch pods/{POD('worker-2')}"]
    assert nodes.exit_codes()["worker-2"] == -15

    # Hot PS: ps-1 gets 4 cores and 8 GB.
    mark = api.count()
    outcome = nodes.resize("ps-1", "ps", 4.0, 8192)
    if api.resize_supported:
        assert outcome == "in-place"
        assert api.calls(mark) == [f"update pods/{POD('ps-1')}/resize"]
        assert requests_of(v1, POD("ps-1")) == {"cpu": "4", "memory": "8192Mi"}
        assert nodes.exit_codes()["ps-1"] is None  # the process kept running
    else:  # replaced: reported exited, so the master recovers it, then started bigger
        assert outcome == "replace"
        assert api.calls(mark) == [
            f"update pods/{POD('ps-1')}/resize",
            f"delete pods/{POD('ps-1')}",
            f"fetch pods/{POD('ps-1')}",
        ]
        assert nodes.exit_codes()["ps-1"] == -15
        assert "deleted to resize it" in hook.job_dir.log_file("ps-1").read_text()
        mark = api.count()
        nodes.start("ps-1", "ps")
        assert api.calls(mark) == [f"create pods/{POD('ps-1')}"]
        assert requests_of(v1, POD("ps-1")) == {"cpu": "4", "memory": "8192Mi"}

    # The job ends: the master deletes its nodes, then the trigger deletes the master's objects.
    mark = api.count()
    nodes.stop_all()
    remaining = started
    assert api.calls(mark) == [
        "list pods",
        *(f"delete pods/{POD(n)}" for n in remaining),
        *(f"fetch pods/{POD(n)}" for n in remaining),
    ]
    atomic_write_json(hook.job_dir.state_file, {"job_id": SPEC.job_id, "state": "succeeded"})
    mark = api.count()
    event = asyncio.run(first_event(ElasticJobTrigger(str(hook.job_dir.root), stop_on_kill=True)))
    assert event is not None and event["status"] == "success"
    assert api.calls(mark) == [
        *ensure_reads(),
        f"fetch pods/{NAMES.master_pod}",  # alive? (the master did not answer)
        f"fetch pods/{NAMES.master_pod}/log",
        f"delete pods/{NAMES.master_pod}",
        f"delete secrets/{NAMES.secret}",
        f"delete services/{NAMES.master_service}",
        f"delete services/{NAMES.ps_service}",
        f"delete services/{NAMES.data_service}",
        f"delete networkpolicies/{NAMES.network_policy}",
    ]
    assert f"last lines of {NAMES.master_pod}" in hook.job_dir.log_file("master").read_text()
    assert v1.list_namespaced_pod(NS).items == []


def secret_cert(v1: client.CoreV1Api) -> bytes:
    return base64.b64decode(v1.read_namespaced_secret(NAMES.secret, NS).data[m.TLS_CERT_KEY])


def ensure_reads() -> list[str]:
    return [
        f"fetch pods/{NAMES.master_pod}",
        f"fetch secrets/{NAMES.secret}",
        f"fetch services/{NAMES.master_service}",
        f"fetch services/{NAMES.ps_service}",
        f"fetch services/{NAMES.data_service}",
        f"fetch networkpolicies/{NAMES.network_policy}",
    ]


async def first_event(
    trigger: ElasticJobTrigger, settled: Callable[[], bool] | None = None, within_s: float = 60.0
) -> dict[str, Any] | None:
    """The trigger's first event; or None once ``settled()`` holds and no event came (a poll has
    done its work; the trigger is then stopped, as a triggerer restart stops it). Waiting on
    what the poll does, not on a time window, keeps a loaded machine from cutting a poll short."""
    events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
    upcoming = asyncio.ensure_future(anext(events))
    deadline = time.monotonic() + within_s
    try:
        while not upcoming.done():
            if settled is not None and settled():
                await asyncio.wait({upcoming}, timeout=SETTLE_GRACE_S)  # the rest of the poll
                if not upcoming.done():
                    return None
            elif time.monotonic() > deadline:
                raise AssertionError(f"no event and not settled in {within_s}s")
            else:
                await asyncio.wait({upcoming}, timeout=0.01)
        payload: dict[str, Any] = upcoming.result().payload
        return payload
    finally:
        upcoming.cancel()
        await asyncio.gather(upcoming, return_exceptions=True)
        await events.aclose()


def applied(master: JobMaster) -> Callable[[], bool]:
    """Settled once the master has applied the newest plan the trigger passed on."""
    return lambda: master.autoscaler.plans[-1].state == "applied"


def polled_master(api: ApiServerStandIn, since: int) -> Callable[[], bool]:
    """Settled once the trigger has read the master pod: the last call of a poll that saw it run."""
    return lambda: f"fetch pods/{NAMES.master_pod}" in api.calls(since)


def test_a_recreated_trigger_creates_nothing_twice(
    cluster: tuple[ApiServerStandIn, client.CoreV1Api], tmp_path: Path
) -> None:
    """The trigger is re-created from ``serialize()`` (a triggerer restart) while the job runs:
    it only reads; a Service deleted behind its back is the one thing it recreates."""
    api, v1 = cluster
    hook, _ = launched(tmp_path, v1)
    trigger = ElasticJobTrigger(str(hook.job_dir.root), poll_interval=30, stop_on_kill=True)
    for _ in range(3):
        mark = api.count()
        path, kwargs = trigger.serialize()
        assert path == "airflow_rover.triggers.elastic_job.ElasticJobTrigger"
        trigger = ElasticJobTrigger(**kwargs)
        assert asyncio.run(first_event(trigger, polled_master(api, mark))) is None  # no event
        assert api.calls(mark) == [*ensure_reads(), f"fetch pods/{NAMES.master_pod}"]
    v1.delete_namespaced_service(NAMES.ps_service, NS)
    mark = api.count()
    assert asyncio.run(first_event(ElasticJobTrigger(**kwargs), polled_master(api, mark))) is None
    created = [c for c in api.calls(mark) if not c.startswith("fetch")]
    assert created == [f"create services/{NAMES.ps_service}"]
    assert m.owner_uid(
        json.loads(v1.read_namespaced_service(NAMES.ps_service, NS, _preload_content=False).data)
    )


def test_killing_the_task_removes_the_job(
    cluster: tuple[ApiServerStandIn, client.CoreV1Api], tmp_path: Path
) -> None:
    """``on_kill`` (operator, sync) and the trigger's ``on_kill`` (async) delete the master pod
    and what it owns; the master's log stays in the job directory."""
    api, v1 = cluster
    hook, _ = launched(tmp_path, v1)
    mark = api.count()
    hook.stop("the Airflow task was killed")
    cleanup = [
        f"fetch pods/{NAMES.master_pod}/log",
        f"delete pods/{NAMES.master_pod}",
        f"delete secrets/{NAMES.secret}",
        f"delete services/{NAMES.master_service}",
        f"delete services/{NAMES.ps_service}",
        f"delete services/{NAMES.data_service}",
        f"delete networkpolicies/{NAMES.network_policy}",
    ]
    assert api.calls(mark) == cleanup
    assert v1.list_namespaced_pod(NS).items == [] and v1.list_namespaced_secret(NS).items == []
    hook, _ = launched(tmp_path / "again", v1)
    mark = api.count()
    asyncio.run(ElasticJobTrigger(str(hook.job_dir.root), stop_on_kill=True).on_kill())
    assert api.calls(mark) == cleanup  # the master never announced itself: nothing to ask


def test_a_retry_relaunches_in_the_same_directory(
    cluster: tuple[ApiServerStandIn, client.CoreV1Api], tmp_path: Path
) -> None:
    """A failed try's objects are removed (and gone) before the new master pod is created."""
    api, v1 = cluster
    hook, old_uid = launched(tmp_path, v1)
    old_cert = secret_cert(v1)
    set_status(v1, NAMES.master_pod, {"phase": "Failed"})
    mark = api.count()
    hook.launch(SPEC)
    assert api.calls(mark) == [
        f"fetch pods/{NAMES.master_pod}/log",
        f"delete pods/{NAMES.master_pod}",
        f"delete secrets/{NAMES.secret}",
        f"delete services/{NAMES.master_service}",
        f"delete services/{NAMES.ps_service}",
        f"delete services/{NAMES.data_service}",
        f"delete networkpolicies/{NAMES.network_policy}",
        f"fetch pods/{NAMES.master_pod}",  # gone?
        f"create pods/{NAMES.master_pod}",
        f"create secrets/{NAMES.secret}",
        f"create services/{NAMES.master_service}",
        f"create services/{NAMES.ps_service}",
        f"create services/{NAMES.data_service}",
        f"create networkpolicies/{NAMES.network_policy}",
    ]
    new_uid = v1.read_namespaced_pod(NAMES.master_pod, NS).metadata.uid
    assert new_uid != old_uid
    secret = v1.read_namespaced_secret(NAMES.secret, NS)
    assert secret.metadata.owner_references[0].uid == new_uid
    assert secret_cert(v1) == hook.job_dir.tls_cert_file.read_bytes() != old_cert  # a new one


def test_nodes_die_restart_and_survive_a_master_relaunch(
    cluster: tuple[ApiServerStandIn, client.CoreV1Api], tmp_path: Path
) -> None:
    """A dead node's exit code and log reach the master; starting it again replaces its pod;
    starting a running node twice is a no-op; a relaunched master replaces the nodes of the
    master before it (they would die with it locally)."""
    api, v1 = cluster
    hook, uid = launched(tmp_path, v1)
    nodes = node_launcher(v1, hook, uid)
    nodes.start("ps-0", "ps")
    nodes.start("worker-0", "worker")
    running(v1, POD("ps-0"), POD("worker-0"))
    oom = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    set_status(
        v1, POD("worker-0"), {"phase": "Failed", "containerStatuses": [container_status(oom)]}
    )
    assert nodes.exit_codes() == {"ps-0": None, "worker-0": 137}
    saved = hook.job_dir.log_file("worker-0").read_text()
    assert f"last lines of {POD('worker-0')}" in saved and "reason OOMKilled" in saved

    mark = api.count()
    nodes.start("worker-0", "worker")  # the master relaunches it
    assert api.calls(mark) == [
        f"create pods/{POD('worker-0')}",  # 409: the dead pod is still there
        f"fetch pods/{POD('worker-0')}",
        f"delete pods/{POD('worker-0')}",
        f"fetch pods/{POD('worker-0')}",
        f"create pods/{POD('worker-0')}",
    ]
    running(v1, POD("worker-0"))
    mark = api.count()
    nodes.start("ps-0", "ps")  # already running: nothing changes
    assert api.calls(mark) == [f"create pods/{POD('ps-0')}", f"fetch pods/{POD('ps-0')}"]
    assert nodes.exit_codes() == {"ps-0": None, "worker-0": None}

    relaunched = node_launcher(v1, hook, uid, incarnation=1)
    mark = api.count()
    relaunched.start("ps-0", "ps")
    assert api.calls(mark) == [
        f"create pods/{POD('ps-0')}",
        f"fetch pods/{POD('ps-0')}",
        f"delete pods/{POD('ps-0')}",
        f"fetch pods/{POD('ps-0')}",
        f"create pods/{POD('ps-0')}",
    ]
    assert stored(v1, POD("ps-0"))["metadata"]["labels"][m.LABEL_INCARNATION] == "1"
    assert PurePosixPath(
        {
            e["name"]: e.get("value")
            for e in stored(v1, POD("ps-0"))["spec"]["containers"][0]["env"]
        }["ROVER_JOB_DIR"]
    ) == PurePosixPath(hook.job_dir.root)


# -- plans go trigger -> master -> pods ------------------------------------------------------
@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> GeneratedDataset:
    root = tmp_path_factory.mktemp("data")
    return generate_dataset(root, SyntheticConfig(num_train=2000, num_eval=200, seed=0))


@contextmanager
def master_api(master: JobMaster, token: str) -> Iterator[str]:
    """The master's real HTTP API on loopback (as in its pod, behind its Service)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(master, token), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


def propose(master: JobMaster, **changes: object) -> None:
    """A proposal in the autoscaler's list, as its optimizer would put it."""
    current = master.spec.plan
    master.autoscaler.plans.append(
        PlanRecord.model_validate(
            {
                "id": len(master.autoscaler.plans) + 1,
                "at": time.time(),
                "plan": current.model_copy(update=changes).model_dump(),
                "previous": current.model_dump(),
                "rule": "idle_ps",
                "reason": "test",
                "state": "proposed",
            }
        )
    )


def training_master(
    api: ApiServerStandIn,
    v1: client.CoreV1Api,
    tmp_path: Path,
    spec: JobSpec,
    waiting: tuple[str, ...] = (),
) -> tuple[ElasticJobHook, JobMaster]:
    """A job launched on the stand-in whose master runs its PS and workers (pods Running but
    those ``waiting``)."""
    hook = ElasticJobHook(tmp_path / "job", backend=KubernetesBackend(JOB))
    hook.launch(spec)
    set_status(v1, NAMES.master_pod, {"phase": "Running"})
    uid = str(v1.read_namespaced_pod(NAMES.master_pod, NS).metadata.uid)
    master = JobMaster(hook.job_dir, spec, node_launcher(v1, hook, uid), hook.job_dir.read_token())
    mark = api.count()
    master.step()  # starts the PS
    ps = [f"ps-{i}" for i in range(spec.plan.num_ps)]
    for node in ps:
        master.node_ready(node, NodeReady(address=f"{NAMES.ps_host(node)}:50051"))
    master.step()  # the PS are ready: starts the workers
    assert master.state == "running"
    nodes = [*ps, *(f"worker-{i}" for i in range(spec.plan.num_workers))]
    assert [c for c in api.calls(mark) if c.startswith("create")] == [
        f"create pods/{POD(n)}" for n in nodes
    ]
    running(v1, *(POD(n) for n in nodes if n not in waiting))
    return hook, master


def test_plans_the_trigger_applies_create_and_delete_worker_pods(
    cluster: tuple[ApiServerStandIn, client.CoreV1Api], tmp_path: Path, dataset: GeneratedDataset
) -> None:
    """The training trigger applies the master's proposals through the master's API; the
    master's Kubernetes launcher turns them into pod creates and deletes, nothing more."""
    api, v1 = cluster
    spec = SPEC.model_copy(
        update={
            "train_data": str(dataset.train_dir),
            "plan": ResourcePlan(num_ps=1, num_workers=2),
            "training": TrainingConfig(shard_size=250, batch_size=64),
        }
    )
    hook, master = training_master(api, v1, tmp_path, spec)
    token = hook.job_dir.read_token()
    trigger = ElasticJobTrigger(str(hook.job_dir.root), poll_interval=30, stop_on_kill=True)
    with master_api(master, token) as address:
        atomic_write_json(hook.job_dir.master_file, {"address": address, "pod": NAMES.master_pod})
        for workers, expected in [
            (3, [f"create pods/{POD('worker-2')}"]),
            (1, [f"delete pods/{POD(n)}" for n in ("worker-1", "worker-2")]),
        ]:
            propose(master, num_workers=workers)
            mark = api.count()
            assert asyncio.run(first_event(trigger, applied(master))) is None  # still running
            assert [c for c in api.calls(mark) if not c.startswith("fetch")] == expected
            assert master.autoscaler.plans[-1].state == "applied"
            assert hook.job_dir.read_spec().plan.num_workers == workers
            running(v1, *(POD(f"worker-{i}") for i in range(workers)))
        # A hot PS: the plan doubles the PS cores; the master resizes the PS pod in place.
        propose(master, ps_cpu=2 * spec.plan.ps_cpu)
        mark = api.count()
        assert asyncio.run(first_event(trigger, applied(master))) is None
        assert [c for c in api.calls(mark) if not c.startswith("fetch")] == [
            f"update pods/{POD('ps-0')}/resize"
        ]
        assert master.autoscaler.plans[-1].state == "applied"
        assert "in place: ['ps-0']" in master.autoscaler.plans[-1].note
        assert hook.job_dir.read_spec().plan.ps_cpu == 2 * spec.plan.ps_cpu
        assert master.recovery.restarts == 0
        master.request_stop("test over")
        master.shutdown_nodes()
    assert v1.list_namespaced_pod(NS, label_selector=NAMES.nodes_selector()).items == []


@pytest.mark.parametrize(
    "cluster", [True, False], ids=["in-place-resize", "no-in-place-resize"], indirect=True
)
def test_a_hot_ps_plan_resizes_that_ps_pod_alone(
    cluster: tuple[ApiServerStandIn, client.CoreV1Api], tmp_path: Path, dataset: GeneratedDataset
) -> None:
    """The hot-PS rule's plan, applied by the master: only the hot PS's pod gets its cores
    (resized in place, or deleted and created again at its new size); the other PS's pods,
    and the worker's, are untouched."""
    api, v1 = cluster
    spec = SPEC.model_copy(
        update={
            "train_data": str(dataset.train_dir),
            "plan": ResourcePlan(num_ps=3, num_workers=1, ps_cpu=1.0),
            "training": TrainingConfig(shard_size=250, batch_size=64),
        }
    )
    hook, master = training_master(api, v1, tmp_path, spec)
    hot = NodeProfile("ps-1", "ps", cpu_used=0.95, memory_mb=600.0)
    cool = [NodeProfile(f"ps-{i}", "ps", cpu_used=0.1, memory_mb=600.0) for i in (0, 2)]
    proposal = hot_ps(JobProfile(spec.plan, (*cool, hot)))
    assert proposal is not None and proposal.plan.size_of("ps-1") == (2.0, 2048)
    record = master.autoscaler.request(time.time(), spec.plan, proposal.plan, proposal.reason)
    mark = api.count()
    master.apply_plan(record.id)
    calls = [c for c in api.calls(mark) if not c.startswith("fetch")]
    assert record.state == "applied", record.note
    assert hook.job_dir.read_spec().plan.size_of("ps-1") == (2.0, 2048)
    if api.resize_supported:
        assert calls == [f"update pods/{POD('ps-1')}/resize"]
        assert "in place: ['ps-1']" in str(record.note)
    else:  # deleted; the master sees it exit and creates it again, bigger
        assert calls == [f"update pods/{POD('ps-1')}/resize", f"delete pods/{POD('ps-1')}"]
        mark = api.count()
        master.step()
        assert [c for c in api.calls(mark) if c.startswith(("create", "delete", "update"))] == [
            f"create pods/{POD('ps-1')}"
        ]
        assert master.recovery.restarts == 0  # a replacement, not a failure
    assert requests_of(v1, POD("ps-1")) == {"cpu": "2", "memory": "2048Mi"}
    for other in ("ps-0", "ps-2"):
        assert requests_of(v1, POD(other)) == {"cpu": "1", "memory": "2048Mi"}
    assert requests_of(v1, POD("worker-0")) == {"cpu": "1", "memory": "2048Mi"}
    master.request_stop("test over")
    master.shutdown_nodes()


def oom_killed(v1: client.CoreV1Api, node: str) -> None:
    """What the kubelet reports for a container killed over its memory limit."""
    state = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    set_status(v1, POD(node), {"phase": "Failed", "containerStatuses": [container_status(state)]})


def test_a_pod_killed_out_of_memory_comes_back_with_twice_the_memory_once(
    cluster: tuple[ApiServerStandIn, client.CoreV1Api], tmp_path: Path, dataset: GeneratedDataset
) -> None:
    """A worker pod ``OOMKilled``: the master records an ``oom`` plan naming it and its sizes
    and creates its pod again with twice the memory; a second OOM of it is relaunched like
    any failure, at the same size. The other pods keep theirs."""
    api, v1 = cluster
    spec = SPEC.model_copy(
        update={
            "train_data": str(dataset.train_dir),
            "plan": ResourcePlan(num_ps=1, num_workers=2),
            "training": TrainingConfig(shard_size=250, batch_size=64),
        }
    )
    hook, master = training_master(api, v1, tmp_path, spec)
    oom_killed(v1, "worker-1")
    mark = api.count()
    master.step()
    assert {c for c in api.calls(mark) if c.startswith("create")} == {
        f"create pods/{POD('worker-1')}"  # twice: 409 while the dead pod is there
    }
    assert requests_of(v1, POD("worker-1")) == {"cpu": "1", "memory": "4096Mi"}
    assert requests_of(v1, POD("worker-0")) == {"cpu": "1", "memory": "2048Mi"}
    record = master.autoscaler.plans[-1]
    assert (record.rule, record.state) == ("oom", "applied")
    assert "worker-1 was killed out of memory at 2048 MB: relaunched with 4096 MB" in record.reason
    assert hook.job_dir.read_spec().plan.size_of("worker-1") == (1.0, 4096)

    running(v1, POD("worker-1"))
    master.step()
    oom_killed(v1, "worker-1")  # again: a failure like any other, no bigger
    mark = api.count()
    master.step()
    assert {c for c in api.calls(mark) if c.startswith("create")} == {
        f"create pods/{POD('worker-1')}"  # twice: 409 while the dead pod is there
    }
    assert requests_of(v1, POD("worker-1")) == {"cpu": "1", "memory": "4096Mi"}
    assert [p.rule for p in master.autoscaler.plans].count("oom") == 1
    assert master.recovery.restarts == 2
    master.request_stop("test over")
    master.shutdown_nodes()


PENDING = AutoscaleConfig(pending_timeout_s=0.3, interval_s=0.05)
MASTER_CORES = JOB.config.master_cpu


@pytest.mark.parametrize("cluster", [(True, MASTER_CORES + 3)], indirect=True)
def test_a_worker_pod_pending_past_the_deadline_is_planned_away(
    cluster: tuple[ApiServerStandIn, client.CoreV1Api], tmp_path: Path, dataset: GeneratedDataset
) -> None:
    """A cluster with room for the PS and two workers: the third worker's pod stays Pending
    (Unschedulable). Past ``autoscale.pending_timeout_s`` the master proposes the plan without
    it, rule ``pending``, naming the pod and how long it waited; applied, its pod goes."""
    api, v1 = cluster
    spec = SPEC.model_copy(
        update={
            "train_data": str(dataset.train_dir),
            "plan": ResourcePlan(num_ps=1, num_workers=3),
            "training": TrainingConfig(shard_size=250, batch_size=64),
            "autoscale": PENDING,
        }
    )
    hook, master = training_master(api, v1, tmp_path, spec, waiting=("worker-2",))
    conditions = stored(v1, POD("worker-2"))["status"]["conditions"]
    assert conditions[0]["reason"] == "Unschedulable"
    master.step()
    assert [p.rule for p in master.autoscaler.plans] == []  # not yet past the deadline
    time.sleep(PENDING.pending_timeout_s)
    master.step()
    record = master.autoscaler.plans[-1]
    assert (record.rule, record.state, record.plan.num_workers) == ("pending", "proposed", 2)
    assert "not scheduled: worker-2 for 0 s" in record.reason
    assert "pending_timeout_s=0.3" in record.reason
    master.step()
    assert len(master.autoscaler.plans) == 1  # proposed once
    mark = api.count()
    master.apply_plan(record.id)
    assert [c for c in api.calls(mark) if not c.startswith(("fetch", "list"))] == [
        f"delete pods/{POD('worker-2')}"
    ]
    assert hook.job_dir.read_spec().plan.num_workers == 2
    master.request_stop("test over")
    master.shutdown_nodes()


@pytest.mark.parametrize("cluster", [(True, MASTER_CORES + 3)], indirect=True)
def test_a_big_ps_pod_pending_past_the_deadline_comes_back_smaller(
    cluster: tuple[ApiServerStandIn, client.CoreV1Api], tmp_path: Path, dataset: GeneratedDataset
) -> None:
    """ps-1 sized apart at 4 cores does not fit the cluster (3 cores beside the master): past
    the deadline the master halves it (towards its role's 1 core), records the plan with rule
    ``pending`` and creates its pod again at 2 cores, which the cluster schedules."""
    api, v1 = cluster
    spec = SPEC.model_copy(
        update={
            "train_data": str(dataset.train_dir),
            "plan": ResourcePlan(num_ps=2, num_workers=1).with_size("ps-1", cpu=4.0),
            "training": TrainingConfig(shard_size=250, batch_size=64),
            "autoscale": PENDING,
        }
    )
    hook = ElasticJobHook(tmp_path / "job", backend=KubernetesBackend(JOB))
    hook.launch(spec)
    set_status(v1, NAMES.master_pod, {"phase": "Running"})
    uid = str(v1.read_namespaced_pod(NAMES.master_pod, NS).metadata.uid)
    master = JobMaster(hook.job_dir, spec, node_launcher(v1, hook, uid), hook.job_dir.read_token())
    master.step()  # starts the PS
    assert requests_of(v1, POD("ps-1"))["cpu"] == "4"
    assert stored(v1, POD("ps-1"))["status"]["conditions"][0]["reason"] == "Unschedulable"
    time.sleep(PENDING.pending_timeout_s)
    mark = api.count()
    master.step()
    assert [c for c in api.calls(mark) if c.startswith(("create", "delete"))] == [
        f"delete pods/{POD('ps-1')}",
        f"create pods/{POD('ps-1')}",
    ]
    assert requests_of(v1, POD("ps-1")) == {"cpu": "2", "memory": "2048Mi"}
    assert stored(v1, POD("ps-1"))["status"]["conditions"][0]["status"] == "True"
    record = master.autoscaler.plans[-1]
    assert (record.rule, record.state) == ("pending", "applied")
    assert "ps-1 4 cores, 2048 MB -> 2 cores, 2048 MB" in record.reason
    assert hook.job_dir.read_spec().plan.size_of("ps-1") == (2.0, 2048)
    assert master.recovery.restarts == 0
    master.request_stop("test over")
    master.shutdown_nodes()
