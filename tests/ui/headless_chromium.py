"""Debian's Chromium and its driver, the only browser the UI tests use (never downloaded from
elsewhere: selenium-manager is bypassed by naming the driver's path)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

PACKAGES = ("chromium", "chromium-driver")
# One apt run on the machine, whichever test process gets here first.
INSTALL_LOCK = Path("/tmp/airflow-rover-chromium-install.lock")
# What works as root in a container: no sandbox, /tmp instead of a small /dev/shm.
HEADLESS_ARGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)


def _found() -> tuple[str, str] | None:
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def _apt_install() -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update"],
        ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES],
    ):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}{done.stderr}")


def ensure_chromium() -> tuple[str, str]:
    """The paths of ``chromium`` and ``chromedriver``; as root, installs Debian's packages
    when they are missing; otherwise skips the test, saying what to install."""
    if found := _found():
        return found
    if os.geteuid() != 0:
        pytest.skip(
            "needs Debian's chromium and chromium-driver packages (not installed, and not "
            "root to install them): apt-get install chromium chromium-driver"
        )
    with INSTALL_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _found():
            _apt_install()
    found = _found()
    if found is None:
        raise RuntimeError(f"apt-get installed {PACKAGES} but chromium/chromedriver not on PATH")
    return found


def start_browser(browser: str, driver: str) -> webdriver.Chrome:
    """Headless Chromium driven through ``driver`` (an explicit path, so selenium never looks
    for or downloads one)."""
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in HEADLESS_ARGS:
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))
