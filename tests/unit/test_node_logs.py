"""``NodeLogStream`` on real files in a real job directory: appends, unfinished lines, logs
that shrink or are replaced, new nodes, the bounds on lines and bytes, and the lines it never
passes on (the HTTP client's requests, TensorFlow's notes, anything holding the job's token)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_rover.core.job_dir import JobDir
from airflow_rover.hooks.node_logs import (
    CUT_MARK,
    SUMMARY,
    NodeLogStream,
    StreamLimits,
    fair_shares,
)

HTTP_LINE = (
    "2026-11-26 14:11:31,397 INFO httpx HTTP Request: POST http://127.0.0.1:38601/api/v1/"
    'shards/lease "HTTP/1.1 200 OK"\n'
)
TF_NOTES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1795702276.132606   31056 port.cc:153] oneDNN custom operations are on.\n"
)


@pytest.fixture
def job(tmp_path: Path) -> JobDir:
    job = JobDir(tmp_path / "job")
    job.ensure_token()
    job.logs.mkdir(parents=True)
    return job


def append(job: JobDir, node: str, text: str) -> None:
    with open(job.log_file(node), "a") as fh:
        fh.write(text)


def numbered(prefix: str, first: int, last: int) -> str:
    return "".join(f"{prefix} line {i}\n" for i in range(first, last))


def test_each_poll_passes_on_only_the_new_lines_prefixed_by_node(job: JobDir) -> None:
    stream = NodeLogStream(job)
    append(job, "worker-0", "starting\nleased shard 0\n")
    append(job, "master", "listening on http://127.0.0.1:1\n")
    assert stream.poll() == [
        "[master] listening on http://127.0.0.1:1",
        "[worker-0] starting",
        "[worker-0] leased shard 0",
    ]
    assert stream.poll() == []
    append(job, "worker-0", "leased shard 1\n")
    assert stream.poll() == ["[worker-0] leased shard 1"]


def test_an_unfinished_line_waits_for_its_end(job: JobDir) -> None:
    stream = NodeLogStream(job)
    append(job, "ps-0", "serving rows\nrestor")
    assert stream.poll() == ["[ps-0] serving rows"]
    append(job, "ps-0", "ed checkpoint 3")
    assert stream.poll() == []
    append(job, "ps-0", " in 0.2 s\n")
    assert stream.poll() == ["[ps-0] restored checkpoint 3 in 0.2 s"]


def test_new_nodes_appear_master_first_then_in_natural_order(job: JobDir) -> None:
    stream = NodeLogStream(job)
    append(job, "worker-0", "w0\n")
    assert stream.poll() == ["[worker-0] w0"]
    for node in ("worker-10", "worker-2", "master", "evaluator"):
        append(job, node, f"{node} says hello\n")
    (job.logs / "notes.txt").write_text("not a node's log\n")
    assert [line.split("]")[0] + "]" for line in stream.poll()] == [
        "[master]",
        "[evaluator]",
        "[worker-2]",
        "[worker-10]",
    ]


def test_a_log_that_shrank_is_read_again_from_its_start(job: JobDir) -> None:
    stream = NodeLogStream(job)
    append(job, "worker-1", numbered("old", 0, 3))
    assert len(stream.poll()) == 3
    job.log_file("worker-1").write_text("relaunched\n")  # same file, truncated and rewritten
    lines = stream.poll()
    assert lines[0].startswith("[worker-1] (its log shrank from ")
    assert "reading it from the start" in lines[0]
    assert lines[1:] == ["[worker-1] relaunched"]


def test_a_replaced_log_is_read_from_its_start(job: JobDir) -> None:
    """A relaunched node that writes a new file in its place (another inode): all of the new
    file is shown, even where it is longer than the offset reached in the old one."""
    stream = NodeLogStream(job)
    append(job, "worker-1", "first life\n")
    assert stream.poll() == ["[worker-1] first life"]
    fresh = job.logs / "fresh.tmp"
    fresh.write_text("second life, a longer first line than before\n")
    os.replace(fresh, job.log_file("worker-1"))
    assert stream.poll() == [
        "[worker-1] (its log was replaced: reading the new one from its start)",
        "[worker-1] second life, a longer first line than before",
    ]


def test_a_node_gets_at_most_its_lines_per_poll_the_newest(job: JobDir) -> None:
    stream = NodeLogStream(job, StreamLimits(lines_per_node=5))
    append(job, "worker-0", numbered("w0", 0, 12))
    append(job, "ps-0", numbered("ps", 0, 2))
    lines = stream.poll()
    assert lines[0].startswith(f"{SUMMARY} skipped 7 line(s) of worker-0 ")
    assert f"the whole logs are in {job.logs}" in lines[0]
    assert lines[1:] == [
        "[ps-0] ps line 0",
        "[ps-0] ps line 1",
        *(f"[worker-0] w0 line {i}" for i in range(7, 12)),
    ]
    assert stream.poll() == []  # skipped lines are not owed later


def test_a_poll_shares_its_lines_fairly_between_the_nodes(job: JobDir) -> None:
    stream = NodeLogStream(job, StreamLimits(lines_per_node=10, lines_per_poll=12))
    append(job, "master", numbered("m", 0, 2))
    for node in ("worker-0", "worker-1"):
        append(job, node, numbered(node, 0, 10))
    lines = stream.poll()
    shown = [line for line in lines if not line.startswith(SUMMARY)]
    assert len(shown) == 12
    assert sum(line.startswith("[master]") for line in shown) == 2
    assert sum(line.startswith("[worker-0]") for line in shown) == 5
    assert sum(line.startswith("[worker-1]") for line in shown) == 5
    assert "5 line(s) of worker-0, 5 line(s) of worker-1" in lines[0]


@pytest.mark.parametrize(
    ("wanted", "total", "shares"),
    [
        ({"a": 3, "b": 3}, 10, {"a": 3, "b": 3}),
        ({"a": 1, "b": 9, "c": 9}, 9, {"a": 1, "b": 4, "c": 4}),
        ({"a": 5, "b": 5, "c": 5}, 2, {"a": 0, "b": 1, "c": 1}),
        ({}, 5, {}),
    ],
)
def test_fair_shares(wanted: dict[str, int], total: int, shares: dict[str, int]) -> None:
    assert fair_shares(wanted, total) == shares
    assert sum(fair_shares(wanted, total).values()) <= total


def test_a_poll_reads_at_most_its_bytes_per_file_starting_at_a_line(job: JobDir) -> None:
    """A long backlog (a stream created while the job has run for long, after a triggerer
    restart): only the newest bytes are read, from the first whole line in them."""
    stream = NodeLogStream(job, StreamLimits(bytes_per_file=105, lines_per_node=50))
    append(job, "master", numbered("m", 0, 1000))  # ~12 KB
    size = job.log_file("master").stat().st_size
    lines = stream.poll()
    shown = lines[1:]
    assert shown and shown[-1] == "[master] m line 999"
    assert all(line.startswith("[master] m line ") for line in shown)  # no fragment
    assert sum(len(line) - len("[master] ") + 1 for line in shown) <= 105
    assert lines[0].startswith(f"{SUMMARY} skipped ")
    assert "KiB unread of master" in lines[0]
    print(f"{size} bytes in the log; {len(shown)} lines shown: {lines[0]}")
    append(job, "master", "after\n")
    assert stream.poll() == ["[master] after"]


def test_a_gap_that_ends_at_a_line_end_keeps_the_next_line(job: JobDir) -> None:
    stream = NodeLogStream(job, StreamLimits(bytes_per_file=10))
    append(job, "master", "0123456789abcdef\n" + "next line\n")  # the last 10 bytes: one line
    assert stream.poll()[1:] == ["[master] next line"]


def test_long_lines_are_cut_and_an_endless_one_does_not_grow_in_memory(job: JobDir) -> None:
    stream = NodeLogStream(job, StreamLimits(line_chars=50, bytes_per_file=4096))
    append(job, "worker-0", "x" * 80 + "\n")
    assert stream.poll() == [f"[worker-0] {'x' * 50}{CUT_MARK}"]
    for _ in range(20):  # 80 KB of one line, no newline yet: held no longer than a line
        append(job, "worker-0", "y" * 4096)
        for line in stream.poll():
            assert line == f"[worker-0] {'y' * 50}{CUT_MARK}"
    append(job, "worker-0", "yyy\nthe next line\n")
    assert stream.poll() == ["[worker-0] the next line"]


def test_http_request_lines_and_tensorflow_notes_are_left_out(job: JobDir) -> None:
    stream = NodeLogStream(job)
    append(job, "worker-0", TF_NOTES + HTTP_LINE + "\n" + "worker-0 done: 64 steps\n")
    assert stream.poll() == ["[worker-0] worker-0 done: 64 steps"]


def test_a_line_holding_the_jobs_token_is_withheld(job: JobDir) -> None:
    token = job.read_token()
    stream = NodeLogStream(job, StreamLimits(line_chars=40))
    append(job, "worker-0", f"before\nAuthorization: Bearer {token}\nafter\n")
    lines = stream.poll()
    assert lines == [
        "[worker-0] (a line holding the job's token was withheld)",
        "[worker-0] before",
        "[worker-0] after",
    ]
    # an unfinished line too long to wait for is cut at 40: a token straddling the cut is
    # seen too (the first 5 of its characters are before the cut)
    append(job, "worker-0", "z" * 35 + token + "q" * 10)
    assert stream.poll() == ["[worker-0] (a line holding the job's token was withheld)"]
    append(job, "worker-0", "q\nlater\n")
    assert stream.poll() == ["[worker-0] later"]


def test_a_log_removed_between_polls_is_forgotten(job: JobDir) -> None:
    stream = NodeLogStream(job)
    append(job, "worker-3", "w3\n")
    assert stream.poll() == ["[worker-3] w3"]
    job.log_file("worker-3").unlink()
    assert stream.poll() == []
    append(job, "worker-3", "again\n")
    assert stream.poll() == ["[worker-3] again"]


def test_no_logs_folder_yet_is_no_line(tmp_path: Path) -> None:
    assert NodeLogStream(JobDir(tmp_path / "not-yet")).poll() == []


def test_limits_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="lines_per_node must be >= 1"):
        StreamLimits(lines_per_node=0)
