"""Fixtures shared by the unit tests: ``make_job`` (a JobMaster behind its HTTP app, nodes as
records: ``master_rig.py``) and the ``dataset`` it trains on, unless a module has its own."""

from master_rig import dataset, make_job  # noqa: F401 (fixtures for the tests here)
