"""The job history store (the "config DB" warm start reads): SQLAlchemy, SQLite by default.

``store`` holds the tables and ``HistoryStore``; ``records`` builds a ``JobRecord`` from a
job's final status; ``registry`` keeps the running jobs that share a cluster budget
(``RunningJobRegistry``). Its Airflow face, which turns a connection into a URL, is
``hooks.history_store.HistoryStoreHook``.
"""

from airflow_rover.history.records import JobRecord, record_from_status
from airflow_rover.history.registry import RunningJobRegistry
from airflow_rover.history.store import HistoryStore

__all__ = ["HistoryStore", "JobRecord", "RunningJobRegistry", "record_from_status"]
