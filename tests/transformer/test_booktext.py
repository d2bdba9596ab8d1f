"""The training text of chapter 8: the book's prose, its character codes, seeded batches."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flashref.transformer.booktext import ROOT, CharCorpus, book_text


def test_the_text_is_the_books_prose():
    text = book_text()
    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    assert text.startswith((ROOT / "book" / "glossary.md").read_text(encoding="utf-8")[:200])
    assert intro in text
    assert "autofunction" not in text  # the API reference page is not prose
    cells = json.loads((ROOT / "notebooks" / "01_softmax.ipynb").read_text())["cells"]
    prose = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert all(p in text for p in prose)
    assert not any(c in text for c in code if len(c) > 200)  # code cells are not prose


def test_a_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no \*\.md files in .*book"):
        book_text(tmp_path)
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "a.md").write_text("some prose\n")
    with pytest.raises(FileNotFoundError, match=r"no \*\.ipynb files in .*notebooks"):
        book_text(tmp_path)


def test_a_small_repository(tmp_path):
    (tmp_path / "book").mkdir()
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "book" / "b.md").write_text("bb")
    (tmp_path / "book" / "a.md").write_text("aa")
    cells = [
        {"cell_type": "markdown", "source": ["x", "y"]},
        {"cell_type": "code", "source": ["print(1)"]},
    ]
    (tmp_path / "notebooks" / "01.ipynb").write_text(json.dumps({"cells": cells}))
    assert book_text(tmp_path) == "aa\n\nbb\n\nxy\n"


def test_codes_round_trip_and_split():
    corpus = CharCorpus("hello, world" * 10, val_fraction=0.25)
    assert corpus.chars == sorted(set("hello, world"))
    assert corpus.vocab_size == len(corpus.chars)
    assert corpus.decode(corpus.encode("lower")) == "lower"
    assert len(corpus.train) == 90 and len(corpus.val) == 30
    assert corpus.decode(corpus.val) == ("hello, world" * 10)[90:]
    with pytest.raises(ValueError, match="character 'z'"):
        corpus.encode("z")


def test_batches_are_shifted_windows_and_seeded():
    corpus = CharCorpus("".join(chr(65 + i % 26) for i in range(1000)))
    x, y = next(corpus.batches(batch_size=5, context=7, seed=3))
    assert x.shape == y.shape == (5, 7) and x.dtype == np.int64
    assert np.array_equal(x[:, 1:], y[:, :-1])  # y is x one character on
    assert np.all((x + 1) % 26 == y)  # the text is A..Z repeated
    again = corpus.batches(batch_size=5, context=7, seed=3)
    other = corpus.batches(batch_size=5, context=7, seed=4)
    same = [next(again) for _ in range(3)]
    assert np.array_equal(same[0][0], x)
    assert not np.array_equal(next(other)[0], x)
    val_x, _ = next(corpus.batches(batch_size=64, context=7, seed=0, split="val"))
    assert val_x.max() < 26


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0, "context": 4, "seed": 0}, "batch_size must be a positive int"),
        ({"batch_size": 2, "context": True, "seed": 0}, "context must be a positive int"),
        ({"batch_size": 2, "context": 4, "seed": 0, "split": "test"}, "split must be"),
        ({"batch_size": 2, "context": 50, "seed": 0, "split": "val"}, "context=50 needs more"),
    ],
)
def test_batch_arguments_are_checked(kwargs, message):
    corpus = CharCorpus("abcdefghij" * 30)
    with pytest.raises(ValueError, match=message):
        next(corpus.batches(**kwargs))


def test_corpus_arguments_are_checked():
    with pytest.raises(ValueError, match="text must be a str"):
        CharCorpus(b"bytes")
    with pytest.raises(ValueError, match="val_fraction"):
        CharCorpus("abc", val_fraction=1.0)
