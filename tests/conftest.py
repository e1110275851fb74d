"""Fixtures shared by the test folders that run a real Airflow (integration, ui), and a real
PostgreSQL server (``postgres_server``, ``postgres_url``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg_server import PostgresServer, start_server


@pytest.fixture(scope="session")
def migrated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty metadata DB at Airflow's schema, migrated once and copied into each module's
    home (a migration costs seconds per module)."""
    home = tmp_path_factory.mktemp("airflow_template")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return home / "airflow.db"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of Debian's ``postgresql`` on 127.0.0.1 (``tests/pg_server.py``),
    started once per test process and stopped at its end; ``create_database(name)`` gives a
    fresh database's URL."""
    server = start_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """The SQLAlchemy URL (``postgresql+psycopg2://``, with its password) of a database on
    ``postgres_server``, shared by the tests of this process."""
    return postgres_server.create_database("rover")
