"""A DAG of team_a's bundle for the UI rig's own tests (the product's tests pass their own)."""

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG("rig_team_a", schedule=None, tags=["ui-rig"]):
    EmptyOperator(task_id="noop")
