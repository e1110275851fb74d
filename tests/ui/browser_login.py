"""Logging in through the simple auth manager's own login page, as a person would."""

from __future__ import annotations

from urllib.parse import quote

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

COOKIE = "_token"  # the JWT cookie the UI's pages and plugin endpoints authenticate with


def login(
    driver: webdriver.Chrome,
    base_url: str,
    user: str,
    password: str,
    next_path: str = "/",
    timeout: float = 30,
) -> None:
    """Fill in the login form (``/auth/login``) and wait until the ``_token`` cookie is set and
    the browser has left the login page for ``next_path``."""
    driver.delete_all_cookies()
    driver.get(f"{base_url}/auth/login?next={quote(next_path)}")
    wait = WebDriverWait(driver, timeout)
    wait.until(ec.presence_of_element_located((By.NAME, "username"))).send_keys(user)
    driver.find_element(By.NAME, "password").send_keys(password)
    wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "button[type=submit]"))).click()
    wait.until(lambda d: d.get_cookie(COOKIE) and "/auth/login" not in d.current_url)
