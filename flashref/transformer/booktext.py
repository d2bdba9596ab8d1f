"""The book's own prose as training text: characters, their codes, and seeded batches.

A tiny language model needs some text to learn from, and this project ships one: the
prose of its own chapters. ``book_text`` reads the pages under ``book/`` and the markdown
cells of ``notebooks/*.ipynb`` from the repository, in a fixed order, and joins them.
``CharCorpus`` turns that text into integer codes (one per distinct character, sorted),
keeps the last tenth apart for validation, and draws batches of windows from a seeded
generator, so that two training runs given the same seed see the same batches in the
same order.

NumPy only: ``flashref.transformer.model`` moves the batches to torch.
"""

from __future__ import annotations

import json
import numbers
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]  # the repository, for an editable install


NOT_PROSE = ("api.md",)  # book pages that are not written prose


def book_text(root=None) -> str:
    """The prose of the book, read from the repository at ``root`` (default: this one).

    ``book/*.md`` in name order (less ``NOT_PROSE``: the API reference is directives that
    the build fills with docstrings), then the markdown cells of ``notebooks/*.ipynb`` in
    name order, each piece followed by a blank line. Raises ``FileNotFoundError`` naming the
    folder when either is missing or holds no such file (an installed copy of
    ``flashref`` without the repository beside it, say).
    """
    root = ROOT if root is None else Path(root)
    pages = sorted(p for p in (root / "book").glob("*.md") if p.name not in NOT_PROSE)
    notebooks = sorted((root / "notebooks").glob("*.ipynb"))
    for folder, found, pattern in (("book", pages, "*.md"), ("notebooks", notebooks, "*.ipynb")):
        if not found:
            raise FileNotFoundError(
                f"no {pattern} files in {root / folder}: the training text is the book's own "
                "prose, read from a checkout of the flashref repository (pass root=...)"
            )
    pieces = [p.read_text(encoding="utf-8") for p in pages]
    for path in notebooks:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        pieces += ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    return "\n\n".join(pieces) + "\n"


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


class CharCorpus:
    """A text as character codes, split into training and validation parts.

    ``chars`` are the distinct characters of ``text``, sorted; a character's code is its
    index there. The first ``1 - val_fraction`` of the text trains, the rest validates.
    """

    def __init__(self, text: str, *, val_fraction: float = 0.1):
        if not isinstance(text, str) or len(text) < 2:
            raise ValueError(f"text must be a str of at least 2 characters, got {text!r:.40}")
        if not isinstance(val_fraction, numbers.Real) or not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction must be a number in (0, 1), got {val_fraction!r}")
        self.chars = sorted(set(text))
        self._code = {c: i for i, c in enumerate(self.chars)}
        codes = self.encode(text)  # (len(text),)
        cut = int(len(codes) * (1 - val_fraction))
        self.train, self.val = codes[:cut], codes[cut:]

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """Codes of ``text`` (int64); a character outside the vocabulary is a ValueError."""
        try:
            return np.array([self._code[c] for c in text], dtype=np.int64)
        except KeyError as exc:
            raise ValueError(f"text has character {exc.args[0]!r}, not in the corpus") from None

    def decode(self, codes) -> str:
        return "".join(self.chars[int(i)] for i in codes)

    def batches(self, *, batch_size: int, context: int, seed: int, split: str = "train"):
        """An endless iterator of ``(x, y)``, both int64 ``(batch_size, context)``.

        Each row of ``x`` is a window of ``context`` consecutive codes starting at a
        position drawn from ``numpy.random.default_rng(seed)``; ``y`` is the same window
        shifted one character on (the characters to predict). The same seed gives the
        same batches in the same order.
        """
        batch_size = _positive_int(batch_size, "batch_size")
        context = _positive_int(context, "context")
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        codes = self.train if split == "train" else self.val
        if len(codes) <= context:
            raise ValueError(
                f"context={context} needs more than {context} characters; the {split} "
                f"split has {len(codes)}"
            )
        rng = np.random.default_rng(seed)
        offsets = np.arange(context + 1)  # (context + 1,)
        while True:
            starts = rng.integers(0, len(codes) - context, size=batch_size)  # (batch_size,)
            windows = codes[starts[:, None] + offsets]  # (batch_size, context + 1)
            yield windows[:, :-1], windows[:, 1:]
