"""The malloc thresholds PS and worker processes set at start (``core.allocator``)."""

from __future__ import annotations

import ctypes
import platform

import pytest

from airflow_rover.core.allocator import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_thresholds() -> None:
    assert keep_freed_memory()


def test_a_c_library_without_mallopt_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoMallopt:
        def __init__(self, name: object) -> None:
            pass

    monkeypatch.setattr(ctypes, "CDLL", NoMallopt)
    assert not keep_freed_memory()
