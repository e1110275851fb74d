"""The job history store (the "config DB" warm start reads): SQLAlchemy, SQLite by default.

``history`` holds the tables and ``HistoryStore``; ``records`` builds a ``JobRecord`` from a
job's final status; ``connection`` turns an Airflow connection into a URL (``HistoryStoreHook``).
"""

from airflow_rover.store.history import HistoryStore
from airflow_rover.store.records import JobRecord, record_from_status

__all__ = ["HistoryStore", "JobRecord", "record_from_status"]
