"""Debian's Chromium and its driver, the only browser the UI tests use (never downloaded from
elsewhere: selenium-manager is bypassed by naming the driver's path)."""

from __future__ import annotations

import shutil

from debian_packages import ensure_installed
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

PACKAGES = ("chromium", "chromium-driver")
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


def ensure_chromium() -> tuple[str, str]:
    """The paths of ``chromium`` and ``chromedriver`` (installed as root when missing)."""
    return ensure_installed(PACKAGES, _found, "chromium/chromedriver")


def start_browser(browser: str, driver: str) -> webdriver.Chrome:
    """Headless Chromium driven through ``driver`` (an explicit path, so selenium never looks
    for or downloads one)."""
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in HEADLESS_ARGS:
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))
