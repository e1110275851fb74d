"""Provider metadata read by Airflow's providers manager (the ``apache_airflow_provider`` hook)."""

from __future__ import annotations

from typing import Any

from airflow_rover import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-rover",
        "name": "airflow-rover",
        "description": "Elastic, self-sizing, failure-tolerant recommendation-model training.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "airflow-rover",
                "external-doc-url": "https://pypi.org/project/airflow-rover/",
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": "airflow-rover",
                "python-modules": [
                    "airflow_rover.operators.training",
                    "airflow_rover.operators.warm_start",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "airflow-rover",
                "python-modules": [
                    "airflow_rover.sensors.elastic_job",
                    "airflow_rover.sensors.checkpoint",
                ],
            }
        ],
        "hooks": [
            {
                "integration-name": "airflow-rover",
                "python-modules": [
                    "airflow_rover.hooks.elastic_job",
                    "airflow_rover.hooks.history_store",
                ],
            }
        ],
        "connection-types": [
            {
                "hook-class-name": "airflow_rover.hooks.history_store.HistoryStoreHook",
                "connection-type": "rover_history",
            }
        ],
        "extra-links": ["airflow_rover.operators.job_link.ElasticJobLink"],
        "plugins": [
            {
                "name": "airflow_rover",
                "plugin-class": "airflow_rover.plugins.rover_plugin.RoverPlugin",
            }
        ],
        "triggers": [
            {
                "integration-name": "airflow-rover",
                "python-modules": ["airflow_rover.triggers.elastic_job"],
            }
        ],
    }
