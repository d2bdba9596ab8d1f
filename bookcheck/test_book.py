"""The built book (``_build/html``), every page of it, in headless Chromium."""

from __future__ import annotations

import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from bookcheck.browser import WINDOW, serve
from bookcheck.pages import (
    check_site,
    png_size,
    redirect_target,
    search,
    too_long,
)

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
NOT_PAGES = {"_static", "_sources", "_images"}  # Sphinx's asset folders


def book_pages() -> list[str]:
    if not BOOK.is_dir():
        return []
    paths = (p.relative_to(BOOK) for p in BOOK.rglob("*.html"))
    return sorted(p.as_posix() for p in paths if p.parts[0] not in NOT_PAGES)


PAGES = book_pages()
CHAPTERS = [page for page in PAGES if page.startswith("notebooks/")]  # appendices too


def toc_order() -> list[str]:
    """The pages of ``_toc.yml`` in reading order, as paths under the built book."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    order = [toc["root"]]

    def walk(entries):
        for entry in entries:
            if "file" in entry:
                order.append(entry["file"])
            walk(entry.get("sections", []))

    for part in toc.get("parts", []):
        walk(part.get("chapters", []))
    walk(toc.get("chapters", []))
    return [f"{name}.html" for name in order]


def screenshot_of(page: str) -> Path:
    return SHOTS / (page.removesuffix(".html").replace("/", "__") + ".png")


@pytest.fixture(scope="module")
def book():
    """The book served on 127.0.0.1 and every page checked once: (url, {page: Report})."""
    if not PAGES:
        pytest.fail(f"no built book at {BOOK}: build it first (make book)")
    shutil.rmtree(SHOTS, ignore_errors=True)  # no screenshot of a page that is gone
    with serve(BOOK) as url:
        yield url, check_site(url, BOOK, PAGES, screenshot_of)


def test_every_page_of_the_table_of_contents_is_built():
    missing = [page for page in toc_order() if page not in PAGES]
    assert PAGES and not missing, f"not in {BOOK}: {missing or 'any page'} (run make book)"


@pytest.mark.parametrize("page", PAGES)
def test_page(book, page):
    report = book[1][page]
    if report.problems:  # the report names page, element and problem: nothing to add
        pytest.fail(str(report), pytrace=False)
    thebe = [url for url in report.requested if "thebe" in url.lower()]
    assert not thebe, f"{page}: thebe is off, yet the page asked for {thebe}"
    if redirect_target(BOOK / page) is None:
        width, height = png_size(screenshot_of(page))
        assert width == WINDOW["width"] and height >= WINDOW["height"], (width, height)


@pytest.mark.parametrize("page", CHAPTERS)
def test_a_chapter_page_is_within_the_length_limit(book, page):
    report = book[1][page]
    shot = screenshot_of(page)
    if not shot.is_file():  # the page could not be checked: its report says why
        pytest.fail(f"{page}: no screenshot\n{report}", pytrace=False)
    width, height = png_size(shot)
    # The screenshot is the whole page, as the reader first sees it: not the window alone,
    # nor cut off at some largest picture a browser will take.
    assert width == WINDOW["width"] and height >= report.height, (
        f"{page}: the screenshot is {width} x {height} px, the page"
        f" {WINDOW['width']} x {report.height} px"
    )
    problem = too_long(page, height)
    if problem:
        pytest.fail(problem, pytrace=False)


def test_previous_and_next_links_walk_the_table_of_contents(book):
    reports, order = book[1], toc_order()
    walked = [order[0]]
    while reports[walked[-1]].next and len(walked) <= len(order):
        walked.append(reports[walked[-1]].next)
    assert walked == order, f"the next-page links go {walked}, the table of contents {order}"
    back = [(page, reports[page].prev) for page in order]
    assert back == list(zip(order, [None, *order[:-1]], strict=True)), back


def test_the_index_lists_every_term_of_the_glossary():
    terms, targets = set(), set()

    class Collect(HTMLParser):
        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag == "dt" and (attrs.get("id") or "").startswith("term-"):
                terms.add(attrs["id"])
            if tag == "a" and "#term-" in (attrs.get("href") or ""):
                targets.add(attrs["href"].split("#", 1)[1])

    Collect().feed((BOOK / "book" / "glossary.html").read_text(encoding="utf-8"))
    Collect().feed((BOOK / "genindex.html").read_text(encoding="utf-8"))
    assert len(terms) >= 30, f"the glossary defines {len(terms)} terms"
    assert terms <= targets, f"not in the index: {sorted(terms - targets)}"


def test_search_finds_a_word_of_the_book(browser, book):
    hits = search(browser, book[0], "rescale")
    assert "notebooks/02_online_softmax.html" in hits, f"search for 'rescale' found {hits}"


def test_search_finds_nothing_for_a_word_not_in_the_book(browser, book):
    hits = search(browser, book[0], "qwzxv")
    assert hits == [], f"search for 'qwzxv' found {hits}"


def test_page_contents_open_from_the_top_bar_at_1280_px(browser, book):
    # The page's table of contents is a drawer at this width (book/_static/flashref.css).
    context = browser.new_context(viewport=WINDOW)
    try:
        tab = context.new_page()
        tab.goto(book[0] + "notebooks/04_tiled_flashattention.html", wait_until="load")
        toggle = tab.locator("button.secondary-toggle:visible")
        assert toggle.count() == 1, f"{toggle.count()} visible buttons open the page contents"
        toggle.click()
        drawer = tab.locator("#pst-secondary-sidebar-modal[open] nav.page-toc a")
        drawer.first.wait_for(state="visible")
        assert drawer.count() >= 5, f"the page contents drawer lists {drawer.count()} sections"
    finally:
        context.close()
