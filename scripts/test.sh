#!/usr/bin/env bash
# Lint, type-check and run the whole test suite (unit + integration with real Airflow and
# real training processes).   bash scripts/test.sh [pytest args]
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
ruff check .
ruff format --check .
mypy airflow_rover dags scripts
pytest "$@"
