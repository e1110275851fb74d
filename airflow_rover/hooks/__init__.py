"""Hooks: all I/O between Airflow and a job (its files, its master process, its master API)."""
