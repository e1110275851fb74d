"""``ElasticJobHook`` and ``ElasticJobTrigger.on_kill`` driving REAL jobs: a master process that
starts real parameter-server and worker processes (TensorFlow) on a tiny synthetic dataset.

Every launched job is stopped in the fixture's teardown, and any process of the job still
alive after that (found by its job directory, even once orphaned) is killed, so a failing test
leaves nothing running.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from airflow_rover.core.spec import JobSpec, ResourcePlan, TrainingConfig
from airflow_rover.core.states import ACTIVE_STATES
from airflow_rover.data.synthetic import GeneratedDataset, SyntheticConfig, generate_dataset
from airflow_rover.hooks.elastic_job import UNREACHABLE, ElasticJobHook, JobLaunchError
from airflow_rover.launchers.local_processes import job_processes
from airflow_rover.triggers.elastic_job import ElasticJobTrigger

pytestmark = pytest.mark.slow

NUM_TRAIN = 4000
SHARD_SIZE = 1000
# Jobs that must still be running when the test stops them train many epochs.
LONG = {"epochs": 50}

# States a job passes through; 'unreachable' while the master's API is not serving yet.
PASSING = {*ACTIVE_STATES, UNREACHABLE}

Launch = Callable[..., ElasticJobHook]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> GeneratedDataset:
    config = SyntheticConfig(num_train=NUM_TRAIN, num_eval=1000, seed=0)
    return generate_dataset(tmp_path_factory.mktemp("data"), config)


@pytest.fixture
def launch(tmp_path: Path, dataset: GeneratedDataset) -> Iterator[Launch]:
    """Launch a job in its own directory; teardown stops it and kills whatever of it is left."""
    hooks: list[ElasticJobHook] = []

    def _launch(job_id: str, **training: Any) -> ElasticJobHook:
        hook = ElasticJobHook(tmp_path / job_id)
        hooks.append(hook)
        hook.launch(job_spec(dataset, job_id, **training))
        return hook

    yield _launch
    for hook in hooks:
        try:
            hook.stop("test cleanup")
        finally:
            for proc in still_alive(job_processes(hook.job_dir.root), timeout=3):
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()


# -- helpers ---------------------------------------------------------------------------------
def job_spec(dataset: GeneratedDataset, job_id: str, **training: Any) -> JobSpec:
    """One PS and one worker on the tiny dataset."""
    return JobSpec(
        job_id=job_id,
        train_data=str(dataset.train_dir),
        eval_data=str(dataset.eval_dir),
        plan=ResourcePlan(num_workers=1, num_ps=1),
        training=TrainingConfig(shard_size=SHARD_SIZE, **training),
    )


def master_process(hook: ElasticJobHook) -> psutil.Process:
    info = hook.job_dir.read_json(hook.job_dir.master_file)
    assert info is not None, "no master.json"
    return psutil.Process(info["pid"])


def process_tree(hook: ElasticJobHook) -> list[psutil.Process]:
    """The master and every process under it, as they are now."""
    try:
        master = master_process(hook)
        return [master, *master.children(recursive=True)]
    except (psutil.NoSuchProcess, AssertionError):
        return []


def still_alive(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``procs`` still running (zombies count as gone) after up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for proc in procs:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def master_log(hook: ElasticJobHook) -> str:
    path = hook.job_dir.log_file("master")
    return path.read_text()[-3000:] if path.exists() else "(no master log)"


def wait_for_state(hook: ElasticJobHook, states: set[str], timeout: float) -> dict[str, Any]:
    """Poll ``get_status`` until the job is in one of ``states``; fail with the master's log."""
    deadline = time.monotonic() + timeout
    status = hook.get_status()
    while status["state"] not in states:
        assert time.monotonic() < deadline, f"still {status['state']}:\n{master_log(hook)}"
        assert status["state"] in PASSING, f"{status}\n{master_log(hook)}"
        time.sleep(0.2)
        status = hook.get_status()
    return status


def running_tree(hook: ElasticJobHook) -> list[psutil.Process]:
    """Wait until the job runs and return [master, ps-0, worker-0] (in start order)."""
    wait_for_state(hook, {"running"}, timeout=60)
    tree = sorted(process_tree(hook), key=lambda proc: proc.create_time())
    roles = [proc.cmdline()[-1] for proc in tree[1:]]
    assert roles == ["ps", "worker"], f"expected ps-0 and worker-0 under the master: {tree}"
    return tree


def handles_sigterm(proc: psutil.Process) -> bool:
    """Whether ``proc`` has installed a SIGTERM handler (Linux: SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


def mirrored_state(hook: ElasticJobHook) -> dict[str, Any]:
    state = hook.job_dir.read_json(hook.job_dir.state_file)
    assert state is not None, "no state.json"
    return state


# -- tests -----------------------------------------------------------------------------------
def test_a_job_trains_to_success_with_every_shard_once(launch: Launch) -> None:
    """A real master trains 4 shards on a PS and a worker, evaluates, and succeeds."""
    hook = launch("hook-test")
    status = wait_for_state(hook, {"succeeded"}, timeout=120)
    result = status["result"]
    batches = result["accounting"].pop("batches")
    assert result["accounting"] == {
        "shards": 4,
        "done_once": 4,
        "done_more_than_once": 0,
        "never_done": 0,
        "requeued": 0,
        "quarantined": [],
    }
    assert batches["trained_once"] == batches["expected"] > 0
    assert batches["never_trained"] == batches["partially_trained"] == 0
    assert result["samples_trained"] == NUM_TRAIN
    assert result["eval_samples"] == 1000
    assert (Path(result["model_dir"]) / "ps-0.npz").is_file()
    assert mirrored_state(hook)["state"] == "succeeded"
    # The job's nodes are gone once it ended; only the master lingers to serve the result.
    master = master_process(hook)
    assert still_alive(master.children(recursive=True), timeout=15) == []


def test_stop_records_stopped_and_ends_the_master_and_ps(launch: Launch) -> None:
    """``hook.stop`` records 'stopped' and takes the master and the PS down at once."""
    hook = launch("hook-stop", **LONG)
    master, ps, _worker = running_tree(hook)
    hook.stop("stopped by the test")
    assert not hook.master_alive()
    assert still_alive([master, ps], timeout=5) == []
    state = mirrored_state(hook)
    assert (state["state"], state["message"]) == ("stopped", "stopped by the test")
    assert hook.get_status()["state"] == "stopped"


def test_stop_leaves_no_orphan_node(launch: Launch) -> None:
    """Stopped while its worker starts up, no process of the job outlives ``hook.stop``."""
    hook = launch("hook-orphan", **LONG)
    tree = running_tree(hook)
    worker = tree[-1]
    deadline = time.monotonic() + 10
    while worker.cpu_times().user < 0.5:  # let it get well into importing TensorFlow
        assert time.monotonic() < deadline, "the worker never started working"
        time.sleep(0.02)
    hook.stop("stopped by the test")
    assert still_alive(tree, timeout=2) == []


def test_a_terminated_master_records_the_job_as_stopped(launch: Launch) -> None:
    """SIGTERM to the master (the hook's fallback when the API does not answer) is a stop."""
    hook = launch("hook-sigterm", **LONG)
    master = running_tree(hook)[0]
    hook.stop_master_process()
    assert still_alive([master], timeout=5) == []
    state = mirrored_state(hook)
    assert (state["state"], state["message"]) == ("stopped", "master received a stop signal")


def test_trigger_on_kill_with_stop_on_kill_stops_the_job(launch: Launch) -> None:
    """The training trigger's on_kill (stop_on_kill=True) stops a running job like hook.stop."""
    hook = launch("hook-kill", **LONG)
    master, ps, _worker = running_tree(hook)
    asyncio.run(ElasticJobTrigger(str(hook.job_dir.root), stop_on_kill=True).on_kill())
    assert still_alive([master, ps], timeout=5) == []
    state = mirrored_state(hook)
    assert state["state"] == "stopped"
    assert state["message"] == "the Airflow task was killed by a user"


def test_trigger_on_kill_without_stop_on_kill_leaves_the_job_running(launch: Launch) -> None:
    """A sensor's trigger (stop_on_kill=False) leaves the job it watches running."""
    hook = launch("hook-keep", **LONG)
    tree = running_tree(hook)
    asyncio.run(ElasticJobTrigger(str(hook.job_dir.root), stop_on_kill=False).on_kill())
    time.sleep(0.5)
    assert still_alive(tree, timeout=0) == tree
    assert hook.get_status()["state"] == "running"


def test_stopping_a_job_whose_keeper_was_killed_stops_all_of_it(launch: Launch) -> None:
    """With its keeper SIGKILLed, the master trains on; stopping the job (the backend's stop,
    as when the API does not answer) still ends the master, the PS and the worker."""
    hook = launch("hook-keeperless", **LONG)
    tree = running_tree(hook)
    keeper = psutil.Process(hook.job_dir.master_info()["keeper_pid"])
    keeper.kill()
    assert still_alive([keeper], timeout=5) == []
    assert still_alive(tree, timeout=0) == tree and hook.master_alive()
    hook.stop_master_process()
    assert still_alive(tree, timeout=5) == []
    assert job_processes(hook.job_dir.root) == []
    state = mirrored_state(hook)
    assert (state["state"], state["message"]) == ("stopped", "master received a stop signal")


def test_a_second_master_for_a_running_job_is_refused(
    launch: Launch, dataset: GeneratedDataset
) -> None:
    """Launching a job that still runs is refused, with its keeper and after its keeper was
    killed (the master lives on): the running master stays the job's only one."""
    hook = launch("hook-twice", **LONG)
    tree = running_tree(hook)
    announced = hook.job_dir.master_info()
    spec = job_spec(dataset, "hook-twice", **LONG)
    with pytest.raises(JobLaunchError, match="still runs"):
        hook.launch(spec)
    psutil.Process(announced["keeper_pid"]).kill()
    with pytest.raises(JobLaunchError, match="still runs"):
        hook.launch(spec)
    assert hook.job_dir.master_info() == announced
    assert still_alive(tree, timeout=0) == tree
    assert hook.get_status()["state"] == "running"
    masters = [p for p in job_processes(hook.job_dir.root) if "--job-dir" in p.cmdline()]
    assert masters == [tree[0]]


def test_a_launch_while_another_is_under_way_is_refused(
    tmp_path: Path, dataset: GeneratedDataset
) -> None:
    """Two launches at once would each find no master and start one: the second is refused
    while the first holds the directory's launch lock, before it writes or starts anything."""
    hook = ElasticJobHook(tmp_path / "job")
    hook.job_dir.root.mkdir()
    try:
        with open(hook.job_dir.launch_lock_file, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with pytest.raises(JobLaunchError, match="under way"):
                hook.launch(job_spec(dataset, "hook-race"))
        assert not hook.job_dir.spec_file.exists()
        assert job_processes(hook.job_dir.root) == []
    finally:
        hook.stop_master_process()
