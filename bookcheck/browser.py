"""A closed room for the book: its files over HTTP on 127.0.0.1, and headless Chromium.

The built book is served by a local HTTP server (the search page needs http, not
file://). Chromium is Debian's (``/usr/bin/chromium``, or ``$CHROMIUM``) driven by
Playwright, which never downloads a browser of its own when given
``executable_path``. Playwright starts every launch with a fresh temporary profile
(a new ``--user-data-dir``); the flags below keep Chromium's own background
connections (updates, sync, QUIC probes) from being attempted at all.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
INSTALL = "apt-get install chromium chromium-driver"
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WINDOW = {"width": 1280, "height": 800}  # a laptop screen: the width the book must fit


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass  # a request log per file would bury the test report


@contextlib.contextmanager
def serve(root: Path):
    """Serve the folder ``root`` on 127.0.0.1 at a free port; yields the base URL."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"root {root} is not a folder (build the book first: make book)")
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def chromium():
    """Headless Debian Chromium under Playwright; yields a Playwright ``Browser``."""
    if not os.access(CHROMIUM, os.X_OK):
        raise FileNotFoundError(
            f"CHROMIUM={CHROMIUM} is not an executable; install Debian's browser: {INSTALL}"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS
        )
        try:
            yield browser
        finally:
            browser.close()
