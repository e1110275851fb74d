"""The job history store (the "config DB" warm start reads): SQLAlchemy, SQLite by default.

``history`` holds the tables and ``HistoryStore``; ``records`` builds a ``JobRecord`` from a
job's final status; ``connection`` turns an Airflow connection into a URL (``HistoryStoreHook``);
``registry`` keeps the running jobs that share a cluster budget (``RunningJobRegistry``).
"""

from airflow_rover.store.history import HistoryStore
from airflow_rover.store.records import JobRecord, record_from_status
from airflow_rover.store.registry import RunningJobRegistry

__all__ = ["HistoryStore", "JobRecord", "RunningJobRegistry", "record_from_status"]
