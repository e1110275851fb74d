"""Builds the id index's C loops (``airflow_rover/core/_id_probe.c``); everything else is in
pyproject.toml. The extension is optional: without a compiler the install still succeeds and
``core.id_probe`` runs its numpy twin."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "airflow_rover.core._id_probe",
            ["airflow_rover/core/_id_probe.c"],
            extra_compile_args=["-O3", "-std=c99", "-fno-math-errno"],
            libraries=["m"],
            optional=True,
        )
    ]
)
