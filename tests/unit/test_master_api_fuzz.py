"""The master API fuzzed from its own OpenAPI schema (schemathesis's strategies, on
hypothesis): for every route, requests that fit the schema and requests that break it
(negative mode: wrong types, missing or extra fields, bodies that are not JSON), with the job's
token, against one running job. Whatever comes, the answer is never a 5xx, and a 4xx changes
nothing. Bounded: a fixed number of examples per route, derandomized so that CI sees the same
ones; numbers that JSON or a float cannot carry (NaN, 1e400) are sent as raw text besides.
(Schemathesis's pytest plugin is not used: its ``parametrize`` fails on pytest 9.)"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from master_rig import AUTH, NUM_SHARDS, TOKEN, Job, new_job, observable, start_running
from schemathesis import GenerationMode

from airflow_rover.data.synthetic import GeneratedDataset
from airflow_rover.master.app import create_app
from airflow_rover.master.job import JobMaster

EXAMPLES_PER_ROUTE = 80
WAIT_CAP_S = 0.05  # GET /cluster may hold a request up to wait_s: not worth the suite's time

OPENAPI = create_app(cast(JobMaster, None), TOKEN).openapi()  # the schema needs no job
SCHEMA = schemathesis.openapi.from_dict(OPENAPI)
ROUTES = [(method.upper(), path) for path, item in OPENAPI["paths"].items() for method in item]
KNOWN = {  # ids the running job knows, so that requests reach its state and not only 404
    "node_id": ["ps-0", "worker-0", "worker-1", "evaluator-0"],
    "shard_id": list(range(NUM_SHARDS)),
    "plan_id": [1, 2],
}


def requests(method: str, path: str) -> st.SearchStrategy[schemathesis.Case | RawRequest]:
    """Cases for the route, valid and not, some with path parameters the job knows."""
    operation = SCHEMA[path][method]
    names = [p["name"] for p in OPENAPI["paths"][path][method.lower()].get("parameters", [])]
    known = [n for n in names if n in KNOWN]
    choices = [
        dict(zip(known, ids, strict=True)) for ids in itertools.product(*map(KNOWN.get, known))
    ]
    strategies = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        strategies.append(operation.as_strategy(mode))
        if known:
            strategies.append(
                st.sampled_from(choices).flatmap(
                    lambda ids, mode=mode: operation.as_strategy(mode, path_parameters=ids)
                )
            )
    valid = operation.as_strategy(GenerationMode.POSITIVE)
    nodes = st.sampled_from(KNOWN["node_id"])
    strategies.append(st.tuples(valid, nodes).map(_as_node))  # a body from a node the job knows
    if "requestBody" in OPENAPI["paths"][path][method.lower()]:
        strategies.append(st.tuples(valid, st.data()).map(_odd_number))
    return st.one_of(strategies)


# JSON numbers Python's parser takes but a float cannot hold, or that JSON does not have
ODD_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" + "0" * 400, "1e-400"]


def _odd_number(drawn: tuple[schemathesis.Case, st.DataObject]) -> RawRequest:
    """A valid body as raw JSON text with one field's value replaced by an odd number."""
    case, data = drawn
    body = case.body if isinstance(case.body, dict) and case.body else {"x": 0}
    field = data.draw(st.sampled_from(sorted(body)))
    text = json.dumps({**body, field: "@odd@"})
    odd = data.draw(st.sampled_from(ODD_NUMBERS))
    return RawRequest(case.method, case.formatted_path, text.replace('"@odd@"', odd))


@dataclass(frozen=True)
class RawRequest:
    """A request whose body is sent as written, not as schemathesis would serialize it."""

    method: str
    path: str
    body: str

    def as_curl_command(self) -> str:
        return f"curl -X {self.method} {self.path} -d '{self.body}'"


def _as_node(drawn: tuple[schemathesis.Case, str]) -> schemathesis.Case:
    case, node = drawn
    if isinstance(case.body, dict) and "node_id" in case.body:
        case.body = {**case.body, "node_id": node}
    return case


def _capped(case: schemathesis.Case | RawRequest) -> schemathesis.Case | RawRequest:
    """The case with ``wait_s`` kept short."""
    query = getattr(case, "query", None)
    if not isinstance(query, dict):
        return case
    wait = query.get("wait_s")
    if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > WAIT_CAP_S:
        query["wait_s"] = WAIT_CAP_S
    return case


@pytest.fixture(scope="module")
def fuzzed_job(
    dataset: GeneratedDataset, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Job]:
    """One running job for the module: hypothesis runs every example of a route in one test
    call, and the routes one after another, against the same job."""
    job = new_job(dataset, tmp_path_factory.mktemp("fuzz"), num_workers=2)
    start_running(job)
    job.lease("worker-0")  # a shard in flight, so that done/release have something to touch
    yield job
    job.api.close()


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_no_request_gets_a_5xx_and_a_refused_one_changes_nothing(
    fuzzed_job: Job, method: str, path: str
) -> None:
    @settings(
        max_examples=EXAMPLES_PER_ROUTE,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(requests(method, path).map(_capped))
    def check(case: schemathesis.Case | RawRequest) -> None:
        before = observable(fuzzed_job)
        if isinstance(case, RawRequest):
            headers = {**AUTH, "Content-Type": "application/json"}
            reply = fuzzed_job.api.request(
                case.method, case.path, content=case.body, headers=headers
            )
        else:
            reply = case.call(app=fuzzed_job.api.app, headers=AUTH)
        assert reply.status_code < 500, (case.as_curl_command(), reply.text)
        if 400 <= reply.status_code < 500:
            assert observable(fuzzed_job) == before, (case.as_curl_command(), reply.text)

    check()
