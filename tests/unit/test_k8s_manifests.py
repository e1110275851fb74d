"""Every manifest the Kubernetes launcher builds validates against the Kubernetes 1.33 OpenAPI
schema (strict: no unknown field), for several plans and settings; so do the example manifests
in ``deploy/``. Pure builders: no network, no cluster."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from cryptography import x509

from airflow_rover.core.spec import DataWorkersConfig, ResourcePlan
from airflow_rover.launchers.kubernetes import manifests as m
from airflow_rover.launchers.kubernetes import rbac
from airflow_rover.launchers.kubernetes.config import KubernetesConfig, Toleration
from airflow_rover.master.node_launcher import Role
from airflow_rover.rpc.tls import make_certificate

REPO = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.33"
JOB_DIR = PurePosixPath("/rover/jobs/daily/run-1/train")
TOKEN = "s3cr3t-token-value-that-must-never-leak"
TLS_CERT, TLS_KEY = make_certificate(m.JobNames("x", "ns").tls_hosts())
SECRETS = m.JobSecrets(TOKEN, TLS_CERT, TLS_KEY)
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

MINIMAL = KubernetesConfig(
    image="registry.example.com/airflow-rover:0.1.0", job_volume_claim="jobs"
)
FULL = KubernetesConfig(
    namespace="ml-training",
    image="registry.example.com/airflow-rover@sha256:" + "a" * 64,
    image_pull_policy="Always",
    image_pull_secrets=("regcred",),
    job_volume_claim="rover-jobs",
    job_volume_mount_path="/mnt/rover",
    master_service_account="rover-master",
    master_cpu=0.5,
    master_memory_mb=768,
    node_selector={"node.kubernetes.io/instance-type": "c6i.4xlarge", "pool": "train"},
    tolerations=(
        Toleration(key="dedicated", operator="Equal", value="ml", effect="NoSchedule"),
        Toleration.model_validate(
            {"key": "spot", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}
        ),
    ),
    labels={"team": "ranking"},
    env={"AWS_REGION": "eu-west-1", "TF_NUM_INTEROP_THREADS": "1"},
    volumes=({"name": "data", "persistentVolumeClaim": {"claimName": "clicks", "readOnly": True}},),
    volume_mounts=({"name": "data", "mountPath": "/data", "readOnly": True},),
)
PLANS = {
    "cold-start": ResourcePlan(),
    "fractional": ResourcePlan(num_workers=3, num_ps=2, worker_cpu=0.5, ps_cpu=1.25),
    "big": ResourcePlan(
        num_workers=64,
        num_ps=16,
        worker_cpu=16,
        worker_memory_mb=65536,
        ps_cpu=32,
        ps_memory_mb=262144,
    ),
}
NAMES = m.JobNames("rover_daily_retrain.train-3f9c0a1b2c", "ml-training")
DATA_WORKERS = DataWorkersConfig(mode="fixed", count=2, cpu=1.5, memory_mb=3072)


def job_objects(cfg: KubernetesConfig, plan: ResourcePlan) -> list[dict[str, Any]]:
    """Everything one job creates: the master's objects, every node pod of ``plan`` and the
    data workers of ``DATA_WORKERS``."""
    names = m.JobNames(NAMES.job_id, cfg.namespace)
    objects = [m.master_pod(cfg, names, JOB_DIR)]
    objects += [obj for _, obj in m.master_dependents(cfg, names, SECRETS)]
    nodes: list[tuple[str, Role]] = [(f"ps-{i}", "ps") for i in range(plan.num_ps)]
    nodes += [(f"worker-{i}", "worker") for i in range(plan.num_workers)]
    nodes.append(("evaluator", "evaluator"))
    nodes += [(f"data-{i}", "data") for i in range(DATA_WORKERS.start)]
    for node_id, role in nodes:
        size = m.node_size(plan, role, DATA_WORKERS)
        objects.append(m.node_pod(cfg, names, node_id, role, JOB_DIR, size, "uid-master", 2))
    return objects


@pytest.mark.parametrize("plan", PLANS.values(), ids=PLANS.keys())
@pytest.mark.parametrize("cfg", [MINIMAL, FULL], ids=["minimal", "full"])
def test_every_manifest_validates_against_the_schema(
    cfg: KubernetesConfig, plan: ResourcePlan
) -> None:
    objects = job_objects(cfg, plan)
    assert len(objects) == 6 + plan.num_ps + plan.num_workers + 1 + DATA_WORKERS.start
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_validation_is_strict_enough_to_catch_a_wrong_field() -> None:
    """Guard against a vacuous check: a misspelt field and a wrong type are both rejected."""
    pod = job_objects(MINIMAL, ResourcePlan())[0]
    misspelt = json.loads(json.dumps(pod))
    misspelt["spec"]["containers"][0]["resource"] = misspelt["spec"]["containers"][0].pop(
        "resources"
    )
    wrong_type = json.loads(json.dumps(pod))
    wrong_type["spec"]["containers"][0]["ports"][0]["containerPort"] = "eighty"
    for bad in (misspelt, wrong_type):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_the_example_manifests_validate_and_match_the_builders() -> None:
    """``deploy/*.yaml`` are valid and say exactly what ``rbac.py`` grants (no drift)."""
    docs = {
        path.name: list(yaml.safe_load_all(path.read_text()))
        for path in sorted((REPO / "deploy").glob("*.yaml"))
    }
    assert {"rbac-master.yaml", "rbac-airflow.yaml", "job-volume.yaml"} <= set(docs)
    for objects in docs.values():
        for obj in objects:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert docs["rbac-master.yaml"] == rbac.master_rbac("airflow-rover")
    accounts = [("airflow", "airflow-worker"), ("airflow", "airflow-triggerer")]
    assert docs["rbac-airflow.yaml"] == rbac.airflow_rbac("airflow-rover", accounts)
    assert docs["job-volume.yaml"][0]["spec"]["accessModes"] == ["ReadWriteMany"]


def test_roles_grant_only_what_each_side_uses() -> None:
    master = {r["resources"][0]: r["verbs"] for r in rbac.MASTER_RULES}
    assert master == {
        "pods": ["get", "list", "create", "delete"],
        "pods/log": ["get"],
        "pods/resize": ["patch"],
    }
    granted = {
        (res, verb) for r in rbac.AIRFLOW_RULES for res in r["resources"] for verb in r["verbs"]
    }
    assert ("secrets", "list") not in granted and ("pods", "list") not in granted
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in rbac.AIRFLOW_RULES)


@pytest.mark.parametrize(
    "job_id",
    [
        "short",
        "rover_daily_retrain.train-3f9c0a1b2c",
        "9starts-with-a-digit",
        "a" * 48 + "-" + "f" * 10,
        "x" * 200,
    ],
)
def test_names_are_dns_labels_for_any_job_id(job_id: str) -> None:
    names = m.JobNames(job_id, "default")
    longest = [names.node_pod("worker-1023"), names.node_pod("data-63"), names.master_pod]
    services = [names.ps_service, names.data_service, names.master_service]
    for name in [*longest, *services, names.secret, names.node_pod("evaluator")]:
        assert DNS_LABEL.match(name) and len(name) <= 63, name
    assert len(names.slug) <= m.MAX_SLUG
    assert names == m.JobNames(job_id, "default")  # deterministic
    assert m.job_slug(job_id) != m.job_slug(job_id + "x")


def test_ids_that_clean_up_alike_still_get_different_names() -> None:
    assert m.job_slug("a.b-1") != m.job_slug("a-b-1")
    with pytest.raises(ValueError, match="ps-<n>, worker-<n>, data-<n> or evaluator"):
        NAMES.node_pod("chief-0")


def test_the_token_is_in_the_secret_only() -> None:
    objects = job_objects(FULL, PLANS["fractional"])
    secret = next(o for o in objects if o["kind"] == "Secret")
    assert base64.b64decode(secret["data"][m.TOKEN_KEY]).decode() == TOKEN
    others = json.dumps([o for o in objects if o["kind"] != "Secret"])
    assert TOKEN not in others and base64.b64encode(TOKEN.encode()).decode() not in others
    for pod in (o for o in objects if o["kind"] == "Pod"):
        container = pod["spec"]["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        assert env["ROVER_TOKEN_FILE"]["value"] == m.TOKEN_PATH
        mounts = {v["name"]: v["mountPath"] for v in container["volumeMounts"]}
        assert mounts["token"] == m.TOKEN_DIR
        token_volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "token")
        assert token_volume["secret"]["secretName"] == NAMES.secret


def test_the_tls_key_goes_only_where_a_server_runs() -> None:
    """The Secret holds the certificate and key; the master, PS and data worker pods mount both
    and are told where, workers and the evaluator only the certificate; no manifest but the
    Secret carries either."""
    objects = job_objects(FULL, PLANS["fractional"])
    secret = next(o for o in objects if o["kind"] == "Secret")
    assert base64.b64decode(secret["data"][m.TLS_CERT_KEY]) == TLS_CERT
    assert base64.b64decode(secret["data"][m.TLS_KEY_KEY]) == TLS_KEY
    others = json.dumps([o for o in objects if o["kind"] != "Secret"])
    assert base64.b64encode(TLS_KEY).decode() not in others and "PRIVATE KEY" not in others
    for pod in (o for o in objects if o["kind"] == "Pod"):
        component = pod["metadata"]["labels"][m.LABEL_COMPONENT]
        serves = component in ("master", "ps", "data")
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "token")
        keys = [item["key"] for item in volume["secret"]["items"]]
        want = [m.TOKEN_KEY, m.TLS_CERT_KEY, *([m.TLS_KEY_KEY] if serves else [])]
        assert keys == want, component
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["ROVER_TLS_CERT_FILE"] == m.TLS_CERT_PATH
        assert env.get("ROVER_TLS_KEY_FILE") == (m.TLS_KEY_PATH if serves else None)


def test_the_certificate_names_the_master_every_ps_and_every_data_worker() -> None:
    """The addresses the job's processes and Airflow use are the certificate's names."""
    cert = x509.load_pem_x509_certificate(make_certificate(NAMES.tls_hosts())[0])
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = sans.get_values_for_type(x509.DNSName)
    assert urlsplit(NAMES.master_address(8080)).hostname in dns
    assert NAMES.master_address(8080).startswith("https://")
    ps_host = NAMES.ps_host("ps-15")
    assert "*." + ps_host.split(".", 1)[1] in dns
    data_host = NAMES.data_host("data-3")
    assert data_host == f"{NAMES.node_pod('data-3')}.{NAMES.data_service}.ml-training.svc"
    assert "*." + data_host.split(".", 1)[1] in dns and len(dns) == 3


@pytest.mark.parametrize("airflow_namespace", [None, "ml-training", "airflow"])
def test_the_network_policy_admits_the_job_s_pods_and_airflow_s_only(
    airflow_namespace: str | None,
) -> None:
    """Every pod of the job is selected; the job's pods may reach the master and PS ports, its
    worker pods (only) the data workers' port, pods labelled ``airflow-rover/client=true`` in
    Airflow's namespace the master's only."""
    cfg = FULL.model_copy(update={"airflow_namespace": airflow_namespace})
    objects = job_objects(cfg, PLANS["fractional"])
    policy = next(o for o in objects if o["kind"] == "NetworkPolicy")
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    assert policy["metadata"]["name"] == NAMES.network_policy
    spec = policy["spec"]
    job = {"matchLabels": {m.LABEL_JOB: NAMES.slug}}
    assert spec["podSelector"] == job and spec["policyTypes"] == ["Ingress"]
    pods = [o for o in objects if o["kind"] == "Pod"]
    assert all(p["metadata"]["labels"][m.LABEL_JOB] == NAMES.slug for p in pods)
    own, batches, airflow = spec["ingress"]
    assert own["from"] == [{"podSelector": job}]
    assert [p["port"] for p in own["ports"]] == [8080, 50051]
    trainers = {"matchLabels": {m.LABEL_JOB: NAMES.slug, m.LABEL_COMPONENT: "worker"}}
    assert batches == {
        "from": [{"podSelector": trainers}],
        "ports": [{"protocol": "TCP", "port": 7060}],
    }
    # The trainers' pods are the ones that rule selects: not the evaluator, PS or data workers.
    selected = [
        p
        for p in pods
        if all(p["metadata"]["labels"].get(k) == v for k, v in trainers["matchLabels"].items())
    ]
    assert sorted(p["metadata"]["labels"][m.LABEL_NODE] for p in selected) == [
        f"worker-{i}" for i in range(PLANS["fractional"].num_workers)
    ]
    assert [p["port"] for p in airflow["ports"]] == [8080]
    peer = {"podSelector": {"matchLabels": {"airflow-rover/client": "true"}}}
    if airflow_namespace == "airflow":
        peer["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": "airflow"}}
    assert airflow["from"] == [peer]


def test_only_the_master_pod_has_a_service_account_token() -> None:
    master, *rest = [o for o in job_objects(FULL, PLANS["fractional"]) if o["kind"] == "Pod"]
    assert master["spec"]["automountServiceAccountToken"] is True
    assert master["spec"]["serviceAccountName"] == "rover-master"
    for pod in rest:
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert "serviceAccountName" not in pod["spec"]


def test_every_object_is_labelled_and_owned_by_the_master_pod() -> None:
    objects = job_objects(FULL, PLANS["fractional"])
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels[m.LABEL_JOB] == NAMES.slug and labels["team"] == "ranking"
        assert obj["metadata"]["annotations"][m.ANNOTATION_JOB_ID] == NAMES.job_id
    master, *dependents = objects
    assert "ownerReferences" not in master["metadata"]
    pods = [o for o in dependents if o["kind"] == "Pod"]
    assert all(m.owner_uid(p) == "uid-master" for p in pods)
    owned = [m.owned(o, NAMES.master_pod, "uid-1") for o in dependents if o["kind"] != "Pod"]
    assert [m.owner_uid(o) for o in owned] == ["uid-1"] * 5


def test_node_pods_get_the_plan_s_sizes_and_the_settings() -> None:
    plan = PLANS["fractional"]
    pods = {o["metadata"]["labels"].get(m.LABEL_NODE): o for o in job_objects(FULL, plan)}
    ps = pods["ps-1"]["spec"]
    container = ps["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "1250m", "memory": "2048Mi"}
    assert container["resources"]["limits"] == container["resources"]["requests"]
    assert {p["resourceName"] for p in container["resizePolicy"]} == {"cpu", "memory"}
    assert ps["hostname"] == NAMES.node_pod("ps-1") and ps["subdomain"] == NAMES.ps_service
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ROVER_ADVERTISE_HOST"] == NAMES.ps_host("ps-1")
    assert env["ROVER_MASTER_ADDR"] == "https://" + NAMES.master_service + ".ml-training.svc:8080"
    assert env["AWS_REGION"] == "eu-west-1" and env["ROVER_NODE_ID"] == "ps-1"
    worker = pods["worker-2"]["spec"]
    assert worker["containers"][0]["resources"]["requests"] == {"cpu": "500m", "memory": "2048Mi"}
    assert worker["containers"][0]["command"][-2:] == ["--role", "worker"]
    assert pods["evaluator"]["spec"]["containers"][0]["command"][-1] == "evaluator"
    for spec in (ps, worker):
        assert spec["nodeSelector"]["pool"] == "train"
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert spec["tolerations"][1]["tolerationSeconds"] == 60
        assert {"job", "token", "data"} <= {v["name"] for v in spec["volumes"]}
        assert spec["securityContext"]["runAsNonRoot"] is True
    assert pods["ps-0"]["metadata"]["labels"][m.LABEL_INCARNATION] == "2"


def test_a_data_worker_pod_serves_batches_at_a_stable_name_to_the_workers() -> None:
    """A data worker runs ``airflow_rover.dataworker --role data`` sized by the spec's
    ``data_workers`` (not the plan), listens on ``data_port`` on all interfaces, advertises its
    name under the headless data Service, and reads data as a worker does (same settings,
    volumes and environment); like every node pod it runs as non-root with nothing extra."""
    objects = job_objects(FULL, PLANS["fractional"])
    pods = {o["metadata"]["labels"].get(m.LABEL_NODE): o for o in objects if o["kind"] == "Pod"}
    data, worker = pods["data-1"], pods["worker-0"]
    assert data["metadata"]["labels"][m.LABEL_COMPONENT] == "data"
    spec, container = data["spec"], data["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "airflow_rover.dataworker", "--role", "data"]
    want = {"cpu": "1500m", "memory": "3072Mi"}
    assert container["resources"] == {"requests": want, "limits": want}
    assert container["ports"] == [{"name": "batches", "containerPort": 7060, "protocol": "TCP"}]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ROVER_DATA_PORT"] == "7060" and env["ROVER_BIND_HOST"] == "0.0.0.0"
    assert env["ROVER_ADVERTISE_HOST"] == NAMES.data_host("data-1")
    assert env["ROVER_NODE_ID"] == "data-1" and env["OMP_NUM_THREADS"] == "2"
    assert "ROVER_PS_PORT" not in env and "ROVER_FLASH_DIR" not in env
    assert spec["hostname"] == NAMES.node_pod("data-1") and spec["subdomain"] == NAMES.data_service
    # What a worker reads data with, a data worker gets too.
    worker_env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    assert env["AWS_REGION"] == worker_env["AWS_REGION"] == "eu-west-1"
    assert container["volumeMounts"] == worker["spec"]["containers"][0]["volumeMounts"]
    assert [v["name"] for v in spec["volumes"]] == ["job", "token", "data"]
    for key in ("nodeSelector", "tolerations", "imagePullSecrets", "securityContext"):
        assert spec[key] == worker["spec"][key], key
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
    }
    assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
    # Its Service names it in DNS at the port its container serves.
    service = next(o for o in objects if o["metadata"]["name"] == NAMES.data_service)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {m.LABEL_JOB: NAMES.slug, m.LABEL_COMPONENT: "data"}
    assert service["spec"]["ports"][0]["port"] == 7060
    assert service["spec"]["ports"][0]["targetPort"] == "batches"


def test_the_data_port_is_a_setting_and_a_data_worker_needs_its_size() -> None:
    cfg = MINIMAL.model_copy(update={"data_port": 9000})
    names = m.JobNames(NAMES.job_id, cfg.namespace)
    pod = m.node_pod(cfg, names, "data-0", "data", JOB_DIR, (1.0, 1024), "uid", 0)
    container = pod["spec"]["containers"][0]
    assert container["ports"][0]["containerPort"] == 9000
    assert {"name": "ROVER_DATA_PORT", "value": "9000"} in container["env"]
    policy = m.network_policy(cfg, names)
    assert policy["spec"]["ingress"][1]["ports"] == [{"protocol": "TCP", "port": 9000}]
    with pytest.raises(ValueError, match="data_workers"):
        m.node_size(ResourcePlan(), "data")
    assert m.node_size(ResourcePlan(), "data", DATA_WORKERS) == (1.5, 3072)
    assert m.node_size(ResourcePlan(), "worker", DATA_WORKERS) == (1.0, 2048)


@pytest.mark.parametrize(
    ("cores", "quantity"), [(1, "1"), (2.0, "2"), (0.5, "500m"), (1.25, "1250m"), (0.0001, "1m")]
)
def test_cpu_quantities(cores: float, quantity: str) -> None:
    assert m.cpu_quantity(cores) == quantity


def test_the_resize_patch_names_the_container_and_the_new_size() -> None:
    assert m.resize_patch("ps", (4.0, 8192)) == {
        "spec": {
            "containers": [
                {
                    "name": "ps",
                    "resources": {
                        "requests": {"cpu": "4", "memory": "8192Mi"},
                        "limits": {"cpu": "4", "memory": "8192Mi"},
                    },
                }
            ]
        }
    }
