#!/usr/bin/env bash
# Set up and run the example daily-retraining DAG on the embedded (local-process) backend:
# a real Airflow metadata DB (SQLite), the training task really defers and its trigger polls.
#   bash scripts/demo.sh [LOGICAL_DATE]     (default: yesterday, UTC)
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$ROOT/.airflow-demo}"
export AIRFLOW__CORE__DAGS_FOLDER="$ROOT/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export ROVER_HOME="${ROVER_HOME:-$AIRFLOW_HOME/rover}"
DS="${1:-$(date -u -d yesterday +%F)}"
mkdir -p "$AIRFLOW_HOME"
LOG="$AIRFLOW_HOME/demo-$DS.log"
echo "preparing the Airflow metadata DB in $AIRFLOW_HOME (airflow db migrate)"
airflow db migrate > "$AIRFLOW_HOME/db-migrate.log" 2>&1
echo "running rover_daily_retrain for $DS (Airflow log: $LOG)"
start=$(date +%s)
airflow dags test rover_daily_retrain "$DS" > "$LOG" 2>&1 &
run=$!
trap 'kill "$run" 2>/dev/null || true' INT TERM
python scripts/demo_progress.py --log "$LOG" --job-dir "$ROVER_HOME/models/$DS" --pid "$run" \
  --since "$start" || true
wait "$run" || true
python scripts/show_run.py --log "$LOG" --metrics "$ROVER_HOME/models/$DS/metrics.json" \
  --since "$start" --airflow-home "$AIRFLOW_HOME"
