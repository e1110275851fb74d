"""A local node ends with the process that launched it, and launching one runs no at-fork
handler of the launcher (gRPC's could abort the child before its exec)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

# The middle process stands for the master: it starts the node with the launcher's
# environment, prints the node's pid, and waits to be killed.
MIDDLE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from airflow_rover.core.parent_death import parent_env
    node = subprocess.Popen(
        [sys.executable, "-c", sys.argv[1]], env={**os.environ, **parent_env()}
    )
    print(node.pid, flush=True)
    time.sleep(600)
    """
)
NODE = textwrap.dedent(
    """
    import time
    time.sleep({delay})
    from airflow_rover.core.parent_death import die_with_parent
    die_with_parent()
    open({ready!r}, "w").close()
    time.sleep(600)
    """
)


def _start(tmp_path: Path, delay: float) -> tuple[subprocess.Popen[str], psutil.Process, Path]:
    ready = tmp_path / "ready"
    node_code = NODE.format(delay=delay, ready=str(ready))
    middle = subprocess.Popen(
        [sys.executable, "-c", MIDDLE, node_code], stdout=subprocess.PIPE, text=True
    )
    assert middle.stdout is not None
    node = psutil.Process(int(middle.stdout.readline()))
    return middle, node, ready


def _gone(proc: psutil.Process, timeout: float) -> bool:
    try:
        proc.wait(timeout=timeout)
    except psutil.TimeoutExpired:
        proc.kill()
        return False
    return True


def test_a_node_dies_when_its_launcher_is_killed(tmp_path: Path) -> None:
    middle, node, ready = _start(tmp_path, delay=0.0)
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline, "the node never got ready"
        time.sleep(0.02)
    middle.kill()
    middle.wait()
    assert _gone(node, timeout=10), "the node outlived its launcher"


def test_a_node_whose_launcher_died_during_its_start_up_ends_too(tmp_path: Path) -> None:
    """The launcher gone before the node's ``prctl``: the kernel would never signal it."""
    middle, node, ready = _start(tmp_path, delay=1.0)
    middle.kill()
    middle.wait()
    assert _gone(node, timeout=30), "the node outlived its launcher"
    assert not ready.exists()


def test_a_process_not_started_by_a_launcher_is_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_rover.core.parent_death import ENV_PARENT_PID, die_with_parent

    monkeypatch.delenv(ENV_PARENT_PID, raising=False)
    die_with_parent()  # a pod's node: nothing to do, and this test process lives on


def test_starting_a_node_runs_no_at_fork_handler_of_the_launcher(tmp_path: Path) -> None:
    marker = tmp_path / "forked"
    script = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        from airflow_rover.launchers.local import _popen
        os.register_at_fork(after_in_child=lambda: open({str(marker)!r}, "w").close())
        proc = _popen([sys.executable, "-c", "pass"], Path({str(tmp_path / "node.log")!r}),
                      dict(os.environ))
        assert proc.wait(timeout=60) == 0
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    assert not marker.exists(), "an at-fork handler ran in the node's child"
