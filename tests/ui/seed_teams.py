"""Create teams and serialize every configured DAG bundle into the metadata DB, in one process
(``airflow teams create`` per team, then ``airflow dags reserialize``); print each DAG's team
as JSON on the last line.

Run in a subprocess with the test's AIRFLOW_HOME (Airflow reads its configuration at import).
Fails if a DAG file does not import, which reserialize alone would only record.
"""

from __future__ import annotations

import json
import sys


def main(teams: list[str]) -> None:
    from airflow.cli import cli_parser
    from airflow.models.dag import DagModel
    from airflow.models.errors import ParseImportError
    from airflow.utils.session import create_session
    from sqlalchemy import select

    parser = cli_parser.get_parser()
    for command in [["teams", "create", team] for team in teams] + [["dags", "reserialize"]]:
        args = parser.parse_args(command)
        args.func(args)
    with create_session() as session:
        errors = session.scalars(select(ParseImportError)).all()
        if errors:
            raise SystemExit(
                "DAG files failed to import:\n"
                + "\n".join(f"{e.filename}: {e.stacktrace}" for e in errors)
            )
        dag_ids = list(session.scalars(select(DagModel.dag_id)))
    teams_of = DagModel.get_dag_id_to_team_name_mapping(dag_ids)
    print(json.dumps({dag_id: teams_of.get(dag_id) for dag_id in dag_ids}))


if __name__ == "__main__":
    main(sys.argv[1:])
