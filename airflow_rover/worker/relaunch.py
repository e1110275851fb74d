"""A lost PS: which errors mean one, and the wait for the master to announce its replacement."""

from __future__ import annotations

import threading
import time

import grpc
import httpx

from airflow_rover.rpc import master_api
from airflow_rover.rpc.master_client import MasterClient

PS_LOST_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
RELAUNCH_WAIT_S = 60.0  # how long a worker waits for a lost PS to be back before giving up
RELAUNCH_POLL_S = 0.05  # between requests the master did not hold (a local GET: cheap)
RELAUNCH_WAIT_REQUEST_S = 1.0  # how long the master holds one request for the new PS set


class PSLost(Exception):
    """A PS went away and did not come back within ``RELAUNCH_WAIT_S`` (or the job ended)."""


def wait_for_relaunch(
    master: MasterClient, ps_set_version: int, stop: threading.Event
) -> master_api.ClusterInfo:
    """The PS list once the master announces a PS set after version ``ps_set_version`` (the
    lost PS is back); the master holds each request until then (up to
    ``RELAUNCH_WAIT_REQUEST_S``)."""
    deadline = time.monotonic() + RELAUNCH_WAIT_S
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            cluster = master.next_ps_set(ps_set_version, RELAUNCH_WAIT_REQUEST_S)
        except httpx.HTTPStatusError:
            cluster = None  # the PS are not all up yet
        if cluster is not None and cluster.ps_set_version > ps_set_version:
            return cluster
        stop.wait(RELAUNCH_POLL_S)  # the master answered without waiting (or the wait ran out)
    raise PSLost("the master stopped the job" if stop.is_set() else "no relaunched PS in time")
