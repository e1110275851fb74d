"""The DAG of team_b's bundle: something an outsider to team_a may see."""

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG("rig_team_b", schedule=None, tags=["ui-rig"]):
    EmptyOperator(task_id="noop")
