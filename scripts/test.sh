#!/usr/bin/env bash
# Lint, type-check and run the whole test suite (unit + integration with real Airflow and
# real training processes).   bash scripts/test.sh [pytest args]
source "$(dirname "${BASH_SOURCE[0]}")/bootstrap.sh"
ruff check .
ruff format --check .
mypy airflow_rover dags scripts bench
# Two processes, a test file each at a time (a module's Airflow home and jobs stay together);
# ROVER_TEST_WORKERS=0 runs in this process.
pytest -n "${ROVER_TEST_WORKERS:-2}" --dist loadfile "$@"
