"""Pieces of the CUDA sources, as the book prints them: a header's sections, a function, and
the hunks of a kernel diff that touch what a section of a chapter is about.

``section(path, heading)``: the lines of a section of a header such as
``kernels/common/hopper_common.cuh``, from its ``// ---- heading`` line up to the next
``// ----`` line. ``function(path, name)``: one function's definition with the comment
lines above it. ``hunks(diff, *words)``: the hunks of a diff made by
``flashref.gpu.forward_versions.kernel_diff`` (or any unified diff) that contain one of
``words``, with its two header lines and a last line that counts what was left out.

``lines(path, start, stop, fold=(), drop=())``: the lines from the first containing ``start``
to the first after it containing ``stop``, each ``(a, b)`` of ``fold`` kept as its first line
(a comment saying what the block does) and a count of the lines up to the one containing
``b``, and lines containing a string of ``drop`` (``#pragma unroll``) left out.

``kernel_change(old, new, family)``: what changed in the code from one version to the next,
the registry's ``kernel_diff`` without the hunks that only rename the kernel
(``drop_renames``).

Paths are relative to ``flashref/kernels`` (``KERNEL_DIR``) or absolute. The text is read
from the files each time, so a chapter prints what the sources hold today.
"""

from __future__ import annotations

import re
from pathlib import Path

from .._checks import check_block
from . import backward_versions, forward_versions
from .registry import KERNEL_DIR

__all__ = ["section", "function", "hunks", "lines", "drop_renames", "kernel_change"]

SECTION = "// ----"


def _read(path) -> list[str]:
    p = Path(path)
    if not p.is_absolute():
        p = KERNEL_DIR / p
    if not p.is_file():
        raise FileNotFoundError(f"path must name a file under {KERNEL_DIR} or a file, got {path}")
    return p.read_text().splitlines()


def section(path, heading: str) -> str:
    """The section of header ``path`` whose ``// ---- `` line starts with ``heading``."""
    lines = _read(path)
    start = next(
        (i for i, line in enumerate(lines) if line.startswith(f"{SECTION} {heading}")), None
    )
    if start is None:
        found = [line[len(SECTION) :].strip(" -") for line in lines if line.startswith(SECTION)]
        raise ValueError(f"no section {heading!r} in {path}; its sections: {found}")
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].startswith(SECTION)), len(lines)
    )
    body = lines[start:end]
    while body and not body[-1].strip():
        body.pop()
    return "\n".join(body)


def function(path, name: str) -> str:
    """The definition of function ``name`` in ``path`` (the first one), from the comment lines
    right above it to its closing brace."""
    lines = _read(path)
    pattern = re.compile(rf"\b{re.escape(name)}\s*\(")
    start = next(
        (
            i
            for i, line in enumerate(lines)
            if pattern.search(line)
            and not line.lstrip().startswith("//")
            and not line.rstrip().endswith(";")
        ),
        None,
    )
    if start is None:
        raise ValueError(f"no function {name!r} in {path}")
    first = start
    while first > 0 and lines[first - 1].lstrip().startswith(("//", "template")):
        first -= 1
    depth, seen = 0, False
    for end in range(start, len(lines)):
        code = lines[end].split("//", 1)[0]
        depth += code.count("{") - code.count("}")
        seen = seen or "{" in code
        if seen and depth == 0:
            return "\n".join(lines[first : end + 1])
    raise ValueError(f"function {name!r} in {path} has no closing brace")


def hunks(diff: str, *words: str) -> str:
    """The hunks of ``diff`` that contain one of ``words``, its header lines first; a last
    line counts the hunks left out (none when every hunk is kept)."""
    if not words:
        raise ValueError("words must name at least one word to look for")
    head, parts = [], []
    for line in diff.splitlines():
        if line.startswith("@@"):
            parts.append([line])
        elif parts:
            parts[-1].append(line)
        else:
            head.append(line)
    kept = [p for p in parts if any(w in line for line in p[1:] for w in words)]
    out = head + [line for p in kept for line in p]
    if len(kept) < len(parts):
        out.append(f"... {len(parts) - len(kept)} more of the {len(parts)} hunks in the full diff")
    return "\n".join(out)


def lines(path, start: str, stop: str, fold=(), drop=()) -> str:
    """The lines of ``path`` from the first containing ``start`` through the first later one
    containing ``stop``; each ``(a, b)`` in ``fold`` shows its line containing ``a`` and one
    line counting those after it up to (not including) the line containing ``b``; lines
    containing a string of ``drop`` are left out (and not counted)."""
    text = _read(path)
    first = next((i for i, line in enumerate(text) if start in line), None)
    if first is None:
        raise ValueError(f"no line of {path} contains {start!r}")
    last = next((i for i in range(first + 1, len(text)) if stop in text[i]), None)
    if last is None:
        raise ValueError(f"no line of {path} after {start!r} contains {stop!r}")
    body = [line for line in text[first : last + 1] if not any(d in line for d in drop)]
    for a, b in fold:
        i = next((k for k, line in enumerate(body) if a in line), None)
        j = (
            next((k for k in range(i + 1, len(body)) if b in body[k]), None)
            if i is not None
            else None
        )
        if i is None or j is None:
            raise ValueError(f"fold {(a, b)!r}: no such lines between {start!r} and {stop!r}")
        indent = body[i][: len(body[i]) - len(body[i].lstrip())]
        body[i + 1 : j] = [f"{indent}// ... {j - i - 1} lines"]
    return "\n".join(body)


def drop_renames(diff: str, old: int, new: int, kernel: str = "flash_v") -> str:
    """``diff`` (a ``kernel_diff`` of the forward or backward registry) without the hunks
    whose only change is the kernel's name, ``{kernel}{old}`` to ``{kernel}{new}``
    (``kernel`` is ``"flash_v"`` for the forward versions, ``"flash_bwd"`` for the
    backward ones)."""
    if not isinstance(diff, str):
        raise TypeError(f"diff is a {type(diff).__name__}; expected the text of a kernel diff")
    old, new = check_block(old, "old"), check_block(new, "new")
    if kernel not in KERNEL_PREFIX.values():
        raise ValueError(f"kernel = {kernel!r}; expected one of {list(KERNEL_PREFIX.values())}")
    head, hunks = [], []
    for line in diff.splitlines():
        if line.startswith("@@"):
            hunks.append([line])
        elif hunks:
            hunks[-1].append(line)
        else:
            head.append(line)

    def renames_only(hunk):
        minus = [x[1:] for x in hunk[1:] if x.startswith("-")]
        plus = [x[1:] for x in hunk[1:] if x.startswith("+")]
        renamed = [x.replace(f"{kernel}{old}(", f"{kernel}{new}(") for x in minus]
        return len(minus) == len(plus) > 0 and renamed == plus

    kept = [line for hunk in hunks if not renames_only(hunk) for line in hunk]
    return "\n".join(head + kept)


KERNEL_PREFIX = {"forward": "flash_v", "backward": "flash_bwd"}  # the main kernel's name


def kernel_change(old: int, new: int, family: str = "forward") -> str:
    """What changed in the code from version ``old`` to ``new`` of the forward
    (:func:`flashref.gpu.forward_versions.kernel_diff`) or, with ``family="backward"``, of
    the backward (:func:`flashref.gpu.backward_versions.kernel_diff`), without the hunks
    that only rename the kernel."""
    if family == "forward":
        kernel_diff = forward_versions.kernel_diff
    elif family == "backward":
        kernel_diff = backward_versions.kernel_diff
    else:
        raise ValueError(f"family = {family!r}; expected 'forward' or 'backward'")
    return drop_renames(kernel_diff(old, new), old, new, KERNEL_PREFIX[family])
