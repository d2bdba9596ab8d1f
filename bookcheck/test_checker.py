"""The checker itself: one small page per planted defect, and the report it must give.

Each page below is a clean page with one defect added by hand; the checker must
report that defect (page, element, problem) and nothing else. The clean page must
give no report at all. Pages with formulas use the book's own copy of MathJax.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from bookcheck.browser import WINDOW, serve
from bookcheck.pages import (
    MAX_SCREENS,
    SCREEN_HEIGHT,
    check_page,
    new_context,
    png_size,
    too_long,
)

MATHJAX = Path(__file__).resolve().parent.parent / "book" / "_static" / "mathjax"

HEAD = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>fixture</title>
<style>
  body { margin: 0; font: 16px sans-serif; }
  article { width: 600px; padding: 20px; }
  pre, .scroll { overflow-x: auto; }
</style>
<script>window.MathJax = { svg: { fontCache: "global" } };</script>
{mathjax}
</head><body><article class="bd-article">
"""
MATHJAX_TAG = '<script defer src="mathjax/tex-svg-full.js"></script>'
TAIL = "</article></body></html>\n"

MATH = r"""
<p>The weights <span class="math">\(e^{S_{ij} - m_i} / \ell_i\)</span> sum to 1.</p>
<div class="math">\[ \ell = \sum_j e^{S_j - m} \]</div>
"""
CLEAN = r"""
<h1 id="top">A clean page</h1>
<p>The running sum is rescaled.</p>
<figure><img src="dot.svg" alt="a dot"></figure>
<pre>for j in range(Tc):  # (Br, Bc)</pre>
<div class="scroll"><table><tr><td>m</td><td>l</td></tr></table></div>
<p><a href="#top">top</a> <a href="other.html#there">there</a> <a href="./">index</a>
<a href="https://example.org/paper">a paper</a> <a href="mailto:a@example.org">mail</a>
<a class="left-prev" href="other.html">previous</a></p>
"""
WIDE_LINE = ("O = " + " + ".join(["P_ij @ V_j"] * 20))[:200]
assert len(WIDE_LINE) == 200

# page name: (what is added to the clean page, a pattern for each report line it must give)
DEFECTS = {
    "remote_script.html": (
        '<script src="https://cdn.example.com/lib.js"></script>',
        [r"page: request to another host refused: https://cdn\.example\.com/lib\.js$"],
    ),
    "broken_formula.html": (  # an unclosed brace: MathJax finds no end to the formula
        r'<p>A sum <span class="math">\(e^{S - m\)</span>.</p>',
        [r'span\.math \(2 of 2\) "\\\(e\^\{S - m\\\)": formula not typeset by MathJax$'],
    ),
    "tex_error.html": (
        r'<p>A fraction <span class="math">\(\frac{1}\)</span>.</p>',
        [r'span\.math \(2 of 2\) "[^"]*": MathJax error: Missing argument for \\frac$'],
    ),
    "unknown_macro.html": (
        r'<p>A sum <span class="math">\(\alha + 1\)</span>.</p>',
        [r'span\.math \(2 of 2\) "[^"]*": MathJax does not know \\alha$'],
    ),
    "raw_tex.html": (  # dollars that the Markdown parser did not turn into a formula
        r"<p>The running sum $\ell$ is rescaled.</p>",
        [
            r'p \(3 of 3\) "The running sum \$\\ell\$ is rescaled\.": raw TeX in the text: '
            r'"\\\\ell"$'
        ],
    ),
    "wide_listing.html": (
        f"<pre>{WIDE_LINE}</pre>",
        [
            r'pre \(2 of 2\) "O = P_ij @ V_j \+ [^"]*\.\.\.": scrolls sideways: content \d+ px wide'
            r" in a box of 600 px$"
        ],
    ),
    "wide_table.html": (
        '<div class="scroll"><table><tr><td style="min-width: 900px">wide</td></tr></table></div>',
        [
            r'div\.scroll \(2 of 2\) "wide": scrolls sideways: content 9\d\d px wide'
            r" in a box of 600 px$"
        ],
    ),
    "wide_image.html": (
        '<img src="wide.svg" alt="too wide">',
        [
            r'img \(2 of 2\) "wide\.svg": sticks out of the content column by 1380 px$',
            r"page: the page scrolls sideways: \d+ px wide in a window of 1280 px$",
        ],
    ),
    "missing_image.html": (
        '<img src="_images/missing.png" alt="gone">',
        [
            r"page: HTTP 404 for http://127\.0\.0\.1:\d+/_images/missing\.png$",
            r'img \(2 of 2\) "_images/missing\.png": image did not load'
            r" \(src _images/missing\.png\)$",
        ],
    ),
    "dangling_link.html": (
        '<a href="nowhere.html">a</a> <a href="other.html#nowhere">b</a>'
        ' <a class="right-next" href="gone.html">next</a>',
        [
            r'a \(7 of 9\) "a": link to http://127\.0\.0\.1:\d+/nowhere\.html: no such page'
            r" \(nowhere\.html\)$",
            r'a \(8 of 9\) "b": link to http://127\.0\.0\.1:\d+/other\.html#nowhere: no element'
            r" with id 'nowhere' on other\.html$",
            r'next-page link a\.right-next "next": link to http://127\.0\.0\.1:\d+/gone\.html:'
            r" no such page \(gone\.html\)$",
        ],
    ),
    "console_error.html": (
        '<script>console.error("the state is NaN")</script>',
        [
            r"console: console error: the state is NaN \(at http://127\.0\.0\.1:\d+/console_error\.html\)$"
        ],
    ),
    "uncaught.html": (
        '<script>throw new Error("no tile")</script>',
        [r"page: uncaught exception: no tile$"],
    ),
    "declared_twice.html": (  # what sphinx-thebe's config script did on every page
        '<script>const THEBE_JS_URL = "a";</script><script>const THEBE_JS_URL = "a";</script>',
        [r"page: uncaught exception: Identifier 'THEBE_JS_URL' has already been declared$"],
    ),
}
WITH_MATH = {"broken_formula.html", "tex_error.html", "unknown_macro.html"}
LIMIT = MAX_SCREENS * SCREEN_HEIGHT  # px: the longest a chapter page may be
LONG = {"at_the_limit.html": LIMIT, "over_the_limit.html": LIMIT + 1}  # page: its height


def write_page(folder: Path, name: str, body: str, mathjax: bool = True) -> None:
    head = HEAD.replace("{mathjax}", MATHJAX_TAG if mathjax else "")
    (folder / name).write_text(head + body + TAIL, encoding="utf-8")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A folder of fixture pages served on 127.0.0.1: (url, folder)."""
    folder = tmp_path_factory.mktemp("site")
    shutil.copytree(MATHJAX, folder / "mathjax")
    for name, width in (("dot.svg", 8), ("wide.svg", 2000)):
        (folder / name).write_text(
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="8">'
            f'<rect width="{width}" height="8"/></svg>'
        )
    write_page(folder, "index.html", CLEAN + MATH)
    write_page(folder, "other.html", '<h1 id="there">Another page</h1>', mathjax=False)
    for name, (defect, _) in DEFECTS.items():
        if name in WITH_MATH:
            write_page(folder, name, CLEAN + MATH + defect)
        else:  # MathJax takes a while to start, and these pages have no formula
            write_page(folder, name, CLEAN + defect, mathjax=False)
    write_page(folder, "no_mathjax.html", CLEAN + MATH, mathjax=False)
    for name, height in LONG.items():  # nothing but a block of that height
        (folder / name).write_text(
            '<!DOCTYPE html><html><head><meta charset="utf-8"><title>long</title></head>'
            f'<body style="margin: 0"><div style="height: {height}px"></div></body></html>\n'
        )
    redirect = '<meta http-equiv="Refresh" content="0; url=gone.html" />'
    (folder / "redirect.html").write_text(redirect)
    with serve(folder) as url:
        yield url, folder


@pytest.fixture(scope="module")
def context(browser):
    """One browser context for all fixture pages: MathJax is compiled once."""
    shared = new_context(browser)
    yield shared
    shared.close()


def problems(context, site, page: str) -> list[str]:
    url, folder = site
    report = check_page(context, url, folder, page)
    assert all(line.startswith(f"{page}: ") for line in report.problems), report.problems
    return report.problems


def test_a_clean_page_has_no_problems(context, site):
    assert problems(context, site, "index.html") == []


@pytest.mark.parametrize("page", DEFECTS)
def test_a_planted_defect_is_reported(context, site, page):
    patterns = DEFECTS[page][1]
    found = problems(context, site, page)
    report = "\n".join(found)
    assert len(found) == len(patterns), report
    for line, pattern in zip(found, patterns, strict=True):
        assert re.search(pattern, line), f"{line!r} does not match {pattern!r}"


def test_formulas_left_raw_without_mathjax(context, site):
    assert problems(context, site, "no_mathjax.html") == [
        "no_mathjax.html: page: MathJax did not load, 2 formulas left as raw TeX"
    ]


def test_a_redirect_to_a_missing_page(context, site):
    (line,) = problems(context, site, "redirect.html")
    assert line.startswith("redirect.html: <meta http-equiv=refresh>: redirect to http://")
    assert line.endswith("/gone.html: no such page (gone.html)")


@pytest.mark.parametrize("page", LONG)
def test_a_page_is_photographed_whole_and_held_to_the_length_limit(context, site, page, tmp_path):
    url, folder = site
    shot = tmp_path / "page.png"
    report = check_page(context, url, folder, page, shot)
    assert report.problems == []
    assert report.height == LONG[page] and png_size(shot) == (WINDOW["width"], LONG[page])
    if LONG[page] <= LIMIT:
        assert too_long(page, report.height) is None
    else:
        assert too_long(page, report.height) == (
            f"{page}: page: 25.0 screens long (25001 px at 1280 px wide, a screen 1000 px),"
            " over the limit of 25 screens"
        )
