"""Fixtures of the browser check: one Chromium for the whole run."""

from __future__ import annotations

import pytest

from bookcheck.browser import chromium


@pytest.fixture(scope="session")
def browser():
    with chromium() as launched:
        yield launched
