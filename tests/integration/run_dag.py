"""Run one DAG through Airflow's ``dag.test()`` and dump the outcome as JSON.

Executed in a subprocess by the integration tests, so each test gets its own AIRFLOW_HOME and
metadata DB (Airflow reads its configuration once, at import).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pendulum


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dag_id")
    parser.add_argument("logical_date")
    parser.add_argument("--conf", default="{}")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from airflow.cli.commands.dag_command import get_bagged_dag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dag = get_bagged_dag(bundle_names=None, dag_id=args.dag_id)
    run = dag.test(logical_date=pendulum.parse(args.logical_date), run_conf=json.loads(args.conf))
    with create_session() as session:
        instances = run.get_task_instances(session=session)
        tis = {ti.task_id: (str(ti.state), ti.try_number) for ti in instances}
        times = {ti.task_id: (ti.start_date, ti.end_date, ti.duration) for ti in instances}
        xcoms = {
            f"{x.task_id}:{x.key}": XComModel.deserialize_value(x)
            for x in session.scalars(XComModel.get_many(run_id=run.run_id, dag_ids=args.dag_id))
        }
    args.out.write_text(
        json.dumps(
            {
                "state": str(run.state),
                "run_id": run.run_id,
                "tasks": tis,
                "times": times,  # the last try's start, end and seconds, per task
                "xcom": xcoms,
            },
            default=str,
        )
    )


if __name__ == "__main__":
    main()
