"""Run a DAG's first task under Airflow's own task supervisor until it defers, then stop its job.

``dag.test()`` runs a task inside its own process, where nothing reads the task's stderr. Under
a scheduler the supervisor forks the task process and logs what it writes to descriptor 2 at
error level. This runs ``dag.test()`` with its task step replaced by that supervisor
(``supervise_task``, with the in-process execution API ``dag.test()`` itself uses), so the task
log (``--log``, the supervisor's JSON lines) is the one a real deployment writes.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any
from unittest import mock
from uuid import UUID

import pendulum


def supervised(log_path: Path, job_dir: Path) -> Any:
    def run_task(*, ti: Any, task: Any, run_triggerer: bool = False) -> None:
        from airflow.executors.workloads import BundleInfo
        from airflow.sdk.api.datamodels._generated import TaskInstance
        from airflow.sdk.execution_time.supervisor import InProcessTestSupervisor, supervise_task
        from airflow.utils.state import TaskInstanceState

        from airflow_rover.core.job_dir import JobDir
        from airflow_rover.hooks.elastic_job import ElasticJobHook

        ti.set_state(TaskInstanceState.QUEUED)  # what the execution API expects to start
        code = supervise_task(
            ti=TaskInstance(
                id=UUID(str(ti.id)),
                task_id=ti.task_id,
                dag_id=ti.dag_id,
                run_id=ti.run_id,
                try_number=ti.try_number,
                map_index=ti.map_index,
                dag_version_id=UUID(str(ti.dag_version_id)),
            ),
            bundle_info=BundleInfo(name="dags-folder"),
            dag_rel_path=Path(task.dag.fileloc).name,
            token="",
            client=InProcessTestSupervisor._api_client(task.dag),
            log_path=str(log_path),
        )
        print(f"supervised task exited with {code}", flush=True)
        if JobDir(job_dir).master_info():
            ElasticJobHook(str(job_dir)).stop("the task's log is all this run needs")
        os._exit(0)  # the DAG run stays deferred: nothing more to run here

    return run_task


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dag_id")
    parser.add_argument("logical_date")
    parser.add_argument("--conf", default="{}")
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args()
    conf = json.loads(args.conf)

    from airflow.cli.commands.dag_command import get_bagged_dag

    dag = get_bagged_dag(bundle_names=None, dag_id=args.dag_id)
    task_step = supervised(args.log, Path(conf["job_dir"]))
    with mock.patch("airflow.sdk.definitions.dag._run_task", task_step):
        dag.test(logical_date=pendulum.parse(args.logical_date), run_conf=conf)


if __name__ == "__main__":
    main()
