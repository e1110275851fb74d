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
