"""The embedded default: the job's master and nodes are processes on this machine.

The master's keeper is started in its own session, so the job outlives the Airflow worker
process that launched it (the task defers and its process exits); the keeper relaunches a master
that dies. Nodes are the master's children and die with it (``parent_death``): a killed
master never leaves orphaned training processes, and its successor resumes from the last
checkpoint.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from airflow_rover.core.job_dir import (
    ENV_JOB_DIR,
    ENV_MASTER_ADDR,
    ENV_NODE_ID,
    ENV_TOKEN_FILE,
    STANDBY_PREFIX,
    JobDir,
)
from airflow_rover.core.job_status import resolve_status
from airflow_rover.core.parent_death import parent_env
from airflow_rover.core.spec import JobSpec
from airflow_rover.core.states import TERMINAL_STATES
from airflow_rover.data.sources import reads_s3
from airflow_rover.launchers.base import (
    KEEPER_MODULE,
    ROLE_MODULES,
    JobBackend,
    JobLaunchError,
    check_job_dir,
    write_job,
)
from airflow_rover.launchers.local_processes import (
    JobRole,
    job_process_roles,
    recorded_masters,
    stop_job,
)
from airflow_rover.launchers.memory_watch import MemoryWatch
from airflow_rover.launchers.process_identity import ProcessRecord
from airflow_rover.master.node_launcher import Capability, NodeLauncher, Role
from airflow_rover.master.serve import MasterEndpoint
from airflow_rover.rpc.master_api import API_PREFIX

log = logging.getLogger(__name__)
_MASTER_ONLY_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def _popen(
    cmd: list[str], log_file: Path, env: dict[str, str], **kwargs: Any
) -> subprocess.Popen[bytes]:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            close_fds=True,
            **kwargs,
        )


def notify_exit(proc: subprocess.Popen, exited: threading.Event) -> None:
    """Set ``exited`` when ``proc`` ends (run in a thread: the master wakes on it)."""
    proc.wait()
    exited.set()


class LocalNodeLauncher(NodeLauncher):
    """Runs a job's nodes as child processes of the master."""

    capabilities = frozenset({Capability.PROFILE, Capability.STANDBY})

    def __init__(
        self,
        job_dir: JobDir,
        master_addr: str,
        threads_per_node: int = 1,
        exited: threading.Event | None = None,
    ) -> None:
        """``exited``: set whenever a node process ends (the master wakes on it)."""
        self.exited = exited
        self.capacity_cpu = float(os.cpu_count() or 1)  # plans beyond it are not proposed
        self.shared_host_cores = float(len(os.sched_getaffinity(0)))  # every node is ours
        self.job_dir = job_dir
        self.master_addr = master_addr
        self.threads_per_node = threads_per_node
        self._procs: dict[str, subprocess.Popen] = {}
        self._standby: tuple[str, subprocess.Popen] | None = None  # a spare PS, not a node yet
        self._standbys = 0
        self._standby_failed = False
        # Every node is forked from this one thread, which lives as long as the launcher: the
        # API's pool threads retire when idle, and a PS a resize started from one was
        # SIGTERMed about 10 s later (its parent thread gone: ``parent_death``).
        self._forker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="node-forker")
        self.memory = MemoryWatch(job_dir, lambda: dict(self._procs))

    def node_env(self, node_id: str, reads_data: bool) -> dict[str, str]:
        """A node's environment; the S3 credentials only for one that reads data on S3."""
        env = self._env(node_id)
        if reads_data and reads_s3(self.job_dir.read_spec()):
            env.update({k: v for k, v in os.environ.items() if k.startswith(_MASTER_ONLY_ENV)})
        return env

    def _env(self, node_id: str) -> dict[str, str]:
        # The S3 credentials are the master's alone: nodes get them only to read data on S3
        # (the workers and the evaluator, ``_fork``), a PS never.
        env = {k: v for k, v in os.environ.items() if not k.startswith(_MASTER_ONLY_ENV)}
        env.update(
            {
                ENV_JOB_DIR: str(self.job_dir.root),
                ENV_NODE_ID: node_id,
                ENV_MASTER_ADDR: self.master_addr,
                ENV_TOKEN_FILE: str(self.job_dir.token_file),
                "TF_CPP_MIN_LOG_LEVEL": "2",
                "OMP_NUM_THREADS": str(self.threads_per_node),
                "PYTHONUNBUFFERED": "1",
                **parent_env(),  # the node dies with this process (``parent_death``)
            }
        )
        return env

    def start(self, node_id: str, role: Role) -> None:
        if node_id in self._procs and self._procs[node_id].poll() is None:
            return  # already running: starting twice is a no-op
        self.memory.forget(node_id)
        self._procs[node_id] = self._spawn(node_id, role)
        log.info("started %s (%s) pid=%d", node_id, role, self._procs[node_id].pid)
        self._watch(self._procs[node_id])
        self.memory.start()

    def _spawn(self, node_id: str, role: Role) -> subprocess.Popen:
        command = [sys.executable, "-m", ROLE_MODULES[role], "--role", role]
        return self._fork(command, node_id, reads_data=role != "ps")

    def _fork(self, cmd: list[str], node_id: str, reads_data: bool = False) -> subprocess.Popen:
        """Start a node's process on the launcher's own thread, whichever thread asks.
        ``reads_data``: a worker or the evaluator, which keeps the S3 credentials when the
        job's data is on S3 (``reads_s3``)."""
        log_file, env = self.job_dir.log_file(node_id), self.node_env(node_id, reads_data)
        return self._forker.submit(_popen, cmd, log_file, env).result()

    def _watch(self, proc: subprocess.Popen) -> None:
        if self.exited is not None:
            threading.Thread(target=notify_exit, args=(proc, self.exited), daemon=True).start()

    def start_standby(self) -> None:
        """A spare PS process (``ps-standby-<n>``): it imports what a PS needs and waits for
        ``take_standby`` to say which PS it is (``JobDir.standby_assignment``). A spare
        that died waiting is not replaced: the job goes on relaunching lost PS instead."""
        if self._standby is not None:
            standby_id, proc = self._standby
            if proc.poll() is None:
                return
            if not self._standby_failed:
                log.warning(
                    "%s (a spare PS) exited with code %s before it was needed; no more spares "
                    "(see its log)",
                    standby_id,
                    proc.returncode,
                )
            self._standby_failed = True
        if self._standby_failed:
            return
        self._standbys += 1
        standby_id = f"{STANDBY_PREFIX}{self._standbys}"
        self._standby = (standby_id, self._spawn(standby_id, "ps"))
        log.info("started %s (a spare PS) pid=%d", standby_id, self._standby[1].pid)

    def take_standby(self, node_id: str) -> bool:
        """The spare becomes ``node_id`` (started, as far as the master is concerned)."""
        if self._standby is None or self._standby[1].poll() is not None:
            return False
        standby_id, proc = self._standby
        self._standby = None
        assignment = self.job_dir.standby_assignment(standby_id)
        assignment.parent.mkdir(parents=True, exist_ok=True)
        staged = assignment.with_suffix(".tmp")
        staged.write_text(node_id)
        staged.replace(assignment)  # the spare sees all of it or nothing
        self._procs[node_id] = proc
        self._watch(proc)
        log.info("%s takes over as %s (pid %d)", standby_id, node_id, proc.pid)
        return True

    def exit_codes(self) -> dict[str, int | None]:
        return {node_id: proc.poll() for node_id, proc in self._procs.items()}

    def exit_reason(self, node_id: str) -> str | None:
        """``OOMKilled`` for a node the memory watch killed, else None."""
        return self.memory.killed.get(node_id)

    def pid(self, node_id: str) -> int | None:
        proc = self._procs.get(node_id)
        return proc.pid if proc else None

    def stop(self, node_id: str, grace_s: float = 5.0) -> None:
        proc = self._procs.get(node_id)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop_all(self, grace_s: float = 5.0) -> None:
        self.memory.stop()
        spare = [self._standby[1]] if self._standby is not None else []
        self._standby = None
        running = [p for p in [*self._procs.values(), *spare] if p.poll() is None]
        for proc in running:
            proc.terminate()
        deadline = time.monotonic() + grace_s
        for proc in running:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


MASTER_START_TIMEOUT_S = 60.0


class LocalBackend(JobBackend):
    """The embedded default: the master and its nodes are processes on this machine."""

    name = "local"

    @classmethod
    def with_settings(cls, settings: Any) -> LocalBackend:
        if settings is not None:
            raise ValueError(f"the local launcher takes no settings, got {settings!r}")
        return cls()

    def launch(self, job_dir: JobDir, spec: JobSpec, env: dict[str, str] | None = None) -> str:
        """Write the job's files and start a fresh master, with ``env`` added to its
        environment (secrets never go to the job's files); returns once the master listens.

        What is left of an earlier try whose job ended (its master serving the final status)
        is stopped first. A job still running in ``job_dir`` (its keeper or master is), and a
        launch while another is under way, are refused: two masters would train one job."""
        check_job_dir(job_dir, spec)  # another job's directory: nothing of it is touched
        with one_launch_at_a_time(job_dir):
            end_earlier_try(job_dir)
            write_job(job_dir, spec)
            keeper = self.launch_master(job_dir, env)
            try:
                wait_until_listening(job_dir, keeper)
            except JobLaunchError:
                stop_job(job_dir)
                raise
        return f"master pid {keeper.pid}"

    def stop_master(self, job_dir: JobDir) -> None:
        stop_job(job_dir)

    @staticmethod
    def launch_master(
        job_dir: JobDir, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start the master's keeper (which runs the master and relaunches it if it dies) in a
        session of its own."""
        env = {**os.environ, **(extra_env or {}), "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", KEEPER_MODULE, "--job-dir", str(job_dir.root)]
        return _popen(cmd, job_dir.log_file("master"), env, start_new_session=True)

    def job_alive(self, job_dir: JobDir) -> bool:
        """Whether the job's master, or its keeper about to relaunch it, is running."""
        return bool(recorded_masters(job_dir))

    def master_endpoint(self, job_dir: JobDir, host: str) -> MasterEndpoint:
        """Where the master listens; it announces its ``identity`` (start time, command line)
        beside its pid, so that only it is ever signalled as the job's master."""
        identity = ProcessRecord.current().to_json()
        return MasterEndpoint(
            host=host, token=job_dir.read_token(), announce={"identity": identity}
        )

    def node_launcher(
        self, job_dir: JobDir, master_address: str, restarts: int, exited: threading.Event
    ) -> NodeLauncher:
        threads = max(1, int(job_dir.read_spec().plan.worker_cpu))
        return LocalNodeLauncher(job_dir, master_address, threads, exited)


@contextlib.contextmanager
def one_launch_at_a_time(job_dir: JobDir) -> Iterator[None]:
    """Hold the job directory's launch lock (``flock``: released if the holder dies), or
    refuse: two launches at once would both find no master and start one each."""
    job_dir.root.mkdir(parents=True, exist_ok=True)
    with open(job_dir.launch_lock_file, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JobLaunchError(
                f"another launch of the job in {job_dir.root} is under way"
            ) from None
        yield


def end_earlier_try(job_dir: JobDir) -> None:
    """Stop what is left of an earlier try of the job (its master lingers after the job ended
    to serve the final status); refuse while the job has not ended and its keeper or master
    runs."""
    masters = [proc for proc, role in job_process_roles(job_dir.root) if role is not JobRole.NODE]
    state = (job_dir.read_json(job_dir.state_file) or {}).get("state")
    if masters and state not in TERMINAL_STATES:
        pids = ", ".join(str(proc.pid) for proc in masters)
        raise JobLaunchError(
            f"the job in {job_dir.root} still runs (state {state or 'unknown'}, keeper or "
            f"master pid {pids}): stop it before launching it again"
        )
    stop_job(job_dir)


def wait_until_listening(job_dir: JobDir, keeper: subprocess.Popen[bytes]) -> None:
    """Return once the master run by ``keeper`` announced itself; raise if it never does."""
    deadline = time.monotonic() + MASTER_START_TIMEOUT_S
    while job_dir.master_info().get("keeper_pid") != keeper.pid:
        if keeper.poll() is not None or time.monotonic() > deadline:
            raise JobLaunchError(
                f"job master (keeper pid {keeper.pid}) did not start; "
                f"see {job_dir.log_file('master')}"
            )
        time.sleep(0.1)


def local_job_status(job_dir: JobDir, timeout_s: float = 10.0) -> dict[str, Any]:
    """A local job's status: its master's answer, else what its files and process say."""
    info = job_dir.master_info()
    api_status = None
    if info.get("address"):
        try:
            reply = httpx.get(
                f"{info['address']}{API_PREFIX}/status",
                headers={"Authorization": f"Bearer {job_dir.read_token()}"},
                timeout=timeout_s,
            )
            reply.raise_for_status()
            api_status = reply.json()
        except httpx.HTTPError:
            api_status = None
    return resolve_status(job_dir, api_status, LocalBackend().job_alive(job_dir))
