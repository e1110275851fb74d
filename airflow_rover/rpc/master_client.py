"""The nodes' client of the master API (synchronous; the Airflow side has its own hook)."""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

from airflow_rover.core.job_tls import JobTLS
from airflow_rover.rpc import master_api
from airflow_rover.rpc.tls import http_verify

P = master_api.API_PREFIX


def quiet_request_logs() -> None:
    """A node's log is its own words: httpx logs every request at INFO (a heartbeat a second
    buried a dead node's last lines under request lines); only its warnings stay."""
    logging.getLogger("httpx").setLevel(logging.WARNING)


class MasterClient:
    """Calls the master with the job token; retries while the master is briefly unreachable."""

    def __init__(
        self, address: str, token: str, tls: JobTLS | None = None, retry_s: float = 30.0
    ) -> None:
        """``tls``: the job's certificate, the only one trusted at an ``https`` address."""
        self._http = httpx.Client(
            base_url=address,
            headers={"Authorization": f"Bearer {token}"},
            timeout=30.0,
            verify=http_verify(tls),
        )
        self._retry_s = retry_s

    def close(self) -> None:
        self._http.close()

    def _request(
        self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        deadline = time.monotonic() + self._retry_s
        while True:
            try:
                payload = body.model_dump() if body is not None else None
                reply = self._http.request(method, f"{P}{path}", json=payload, params=params)
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
                continue
            reply.raise_for_status()
            return reply.json()

    def cluster(self, wait_s: float = 120.0) -> master_api.ClusterInfo:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return master_api.ClusterInfo.model_validate(self._request("GET", "/cluster"))
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code != 409 or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def next_ps_set(self, after: int, wait_s: float) -> master_api.ClusterInfo:
        """The cluster once its PS set is past ``after``, or as it stands after ``wait_s``
        (the master holds the request meanwhile); 409 while the PS are not all up."""
        params = {"after": after, "wait_s": wait_s}
        return master_api.ClusterInfo.model_validate(
            self._request("GET", "/cluster", params=params)
        )

    def ready(
        self,
        node_id: str,
        address: str | None = None,
        initial_rows: master_api.InitialRows | None = None,
    ) -> None:
        body = master_api.NodeReady(address=address, initial_rows=initial_rows)
        self._request("POST", f"/nodes/{node_id}/ready", body)

    def report_crash(self, node_id: str, crash: master_api.NodeCrash, timeout_s: float) -> None:
        """Tell the master what this node dies of: one try, ``timeout_s`` at most (a node
        that cannot reach its master dies all the same)."""
        reply = self._http.post(
            f"{P}/nodes/{node_id}/crash", json=crash.model_dump(), timeout=timeout_s
        )
        reply.raise_for_status()

    def heartbeat(self, node_id: str, beat: master_api.Heartbeat) -> bool:
        return bool(self._request("POST", f"/nodes/{node_id}/heartbeat", beat)["stop"])

    def lease(self, node_id: str, ps_set_version: int | None = None) -> master_api.LeaseReply:
        body = master_api.LeaseRequest(node_id=node_id, ps_set_version=ps_set_version)
        return master_api.LeaseReply.model_validate(self._request("POST", "/shards/lease", body))

    def shard_done(self, node_id: str, shard_id: int) -> bool:
        body = master_api.ShardDone(node_id=node_id)
        reply = self._request("POST", f"/shards/{shard_id}/done", body)
        return bool(reply["accepted"])

    def release_shards(self, node_id: str) -> int:
        """Give back the shards this worker holds (it switched PS set mid-shard); the
        master resumes each from the PS ledgers. Returns how many there were."""
        return int(self._request("POST", f"/nodes/{node_id}/release")["released"])

    def claim_evaluation(self, node_id: str) -> bool:
        """Whether this worker, done training, scores the held-out split (the master picks
        the first to ask)."""
        return bool(self._request("POST", f"/nodes/{node_id}/evaluate")["evaluate"])

    def report_evaluation(self, report: master_api.EvalReport) -> None:
        self._request("POST", "/evaluation", report)

    def status(self) -> dict[str, Any]:
        return dict(self._request("GET", "/status"))
