"""Pure logic (plans, shard queue, metrics): no Airflow and no network imports, fast to test."""
