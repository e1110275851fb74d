"""The provider metadata Airflow discovers: schema-valid, importable, registered."""

from __future__ import annotations

import importlib
import json
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import airflow
import jsonschema
import pytest

from airflow_rover import __version__
from airflow_rover.get_provider_info import get_provider_info

ENTRY_POINT_GROUP = "apache_airflow_provider"
SECTIONS = ("operators", "sensors", "hooks", "triggers")


def listed_modules() -> list[str]:
    info = get_provider_info()
    return [m for section in SECTIONS for item in info[section] for m in item["python-modules"]]


def test_provider_info_matches_airflows_schema() -> None:
    """Validated with the schema file and validator class Airflow's ProvidersManager uses."""
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    validator_cls: Any = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    errors = [e.message for e in validator_cls(schema).iter_errors(get_provider_info())]
    assert errors == []


def test_provider_info_is_consistent() -> None:
    """Version matches the package; every module names an integration that is declared."""
    info = get_provider_info()
    assert info["versions"] == [__version__]
    integrations = {i["integration-name"] for i in info["integrations"]}
    for section in SECTIONS:
        assert {item["integration-name"] for item in info[section]} <= integrations, section


@pytest.mark.parametrize("module", listed_modules())
def test_every_listed_module_imports(module: str) -> None:
    """Each python module named in the metadata exists and imports."""
    assert importlib.import_module(module).__name__ == module


def test_the_entry_point_is_registered() -> None:
    """``apache_airflow_provider`` points at ``get_provider_info`` of this package."""
    ours = [
        ep
        for ep in entry_points(group=ENTRY_POINT_GROUP)
        if ep.dist is not None and ep.dist.name == "airflow-rover"
    ]
    assert [ep.value for ep in ours] == ["airflow_rover.get_provider_info:get_provider_info"]
    assert ours[0].load()() == get_provider_info()


def test_airflows_providers_manager_discovers_the_provider() -> None:
    """Airflow itself lists the provider, with our version and metadata."""
    from airflow.providers_manager import ProvidersManager

    providers = ProvidersManager().providers
    assert "airflow-rover" in providers
    assert providers["airflow-rover"].version == __version__
    assert providers["airflow-rover"].data["triggers"] == get_provider_info()["triggers"]


def test_the_ui_plugin_is_registered_and_the_folder_file_is_the_same_plugin() -> None:
    """The ``airflow.plugins`` entry point, the provider info and ``plugins/`` name one plugin,
    whose app is mounted at ``/rover`` and whose link is the operator's."""
    import runpy

    from airflow_rover.operators.training import ElasticTrainingOperator
    from airflow_rover.plugins.rover_plugin import RoverPlugin

    ours = [
        ep
        for ep in entry_points(group="airflow.plugins")
        if ep.dist is not None and ep.dist.name == "airflow-rover"
    ]
    assert [ep.load() for ep in ours] == [RoverPlugin]
    info = get_provider_info()
    assert info["plugins"] == [
        {"name": RoverPlugin.name, "plugin-class": "airflow_rover.plugins.rover_plugin.RoverPlugin"}
    ]
    (link_class,) = info["extra-links"]
    module, _, name = link_class.rpartition(".")
    link = getattr(importlib.import_module(module), name)
    assert [type(x) for x in ElasticTrainingOperator.operator_extra_links] == [link]
    assert [type(x) for x in RoverPlugin.operator_extra_links] == [link]
    assert [app["url_prefix"] for app in RoverPlugin.fastapi_apps] == ["/rover"]
    folder_file = Path(__file__).parents[2] / "plugins" / "airflow_rover_ui.py"
    assert runpy.run_path(str(folder_file))["RoverPlugin"] is RoverPlugin


def test_the_link_names_the_task_instances_job_page() -> None:
    from types import SimpleNamespace

    from airflow_rover.operators.job_identity import job_id_for
    from airflow_rover.operators.job_link import ElasticJobLink

    key = SimpleNamespace(dag_id="d", task_id="t", run_id="manual__1", map_index=2)
    link = ElasticJobLink().get_link(None, ti_key=key)
    assert link.endswith(f"/rover/jobs/{job_id_for('d', 't', 'manual__1', 2)}")
