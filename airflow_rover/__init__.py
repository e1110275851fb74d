"""airflow-rover: elastic recommendation-model training jobs driven from Apache Airflow."""

__version__ = "0.1.0"
