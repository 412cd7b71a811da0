"""Debian's Chromium, driven by Playwright, for the tests that open pages (``test_book_browser.py``,
``test_memory_calculator_js.py``). Never ``playwright install``, which would download a browser.

Where Playwright or Chromium is missing the tests skip, saying why; with ``GPUFORMER_REQUIRE_BROWSER=1``
(set by ``.ci/run``) they fail instead.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
"""Headless flags for a closed network: without the background-networking ones Chromium keeps trying to reach
Google's hosts."""

REQUIRED = os.environ.get("GPUFORMER_REQUIRE_BROWSER") == "1"
"""Set by ``.ci/run``: there a missing browser fails the run instead of skipping the test."""


def playwright_or_skip(allow_module_level: bool = False):
    """Playwright's ``sync_api`` where it and Debian's Chromium are installed; else skip (or fail, when the
    browser is required)."""
    try:
        from playwright import sync_api
    except ImportError:
        reason = ("Playwright is not installed: pip install playwright (the Python package only; the tests drive "
                  "Debian's chromium)")
    else:
        if Path(CHROMIUM).exists():
            return sync_api
        reason = "Debian's chromium is not installed: apt-get install chromium (.ci/run installs it)"
    if REQUIRED:
        raise RuntimeError(f"{reason} (GPUFORMER_REQUIRE_BROWSER=1 asks for the browser test)")
    pytest.skip(reason, allow_module_level=allow_module_level)


def launch(playwright):
    """Debian's Chromium, headless, with :data:`ARGS`."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
