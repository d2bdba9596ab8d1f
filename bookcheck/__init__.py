"""The built book, checked in a real browser.

Every page of ``_build/html`` is opened in headless Chromium at 1280 px with the
network closed to it, checked (console, requests, formulas, images, widths, links)
and photographed into ``_build/screenshots/``; a chapter page (under ``notebooks/``)
may be at most 25 screens of 1280 x 1000 px long; the search page must find a word
the book contains. ``make test`` runs it after the strict book build:

    .venv/bin/python -m pytest bookcheck/

``test_checker.py`` plants each defect in a small page of its own and checks that
the checker names it; ``test_book.py`` runs it on the built book.
"""
