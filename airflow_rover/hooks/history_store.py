"""Where the history store lives: an Airflow connection, or SQLite in ``$AIRFLOW_HOME``.

``HistoryStoreHook`` is the Airflow face of the store (all its I/O goes through the hook):

- no connection id: ``sqlite:///$AIRFLOW_HOME/rover/history.db`` (created on first use);
- a ``rover_history`` connection: the SQLAlchemy URL in its extra ``{"sqlalchemy_url": ...}``,
  or in its host field; login and password, when given, replace the URL's (so the password can
  live in the connection's masked password field);
- a database connection of another type (``postgres``, ``mysql``, ``sqlite``, ...): its URI,
  with ``postgres://`` spelled ``postgresql://`` and SQLite's path taken from host or schema.

Example: ``AIRFLOW_CONN_ROVER_HISTORY='postgresql://rover:***@db:5432/rover'`` and
``history_conn_id="rover_history"`` on the operators.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook
from sqlalchemy.engine import URL, make_url

from airflow_rover.core.spec import ResourcePlan
from airflow_rover.core.throughput import JobShape
from airflow_rover.core.warm_start import (
    DEFAULT_K,
    DEFAULT_MIN_SIMILARITY,
    DEFAULT_MU,
    JobTraits,
    Refinement,
    WarmStart,
)
from airflow_rover.history.records import JobRecord
from airflow_rover.history.store import HistoryStore, safe_url

CONN_TYPE = "rover_history"
URL_EXTRA = "sqlalchemy_url"


def default_history_path() -> Path:
    """``$AIRFLOW_HOME/rover/history.db`` (``~/airflow`` without AIRFLOW_HOME), read when called."""
    home = os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))
    return Path(home).expanduser() / "rover" / "history.db"


def default_history_url() -> str:
    return f"sqlite:///{default_history_path()}"


def url_from_connection(conn: Any) -> str:
    """The SQLAlchemy URL of an Airflow connection (see the module docstring)."""
    extra = conn.extra_dejson or {}
    conn_type = (conn.conn_type or "").replace("-", "_")
    text = extra.get(URL_EXTRA) or (conn.host if conn_type == CONN_TYPE else None)
    if text:
        url: URL = make_url(str(text))
        if conn.login:
            url = url.set(username=conn.login)
        if conn.password:
            url = url.set(password=conn.password)
        return url.render_as_string(hide_password=False)
    if conn_type == CONN_TYPE:
        raise ValueError(
            f"connection {conn.conn_id!r} (type {CONN_TYPE}): give the SQLAlchemy URL in the "
            f"host field or in extra {{{URL_EXTRA!r}: ...}}"
        )
    if conn_type == "sqlite":
        path = conn.host or conn.schema
        if not path:
            raise ValueError(f"connection {conn.conn_id!r}: a sqlite connection needs a file path")
        return f"sqlite:///{path}"
    uri = str(conn.get_uri())
    if uri.startswith("postgres://"):
        uri = "postgresql://" + uri[len("postgres://") :]
    return uri


class HistoryStoreHook(BaseHook):
    """Read and write the job history (``airflow_rover.history.store``) through a connection.

    :param history_conn_id: an Airflow connection to the history database; ``None``: SQLite in
        ``$AIRFLOW_HOME/rover/history.db``.
    """

    conn_name_attr = "history_conn_id"
    default_conn_name = "rover_history_default"
    conn_type = CONN_TYPE
    hook_name = "airflow-rover job history"

    def __init__(self, history_conn_id: str | None = None) -> None:
        super().__init__()
        self.history_conn_id = history_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["schema", "port"],
            "relabeling": {"host": "SQLAlchemy URL (without password)"},
            "placeholders": {
                "host": "postgresql+psycopg2://db.example.com:5432/rover",
                "extra": '{"sqlalchemy_url": "sqlite:////var/lib/rover/history.db"}',
            },
        }

    def get_url(self) -> str:
        """The SQLAlchemy URL (with its password: never log it; ``safe_url`` hides it)."""
        if not self.history_conn_id:
            return default_history_url()
        return url_from_connection(self.get_connection(self.history_conn_id))

    async def async_get_url(self) -> str:
        """``get_url`` for triggers: the connection is read without blocking the event loop."""
        if not self.history_conn_id:
            return default_history_url()
        return url_from_connection(await self.aget_connection(self.history_conn_id))

    def get_conn(self) -> HistoryStore:
        """A ``HistoryStore`` on the connection's database; close it when done (``with``)."""
        url = self.get_url()
        self.log.debug("History store: %s", safe_url(url))
        return HistoryStore(url)

    def record_job(self, record: JobRecord) -> None:
        with self.get_conn() as store:
            store.record_job(record)
        self.log.info("Recorded job %s (%s) in the history store", record.job_id, record.outcome)

    def warm_start(
        self,
        traits: JobTraits,
        cold_start: ResourcePlan | None = None,
        k: int = DEFAULT_K,
        mu: float = DEFAULT_MU,
        min_similarity: float = DEFAULT_MIN_SIMILARITY,
        refinement: Refinement | None = None,
        shape: JobShape | None = None,
    ) -> WarmStart:
        with self.get_conn() as store:
            return store.warm_start(
                traits, cold_start, k, mu, min_similarity, refinement=refinement, shape=shape
            )

    def test_connection(self) -> tuple[bool, str]:
        """Open the database and create the schema if needed (Airflow's "Test" button)."""
        try:
            with self.get_conn() as store:
                store.ensure_schema()
                count = len(store.list_jobs(limit=1))
        except Exception as exc:  # any driver or URL error is the answer to the test
            return False, str(exc)
        return True, "history store reachable, schema ready" + (" (not empty)" if count else "")
