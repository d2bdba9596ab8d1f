"""Open one page of a built book in Chromium and list everything wrong with it.

``check_page`` loads a page at 1280 px with every request to another host refused,
waits for MathJax, takes a full-page screenshot, runs ``page_checks.js`` inside the
page, and resolves every link against the built files. Each problem is one line
that names the page, the element and what is wrong with it. ``check_site`` does
that for many pages, two browsers at a time; ``search`` asks the book's search page.
``too_long`` holds a chapter page's height to the book's limit of ``MAX_SCREENS``.
"""

from __future__ import annotations

import functools
import queue
import re
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

from bookcheck.browser import WINDOW, chromium

PAGE_CHECKS = (Path(__file__).parent / "page_checks.js").read_text(encoding="utf-8")
SETTLED = """async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  await document.fonts.ready;
}"""
# The longest chapter takes seconds to lay out and to photograph on two busy cores;
# a page that needs more than this is a problem in itself.
TIMEOUT_MS = 120_000
# A chapter page is read on a screen of 1280 x 1000 px and may be at most this many
# screens long, counted at the window's width (1280 px) with its folded content folded.
SCREEN_HEIGHT = 1000
MAX_SCREENS = 25


@dataclass
class Report:
    page: str  # path under the site's root, e.g. "notebooks/01_softmax.html"
    problems: list[str] = field(default_factory=list)  # "page: element: problem"
    requested: list[str] = field(default_factory=list)  # every URL the page asked for
    prev: str | None = None  # the footer's previous-page link (a path under the root)
    next: str | None = None  # the footer's next-page link
    height: int | None = None  # the whole page's height in px, as loaded (nothing unfolded)

    def add(self, element: str, problem: str) -> None:
        self.problems.append(f"{self.page}: {element}: {problem}")

    def __str__(self) -> str:
        if not self.problems:
            return f"{self.page}: no problems"
        return f"{len(self.problems)} problem(s):\n" + "\n".join(self.problems)


def check_page(browser, base_url: str, root: Path, page: str, screenshot: Path | None = None):
    """Open ``base_url + page`` (the file ``root / page``) and return its ``Report``.

    ``browser`` is a Playwright ``Browser``, and the page gets a fresh context, as on
    a reader's first visit; or a ``BrowserContext`` (from ``new_context``), whose
    caches the pages checked in it share, which is faster.
    """
    root = Path(root)
    report = Report(page)
    origin = urlsplit(base_url).netloc
    redirect = redirect_target(root / page)
    if redirect is not None:  # a page that only forwards the reader: its target must exist
        href = urljoin(base_url + page, redirect)
        why = dangling(root, origin, href)
        if why:
            report.add("<meta http-equiv=refresh>", f"redirect to {href}: {why}")
        return report

    refused, missing = set(), set()

    def route(route):
        url = route.request.url
        report.requested.append(url)
        if urlsplit(url).netloc != origin:
            refused.add(url)
            report.add("page", f"request to another host refused: {url}")
            route.abort("blockedbyclient")
        else:
            route.continue_()

    def response(response):
        if response.status >= 400 and urlsplit(response.url).netloc == origin:
            missing.add(response.url)
            report.add("page", f"HTTP {response.status} for {response.url}")

    def console(message):
        if message.type != "error":
            return
        source = message.location.get("url", "")
        if message.text.startswith("Failed to load resource") and source in refused | missing:
            return  # already reported above, by URL
        report.add("console", f"console error: {message.text} (at {source})")

    fresh = hasattr(browser, "new_context")
    context = new_context(browser) if fresh else browser
    tab = context.new_page()
    try:
        tab.route("**/*", route)
        tab.on("response", response)
        tab.on("console", console)
        tab.on("pageerror", lambda error: report.add("page", f"uncaught exception: {error}"))
        tab.goto(base_url + page, wait_until="load")
        tab.evaluate(SETTLED)
        report.height = tab.evaluate("document.documentElement.scrollHeight")
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=screenshot, full_page=True)
        found = tab.evaluate(PAGE_CHECKS)
    finally:
        (context if fresh else tab).close()
    for element, problem in found["problems"]:
        report.add(element, problem)
    for element, href in found["links"]:
        why = dangling(root, origin, href)
        if why:
            report.add(element, f"link to {href}: {why}")
    report.prev, report.next = (local_path(found[k], origin) for k in ("prev", "next"))
    return report


def check_site(
    base_url: str, root: Path, pages: list[str], screenshot_of: Callable[[str], Path], workers=2
) -> dict[str, Report]:
    """``check_page`` for every page, in ``workers`` Chromiums at once (one per core).

    The largest pages go first, so that the longest one does not start last.
    A page that cannot be checked at all (a timeout, a crash) is reported as such.
    """
    todo: queue.Queue[str] = queue.Queue()
    for page in sorted(pages, key=lambda page: -(Path(root) / page).stat().st_size):
        todo.put(page)
    reports: dict[str, Report] = {}
    failed: list[Exception] = []  # a browser that would not start

    def unchecked(page: str, error: Exception) -> Report:
        report = Report(page)
        report.add("page", f"could not be checked: {error!r}")
        return report

    def work():  # Playwright's sync API wants one instance per thread
        try:
            with chromium() as browser:
                while True:
                    try:
                        page = todo.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        reports[page] = check_page(
                            browser, base_url, root, page, screenshot_of(page)
                        )
                    except Exception as error:  # a timeout, a crash: the page's problem
                        reports[page] = unchecked(page, error)
        except Exception as error:
            failed.append(error)

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {page: reports.get(page) or unchecked(page, failed[0]) for page in pages}


def png_size(path: Path) -> tuple[int, int]:
    """The (width, height) in px of the PNG file ``path``, read from its header."""
    header = Path(path).read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG file"
    return struct.unpack(">II", header[16:24])


def too_long(page: str, height: int) -> str | None:
    """Why a page ``height`` px tall is over the limit of ``MAX_SCREENS``, or None."""
    if height <= MAX_SCREENS * SCREEN_HEIGHT:
        return None
    return (
        f"{page}: page: {height / SCREEN_HEIGHT:.1f} screens long ({height} px at"
        f" {WINDOW['width']} px wide, a screen {SCREEN_HEIGHT} px), over the limit of"
        f" {MAX_SCREENS} screens"
    )


def new_context(browser):
    """A browser context with the book's window size and this module's timeout."""
    context = browser.new_context(viewport=WINDOW)
    context.set_default_timeout(TIMEOUT_MS)
    return context


def local_path(href: str | None, origin: str) -> str | None:
    """The path under the site's root that ``href`` points to, if it is on ``origin``."""
    if href is None or urlsplit(href).netloc != origin:
        return None
    return unquote(urlsplit(href).path).lstrip("/")


def dangling(root: Path, origin: str, href: str) -> str | None:
    """Why the link ``href`` does not resolve in the built book, or None if it does.

    Links to other sites, ``mailto:`` and the like are not pages of the book: None.
    """
    parts = urlsplit(href)
    if parts.scheme not in ("http", "https") or parts.netloc != origin:
        return None
    path = unquote(parts.path).lstrip("/")
    target = root / path
    if path == "" or target.is_dir():
        target = target / "index.html"
    if not target.is_file():
        return f"no such page ({target.relative_to(root)})"
    anchor = unquote(parts.fragment)
    if anchor and anchor not in anchors(target):
        return f"no element with id {anchor!r} on {target.relative_to(root)}"
    return None


def redirect_target(path: Path) -> str | None:
    """The URL that the page ``path`` forwards to with ``<meta http-equiv=refresh>``."""
    match = re.search(
        r"""<meta\s+http-equiv=["']refresh["']\s+content=["']\d+;\s*url=([^"']+)["']""",
        path.read_text(encoding="utf-8"),
        re.IGNORECASE,
    )
    return match.group(1) if match else None


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    """Every id (and old-style ``<a name>``) in the HTML file ``path``."""
    found = set()

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):
            for name, value in attrs:
                if value and (name == "id" or (name == "name" and tag == "a")):
                    found.add(value)

    Collect().feed(path.read_text(encoding="utf-8"))
    return frozenset(found)


def search(browser, base_url: str, word: str) -> list[str]:
    """Search the book for ``word`` on its own search page; the result links' hrefs."""
    origin = urlsplit(base_url).netloc
    context = new_context(browser)
    try:
        tab = context.new_page()
        tab.route(
            "**/*",
            lambda r: r.continue_()
            if urlsplit(r.request.url).netloc == origin
            else r.abort("blockedbyclient"),
        )
        tab.goto(f"{base_url}search.html?q={word}", wait_until="load")
        # Sphinx's search writes its summary line when the last result is listed.
        tab.wait_for_function(
            "() => (document.querySelector('#search-results .search-summary') || {}).innerText"
        )
        return tab.eval_on_selector_all(
            "#search-results ul.search li a", "links => links.map(a => a.getAttribute('href'))"
        )
    finally:
        context.close()
