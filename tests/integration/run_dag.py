"""Run DAGs through Airflow's ``dag.test()`` and dump the outcome as JSON.

Executed in a subprocess by the integration tests, so each test gets its own AIRFLOW_HOME and
metadata DB (Airflow reads its configuration once, at import). ``--then`` runs more DAGs
after the first in the same process (Airflow and TensorFlow imported once); the outcome is
then a list, one per run, in order.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import pendulum


def run_one(dag_id: str, logical_date: str, conf: dict[str, Any]) -> dict[str, Any]:
    """``dag.test()`` of one DAG run: its state, run id, task states and times, XComs."""
    from airflow.cli.commands.dag_command import get_bagged_dag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    started = time.monotonic()
    dag = get_bagged_dag(bundle_names=None, dag_id=dag_id)
    run = dag.test(logical_date=pendulum.parse(logical_date), run_conf=conf)
    with create_session() as session:
        instances = run.get_task_instances(session=session)
        tis = {ti.task_id: (str(ti.state), ti.try_number) for ti in instances}
        times = {ti.task_id: (ti.start_date, ti.end_date, ti.duration) for ti in instances}
        xcoms = {
            f"{x.task_id}:{x.key}": XComModel.deserialize_value(x)
            for x in session.scalars(XComModel.get_many(run_id=run.run_id, dag_ids=dag_id))
        }
    return {
        "state": str(run.state),
        "run_id": run.run_id,
        "tasks": tis,
        "times": times,  # the last try's start, end and seconds, per task
        "xcom": xcoms,
        "seconds": round(time.monotonic() - started, 1),  # parse, run and read back
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dag_id")
    parser.add_argument("logical_date")
    parser.add_argument("--conf", default="{}")
    parser.add_argument(
        "--then",
        nargs=3,
        action="append",
        default=[],
        metavar=("DAG_ID", "LOGICAL_DATE", "CONF"),
        help="another run after the first, in the same process (repeatable)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    runs = [(args.dag_id, args.logical_date, args.conf), *args.then]
    outcomes = [run_one(dag_id, date, json.loads(conf)) for dag_id, date, conf in runs]
    result = outcomes if args.then else outcomes[0]
    args.out.write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
