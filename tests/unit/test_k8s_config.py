"""The Kubernetes backend's settings and pure logic: the operator's ``launcher``/``kubernetes``
parameters fail at parse time naming what is wrong, one parameter switches a DAG's backend,
pod statuses map to exit codes, and the Airflow side's steps issue exactly the calls expected
(run here against scripted answers; against an API server stand-in in tests/integration)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import datetime
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException

from airflow_rover.launchers.kubernetes import job as k8s_job
from airflow_rover.launchers.kubernetes import manifests as m
from airflow_rover.launchers.kubernetes.backend import KubernetesBackend
from airflow_rover.launchers.kubernetes.config import KubernetesConfig, KubernetesJob
from airflow_rover.launchers.kubernetes.pod_status import exit_code, failure_note
from airflow_rover.operators.job_identity import default_jobs_root
from airflow_rover.operators.training import ElasticTrainingOperator

SETTINGS: dict[str, Any] = {
    "image": "registry.example.com/airflow-rover:0.1.0",
    "job_volume_claim": "rover-jobs",
}
OWNER = "ElasticTrainingOperator(task_id='train')"


def build(**kwargs: Any) -> ElasticTrainingOperator:
    kwargs.setdefault("train_data", "/rover/data/train")
    with DAG(dag_id="k8s_params", schedule=None, start_date=datetime(2026, 1, 1)):
        return ElasticTrainingOperator(task_id="train", **kwargs)


def run_context(**params: Any) -> Any:
    ti = SimpleNamespace(
        dag_id="k8s_params",
        task_id="train",
        run_id="manual__1",
        map_index=-1,
        try_number=1,
        task=None,
    )
    return {"ti": ti, "params": params}


# -- parameters ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"launcher": "kubernetes"}, ["launcher='kubernetes' needs kubernetes", "image"]),
        ({"kubernetes": {"image": "x"}}, ["kubernetes needs ['job_volume_claim']"]),
        ({"kubernetes": "rover:latest"}, ["kubernetes must be a dict or KubernetesConfig"]),
        ({"kubernetes": {**SETTINGS, "namespace": "ML_Jobs"}}, ["kubernetes", "namespace"]),
        (
            {"kubernetes": {**SETTINGS, "nodeSelector": {}}},
            ["nodeSelector", "accepted", "node_selector"],
        ),
        ({"kubernetes": {**SETTINGS, "env": {"ROVER_NODE_ID": "x"}}}, ["env", "ROVER_"]),
        (
            {"kubernetes": {**SETTINGS, "job_volume_mount_path": "data"}},
            ["job_volume_mount_path", "absolute"],
        ),
        (
            {"kubernetes": {**SETTINGS, "image_pull_policy": "Sometimes"}},
            ["image_pull_policy", "Always"],
        ),
        (
            {
                "kubernetes": {
                    **SETTINGS,
                    "tolerations": [{"key": "k", "operator": "Exists", "value": "v"}],
                }
            },
            ["tolerations", "takes no value"],
        ),
        (
            {"kubernetes": {**SETTINGS, "volume_mounts": [{"name": "data", "mountPath": "/data"}]}},
            ["volume_mounts", "names no volume"],
        ),
        (
            {"kubernetes": {**SETTINGS, "volumes": [{"name": "job", "emptyDir": {}}]}},
            ["volumes", "'job' is the launcher's own"],
        ),
        (
            {"kubernetes": {**SETTINGS, "node_selector": {"pool": "a b"}}},
            ["node_selector", "label"],
        ),
        (
            {"kubernetes": SETTINGS, "kubernetes_conn_id": 5},
            ["kubernetes_conn_id", "connection id"],
        ),
    ],
)
def test_bad_kubernetes_parameters_fail_at_parse_time(
    kwargs: dict[str, Any], expected: list[str]
) -> None:
    kwargs.setdefault("launcher", "kubernetes")
    with pytest.raises(ValueError) as info:
        build(**kwargs)
    message = str(info.value)
    assert OWNER in message
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


def test_kubernetes_parameters_are_templated() -> None:
    for field in ("kubernetes", "kubernetes_conn_id"):
        assert field in ElasticTrainingOperator.template_fields
    assert ElasticTrainingOperator.template_fields_renderers["kubernetes"] == "json"
    templated = {"image": "{{ var.value.rover_image }}", "job_volume_claim": "rover-jobs"}
    build(launcher="kubernetes", kubernetes=templated)  # the image is judged once rendered
    build(launcher="kubernetes", kubernetes="{{ var.json.rover_kubernetes }}")


def test_a_bad_rendered_kubernetes_value_fails_without_retries() -> None:
    operator = build(
        launcher="kubernetes",
        kubernetes={**SETTINGS, "namespace": "{{ params.ns }}"},
        kubernetes_conn_id="{{ params.conn }}",
    )
    operator.render_template_fields(run_context(ns="ml-jobs", conn="k8s_prod"))
    job = operator.kubernetes_job()
    assert job == KubernetesJob(
        config=KubernetesConfig(**SETTINGS, namespace="ml-jobs"), kubernetes_conn_id="k8s_prod"
    )
    operator = build(launcher="kubernetes", kubernetes={**SETTINGS, "namespace": "{{ params.ns }}"})
    operator.render_template_fields(run_context(ns="Not A Namespace"))
    with pytest.raises(AirflowFailException, match=r"invalid kubernetes: namespace"):
        operator.kubernetes_job()


def test_one_parameter_switches_the_backend() -> None:
    """The same task, with its Kubernetes settings in place: ``launcher`` alone decides."""
    local = build(launcher="local", kubernetes=SETTINGS)
    k8s = build(launcher="kubernetes", kubernetes=SETTINGS)
    assert local.kubernetes_job() is None
    assert k8s.kubernetes_job() == KubernetesJob(config=KubernetesConfig(**SETTINGS))
    assert str(k8s.job_dir(run_context())) == "/rover/jobs/k8s_params/manual__1/train"
    assert local.job_dir(run_context()) == default_jobs_root() / "k8s_params/manual__1/train"


def test_the_pods_must_see_the_job_dir_and_the_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked before anything is created: a path on no mounted volume fails without retries."""
    training = "airflow_rover.operators.training"  # the paths are the pods', not this machine's
    monkeypatch.setattr(f"{training}.check_data", lambda spec: None)
    monkeypatch.setattr(f"{training}.training_fingerprint", lambda spec: "0" * 32)
    monkeypatch.setattr(f"{training}.check_model", lambda spec, features: None)
    launched: list[Any] = []
    monkeypatch.setattr(
        "airflow_rover.hooks.elastic_job.ElasticJobHook.launch",
        lambda hook, spec, env=None: launched.append(spec),
    )
    context: Any = {
        **run_context(),
        "ti": SimpleNamespace(**vars(run_context()["ti"]), xcom_push=lambda **_: None),
    }
    operator = build(launcher="kubernetes", kubernetes=SETTINGS, train_data="/home/me/clicks")
    with pytest.raises(AirflowFailException) as info:
        operator.submit_job(context)
    assert "train_data='/home/me/clicks' is not under a volume" in str(info.value)
    assert not launched
    extra = {
        **SETTINGS,
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "clicks"}}],
        "volume_mounts": [{"name": "data", "mountPath": "/home/me"}],
    }
    job_dir = build(
        launcher="kubernetes", kubernetes=extra, train_data="/home/me/clicks"
    ).submit_job(context)
    assert job_dir == "/rover/jobs/k8s_params/manual__1/train" and len(launched) == 1


# -- pod statuses ----------------------------------------------------------------------------
def pod(phase: str, state: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    statuses = [{"name": "ps", "state": state}] if state is not None else []
    return {
        "metadata": {"name": "rover-j-ps-0"},
        "status": {"phase": phase, "containerStatuses": statuses, **status},
    }


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (pod("Pending"), None),
        (pod("Pending", {"waiting": {"reason": "ContainerCreating"}}), None),
        (pod("Pending", {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}), 1),
        (pod("Running", {"running": {}}), None),
        (pod("Succeeded", {"terminated": {"exitCode": 0}}), 0),
        (pod("Failed", {"terminated": {"exitCode": 75, "reason": "Error"}}), 75),
        (pod("Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}), 137),
        (pod("Failed", reason="Evicted", message="low on memory"), 137),
        (pod("Unknown"), None),
    ],
)
def test_pod_status_to_exit_code(status: dict[str, Any], code: int | None) -> None:
    assert exit_code(status) == code


def test_failure_notes_say_why() -> None:
    oom = pod("Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
    assert (
        failure_note(oom, 137) == "pod rover-j-ps-0, phase Failed, reason OOMKilled, exit code 137"
    )
    evicted = failure_note(pod("Failed", reason="Evicted", message="low on memory"), 137)
    assert evicted.endswith("reason Evicted, exit code 137: low on memory")
    assert "not by the master" in failure_note(None, -9)


# -- the Airflow side's steps, against scripted answers ------------------------------------------
JOB = KubernetesJob(config=KubernetesConfig(**SETTINGS, namespace="ml"))
NAMES = m.JobNames("daily.train-0123456789", "ml")
SECRETS = m.JobSecrets("tok", b"-----BEGIN CERTIFICATE-----", b"-----BEGIN PRIVATE KEY-----")


def created(op: k8s_job.Op) -> Any:
    """A server where every create succeeds (a new uid for a pod) and nothing else exists."""
    if op.verb != "create" or op.body is None:
        return None
    body = copy.deepcopy(op.body)
    body["metadata"].setdefault("uid", "uid-new")
    return body


def drive(
    steps: k8s_job.Steps[Any], respond: Callable[[k8s_job.Op], Any] | dict[Any, Any] = created
) -> tuple[Any, list[str]]:
    """Run ``steps`` with scripted answers; returns their result and the calls made."""
    if isinstance(respond, dict):
        table = respond
        respond = lambda op: table.get((op.verb, op.plural, op.name))  # noqa: E731
    calls: list[str] = []
    answer: Any = None
    while True:
        try:
            op = steps.send(answer)
        except StopIteration as done:
            return done.value, calls
        calls.append(f"{op.verb} {op.plural}/{op.name}")
        answer = respond(op)


def test_launch_creates_the_master_pod_then_what_it_owns() -> None:
    uid, calls = drive(k8s_job.launch_steps(JOB, NAMES, PurePosixPath("/rover/j"), SECRETS))
    assert uid == "uid-new"
    assert calls == [
        f"create pods/{NAMES.master_pod}",
        f"create secrets/{NAMES.secret}",
        f"create services/{NAMES.master_service}",
        f"create services/{NAMES.ps_service}",
        f"create services/{NAMES.data_service}",
        f"create networkpolicies/{NAMES.network_policy}",
    ]


def test_launch_again_keeps_what_exists_and_replaces_a_stale_leftover() -> None:
    """A second launch (a lost reply, a retry) creates nothing twice: the existing master pod
    is used, its Services kept, and a Secret left by an earlier master pod replaced."""
    mine = {"metadata": {"ownerReferences": [{"kind": "Pod", "uid": "uid-now"}]}}
    stale = {"metadata": {"ownerReferences": [{"kind": "Pod", "uid": "uid-old"}]}}
    answers: dict[tuple[str, str, str], Any] = {
        ("create", "pods", NAMES.master_pod): None,  # 409: it exists
        ("read", "pods", NAMES.master_pod): {"metadata": {"uid": "uid-now"}},
        ("create", "secrets", NAMES.secret): None,
        ("read", "secrets", NAMES.secret): stale,
        ("create", "services", NAMES.master_service): None,
        ("read", "services", NAMES.master_service): mine,
        ("create", "services", NAMES.ps_service): None,
        ("create", "services", NAMES.data_service): None,
        ("read", "services", NAMES.ps_service): mine,
        ("read", "services", NAMES.data_service): mine,
        ("create", "networkpolicies", NAMES.network_policy): None,
        ("read", "networkpolicies", NAMES.network_policy): mine,
    }

    def respond(op: k8s_job.Op) -> Any:
        if op.verb == "delete":  # the stale Secret is gone: creating it works now
            answers[("create", "secrets", NAMES.secret)] = {"metadata": {}}
        return answers.get((op.verb, op.plural, op.name))

    uid, calls = drive(
        k8s_job.launch_steps(JOB, NAMES, PurePosixPath("/rover/j"), SECRETS), respond
    )
    assert uid == "uid-now"
    assert calls == [
        f"create pods/{NAMES.master_pod}",
        f"read pods/{NAMES.master_pod}",
        f"create secrets/{NAMES.secret}",
        f"read secrets/{NAMES.secret}",
        f"delete secrets/{NAMES.secret}",
        f"create secrets/{NAMES.secret}",
        f"create services/{NAMES.master_service}",
        f"read services/{NAMES.master_service}",
        f"create services/{NAMES.ps_service}",
        f"read services/{NAMES.ps_service}",
        f"create services/{NAMES.data_service}",
        f"read services/{NAMES.data_service}",
        f"create networkpolicies/{NAMES.network_policy}",
        f"read networkpolicies/{NAMES.network_policy}",
    ]


def test_ensure_only_reads_when_everything_is_there() -> None:
    owned = {"metadata": {"ownerReferences": [{"kind": "Pod", "uid": "u1"}]}}
    answers = {
        ("read", "pods", NAMES.master_pod): {
            "metadata": {"uid": "u1"},
            "status": {"phase": "Running"},
        },
        ("read", "secrets", NAMES.secret): owned,
        ("read", "services", NAMES.master_service): owned,
        ("read", "services", NAMES.ps_service): owned,
        ("read", "services", NAMES.data_service): owned,
        ("read", "networkpolicies", NAMES.network_policy): owned,
    }
    alive, calls = drive(k8s_job.ensure_steps(JOB, NAMES, SECRETS), answers)
    assert alive and all(c.startswith("read ") for c in calls) and len(calls) == 6
    del answers[("read", "services", NAMES.ps_service)]
    _, calls = drive(k8s_job.ensure_steps(JOB, NAMES, SECRETS), answers)
    assert calls[-4:] == [
        f"read services/{NAMES.ps_service}",
        f"create services/{NAMES.ps_service}",
        f"read services/{NAMES.data_service}",
        f"read networkpolicies/{NAMES.network_policy}",
    ]


def test_ensure_leaves_an_ended_master_pod_alone() -> None:
    done = {"metadata": {"uid": "u1"}, "status": {"phase": "Succeeded"}}
    alive, calls = drive(
        k8s_job.ensure_steps(JOB, NAMES, SECRETS), {("read", "pods", NAMES.master_pod): done}
    )
    assert not alive and calls == [f"read pods/{NAMES.master_pod}"]


def test_cleanup_deletes_the_master_pod_and_what_it_owns() -> None:
    tail, calls = drive(k8s_job.cleanup_steps(NAMES), {("log", "pods", NAMES.master_pod): "bye\n"})
    assert tail == "bye\n"
    assert calls == [
        f"log pods/{NAMES.master_pod}",
        f"delete pods/{NAMES.master_pod}",
        f"delete secrets/{NAMES.secret}",
        f"delete services/{NAMES.master_service}",
        f"delete services/{NAMES.ps_service}",
        f"delete services/{NAMES.data_service}",
        f"delete networkpolicies/{NAMES.network_policy}",
    ]


def test_a_forbidden_call_names_the_rbac_rules() -> None:
    from kubernetes.client.rest import ApiException

    class Api:
        def read_namespaced_pod(self, name: str, namespace: str) -> Any:
            raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(k8s_job.KubernetesPermissionError, match=r"rbac-airflow\.yaml"):
        k8s_job.run_sync(k8s_job.master_pod_steps(NAMES), Api(), "ml")


def test_a_job_dir_says_where_it_runs(tmp_path: Path) -> None:
    from airflow_rover.core.job_dir import JobDir
    from airflow_rover.hooks.elastic_job import ElasticJobHook

    assert not isinstance(ElasticJobHook(tmp_path).backend, KubernetesBackend)
    JOB.write(JobDir(tmp_path))
    hook = ElasticJobHook(tmp_path)
    assert isinstance(hook.backend, KubernetesBackend) and hook.backend.job == JOB
    assert KubernetesJob.read(JobDir(tmp_path)) == JOB


# -- the master in its pod -------------------------------------------------------------------
def test_the_master_in_its_pod_builds_its_node_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In-cluster credentials, its own pod (name, uid from the downward API) as the owner of
    the node pods, the keeper's restart count as the incarnation; a wrong pod is refused."""
    from airflow_rover.core.job_dir import JobDir
    from airflow_rover.core.spec import JobSpec
    from airflow_rover.launchers.kubernetes.backend import kubernetes_node_launcher
    from airflow_rover.launchers.kubernetes.nodes import KubernetesNodeLauncher

    layout = JobDir(tmp_path)
    layout.write_spec(JobSpec(job_id=NAMES.job_id, train_data="/rover/data"))
    loaded: list[bool] = []
    monkeypatch.setattr("kubernetes.config.load_incluster_config", lambda: loaded.append(True))
    with pytest.raises(SystemExit, match=r"has no kubernetes\.json"):
        kubernetes_node_launcher(layout, 0)
    JOB.write(layout)
    monkeypatch.setenv("ROVER_POD_UID", "uid-master")
    monkeypatch.setenv("ROVER_NAMESPACE", "ml")
    with pytest.raises(SystemExit, match=r"lacks \['ROVER_POD_NAME'\]"):
        kubernetes_node_launcher(layout, 0)
    monkeypatch.setenv("ROVER_POD_NAME", "someone-else")
    with pytest.raises(SystemExit, match="is not " + NAMES.master_pod):
        kubernetes_node_launcher(layout, 0)
    monkeypatch.setenv("ROVER_POD_NAME", NAMES.master_pod)
    launcher = kubernetes_node_launcher(layout, 2)
    assert isinstance(launcher, KubernetesNodeLauncher) and loaded
    assert (launcher.master_uid, launcher.incarnation, launcher.names) == ("uid-master", 2, NAMES)
    assert launcher.capacity_cpu is None  # plans are bounded by autoscale.cpu_budget


def test_a_master_pod_that_cannot_start_is_a_dead_master(tmp_path: Path) -> None:
    """A master pod stuck on its image is not waited for until ``max_runtime``: the job is
    dead, and the master's log says why (once, however often the status is asked)."""
    from airflow_rover.core.job_dir import JobDir

    layout = JobDir(tmp_path)
    judge = KubernetesBackend._judge
    pending = {"metadata": {"name": NAMES.master_pod}, "status": {"phase": "Pending"}}
    assert judge(layout, pending) and not judge(layout, None)
    stuck = pod("Pending", {"waiting": {"reason": "ImagePullBackOff", "message": "no such tag"}})
    assert not judge(layout, stuck) and not judge(layout, stuck)
    lines = layout.log_file("master").read_text().splitlines()
    assert lines == [
        "[master pod: pod rover-j-ps-0, phase Pending, reason ImagePullBackOff, exit code 1: "
        "no such tag]"
    ]
    deleting = {
        "metadata": {"name": "m", "deletionTimestamp": "now"},
        "status": {"phase": "Running"},
    }
    assert not judge(layout, deleting)
