"""A headless Chromium driven by Selenium, for the playground's browser test.

The browser is the system's (Debian: ``apt-get install chromium chromium-driver``, which
``make test`` does when it runs as root or with passwordless sudo): Selenium is pointed
at the chromium binary and its matching chromedriver, so nothing is downloaded.
``find_browser`` returns the two paths, or the reason the test has to be skipped.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DRIVERS = ("chromedriver",)
# Debian keeps the real binaries here; the names on PATH are a wrapper script and a
# symlink.
FALLBACKS = {
    "chromium": "/usr/lib/chromium/chromium",
    "chromedriver": "/usr/lib/chromium/chromedriver",
}
INSTALL_HINT = (
    "install the Debian packages `chromium chromium-driver` "
    "(`make test` does it when it runs "
    "as root or with passwordless sudo), or set DIFFSERVE_CHROMIUM "
    "and DIFFSERVE_CHROMEDRIVER"
)


def _which(names: tuple[str, ...], env: str) -> str | None:
    if os.environ.get(env):
        return os.environ[env] if Path(os.environ[env]).is_file() else None
    for name in names:
        if shutil.which(name):
            return shutil.which(name)
        if name in FALLBACKS and Path(FALLBACKS[name]).is_file():
            return FALLBACKS[name]
    return None


def find_browser() -> tuple[str, str] | str:
    """``(chromium, chromedriver)``, or why there is none."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed (pip install -e '.[test]')"
    browser = _which(BROWSERS, "DIFFSERVE_CHROMIUM")
    driver = _which(DRIVERS, "DIFFSERVE_CHROMEDRIVER")
    if browser is None or driver is None:
        missing = " and ".join(
            f"{name} (${env}={os.environ[env]!r} is not a file)"
            if os.environ.get(env)
            else name
            for name, env, path in (
                ("chromium", "DIFFSERVE_CHROMIUM", browser),
                ("chromedriver", "DIFFSERVE_CHROMEDRIVER", driver),
            )
            if path is None
        )
        return f"no {missing} on this machine: {INSTALL_HINT}"
    return browser, driver


def start_chromium(browser: str, driver: str, profile_dir: Path, log_path: Path) -> Any:
    """A headless Chromium session (root-safe: ``--no-sandbox``) with a throwaway
    profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1600",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        f"--user-data-dir={profile_dir}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=driver, log_output=str(log_path))
    session = webdriver.Chrome(service=service, options=options)
    session.set_script_timeout(30)
    return session
