"""The job's TLS (``core.job_tls``, made at launch on Kubernetes): a PS and the master's API
started with the job's certificate serve TLS only, their clients (workers, other PS, the
master, Airflow's hook) trust that certificate and nothing else, and a resize hands rows over
it. Without a certificate (the local backend) everything stays plaintext on loopback."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from test_ps import ADAGRAD, DENSE_INIT, LAYOUT, SEED, TOKEN

from airflow_rover.core.job_dir import (
    ENV_JOB_DIR,
    ENV_MASTER_ADDR,
    ENV_NODE_ID,
    ENV_TOKEN_FILE,
    JobDir,
    NodeContext,
)
from airflow_rover.core.job_tls import ENV_TLS_CERT_FILE, ENV_TLS_KEY_FILE, JobTLS
from airflow_rover.hooks.elastic_job import ElasticJobHook
from airflow_rover.launchers.kubernetes.backend import KubernetesBackend
from airflow_rover.launchers.kubernetes.config import KubernetesConfig, KubernetesJob
from airflow_rover.ps.server import ParameterServer, start_server
from airflow_rover.rpc.master_api import API_PREFIX
from airflow_rover.rpc.master_client import MasterClient
from airflow_rover.rpc.ps_client import PSClient
from airflow_rover.rpc.tls import make_certificate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from lone_master import lone_master, small_job

HOSTS = ["localhost", "127.0.0.1"]


def write_pem(directory: Path, name: str, hosts: list[str]) -> JobTLS:
    cert, key = make_certificate(hosts)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.crt").write_bytes(cert)
    (directory / f"{name}.key").write_bytes(key)
    return JobTLS(directory / f"{name}.crt", directory / f"{name}.key")


@pytest.fixture(scope="module")
def job_tls(tmp_path_factory: pytest.TempPathFactory) -> JobTLS:
    """The job's certificate and key (a server's view)."""
    return write_pem(tmp_path_factory.mktemp("tls"), "job", HOSTS)


@pytest.fixture(scope="module")
def stranger(tmp_path_factory: pytest.TempPathFactory) -> JobTLS:
    """Another certificate for the same names: not the job's."""
    return write_pem(tmp_path_factory.mktemp("tls"), "other", HOSTS)


def trusting(tls: JobTLS) -> JobTLS:
    """What a client has: the certificate alone."""
    return JobTLS(tls.cert_file)


@pytest.fixture
def tls_ps(job_tls: JobTLS) -> Iterator[tuple[list[ParameterServer], list[str]]]:
    """Two PS serving TLS with the job's certificate (a 1-PS job that may grow to 2)."""
    servers, addresses, handles = [], [], []
    for i in range(2):
        ps = ParameterServer(i, 1, LAYOUT, ADAGRAD, SEED)
        handle, port = start_server(ps, TOKEN, threads=2, tls=job_tls)
        servers.append(ps)
        handles.append(handle)
        addresses.append(f"localhost:{port}")
    yield servers, addresses
    for handle in handles:
        handle.stop(None)


def test_a_ps_with_the_certificate_serves_tls_only(
    tls_ps: tuple[list[ParameterServer], list[str]], job_tls: JobTLS, stranger: JobTLS
) -> None:
    """A client trusting the job's certificate is served; a plaintext client and one that
    trusts another certificate are not (UNAVAILABLE: no connection), and create nothing."""
    (ps, _), (address, _) = tls_ps
    for tls in (None, trusting(stranger)):
        client = PSClient([address], TOKEN, timeout_s=10, tls=tls)
        with pytest.raises(grpc.RpcError) as err:
            client.pull({"dim4": np.arange(5, dtype=np.int64)})
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        client.close()
    assert ps.tables["dim4"].size == 0
    client = PSClient([address], TOKEN, timeout_s=10, tls=trusting(job_tls))
    rows, _ = client.pull({"dim4": np.arange(5, dtype=np.int64)})
    assert rows["dim4"].shape == (5, 4) and ps.tables["dim4"].size == 5
    moved = client.connected_to([address])  # a client made from it keeps trusting the job's
    assert moved.pull({"dim4": np.arange(3, dtype=np.int64)})[0]["dim4"].shape == (3, 4)
    moved.close()
    client.close()


def test_a_resize_hands_rows_over_tls(
    tls_ps: tuple[list[ParameterServer], list[str]], job_tls: JobTLS
) -> None:
    """From 1 PS to 2: the first PS's ``Absorb`` calls on the new one go over TLS."""
    servers, addresses = tls_ps
    one = PSClient(addresses[:1], TOKEN, timeout_s=10, tls=trusting(job_tls))
    one.init_dense(DENSE_INIT)
    one.pull({"dim4": np.arange(200, dtype=np.int64)})
    one.close()
    both = PSClient(addresses, TOKEN, timeout_s=10, tls=trusting(job_tls))
    moved = sum(int(r["moved_rows"][0]) for r in both.reshard(addresses))
    both.close()
    assert moved == servers[1].tables["dim4"].size > 0
    assert servers[0].tables["dim4"].size + moved == 200


def test_the_master_serves_https_with_the_job_s_certificate(
    tmp_path: Path, stranger: JobTLS
) -> None:
    """A master whose job has a certificate announces an ``https`` address and serves TLS
    only; its nodes (``MasterClient``) and Airflow's hook (the certificate from the job
    directory) reach it, a client trusting another certificate or speaking plaintext not."""
    job_dir = small_job(tmp_path)
    job_dir.write_tls(*make_certificate(HOSTS))
    tls = job_dir.tls()
    assert tls is not None
    with lone_master(job_dir, trusting(tls)) as master:
        assert master.address.startswith("https://127.0.0.1:")
        node = MasterClient(master.address, master.token, trusting(tls))
        assert node.status()["state"] == "pending"
        node.close()
        assert ElasticJobHook(job_dir.root).get_status()["state"] == "pending"
        wrong = MasterClient(master.address, master.token, trusting(stranger), retry_s=0)
        with pytest.raises(httpx.ConnectError):
            wrong.status()
        wrong.close()
        plaintext = master.address.replace("https://", "http://") + f"{API_PREFIX}/status"
        with pytest.raises(httpx.TransportError):
            httpx.get(plaintext, headers={"Authorization": f"Bearer {master.token}"})


def test_a_pod_s_processes_find_the_job_s_certificate_in_their_environment(
    tmp_path: Path, job_tls: JobTLS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the manifests set (``ROVER_TLS_CERT_FILE``, and ``ROVER_TLS_KEY_FILE`` where a
    server runs) is what a node's context and the master's endpoint use; nothing set, no TLS."""
    token = tmp_path / "token"
    token.write_text("tok")
    monkeypatch.setenv(ENV_JOB_DIR, str(tmp_path))
    monkeypatch.setenv(ENV_NODE_ID, "worker-0")
    monkeypatch.setenv(ENV_MASTER_ADDR, "https://master:8080")
    monkeypatch.setenv(ENV_TOKEN_FILE, str(token))
    assert NodeContext.from_env().tls is None
    monkeypatch.setenv(ENV_TLS_CERT_FILE, str(job_tls.cert_file))
    assert NodeContext.from_env().tls == JobTLS(job_tls.cert_file)
    monkeypatch.setenv(ENV_TLS_KEY_FILE, str(job_tls.key_file))
    backend = KubernetesBackend(
        KubernetesJob(config=KubernetesConfig(image="i", job_volume_claim="c"))
    )
    endpoint = backend.master_endpoint(JobDir(tmp_path), "127.0.0.1")
    assert endpoint.tls == job_tls and endpoint.token == "tok"
