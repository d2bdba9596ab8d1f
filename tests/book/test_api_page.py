"""The API reference page (book/api.md) lists every public function and class of
``flashref``, ``flashref.variants``, ``flashref.gpu``, ``flashref.torch``,
``flashref.exercises`` (the checkers, ``CheckResult``) and ``flashref.ring.dist``: a
public name added to the library and not to the page fails here. The page's entries are
autodoc directives, so the strict book build (``make book``) renders each from its
docstring."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import flashref
import flashref.exercises
import flashref.gpu
import flashref.variants

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "book" / "api.md"


def _documented() -> set[str]:
    names, module = set(), None
    for line in PAGE.read_text().splitlines():
        if m := re.match(r"\.\. currentmodule:: (\S+)", line):
            module = m.group(1)
        elif m := re.match(r"\.\. auto(?:function|class):: (\S+)", line):
            names.add(f"{module}.{m.group(1)}")
    return names


def _public(module) -> set[str]:
    """The callables (functions and classes) a module exports in ``__all__``."""
    return {f"{module.__name__}.{n}" for n in module.__all__ if callable(getattr(module, n))}


def _torch_public() -> set[str]:
    """flashref.torch's public functions, read from its source (torch may be absent)."""
    tree = ast.parse((ROOT / "flashref" / "torch.py").read_text())
    listed = next(
        n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__"
    )
    names = {e.value for e in listed.elts}
    plain = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.decorator_list}
    return {f"flashref.torch.{n}" for n in names & plain}


def _dist_public() -> set[str]:
    """flashref.ring.dist's public functions, read from its source (it imports torch)."""
    tree = ast.parse((ROOT / "flashref" / "ring" / "dist.py").read_text())
    return {
        f"flashref.ring.dist.{n.name}"
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")
    }


def test_every_public_function_and_class_is_on_the_api_page():
    documented = _documented()
    want = _public(flashref) | _public(flashref.gpu) | _torch_public()
    want |= _public(flashref.exercises) | _public(flashref.variants) | _dist_public()
    want -= {"flashref.gpu.Version", "flashref.gpu.BwdVersion"}  # registries: chapters 5, 8
    missing = sorted(want - documented)
    assert not missing, f"book/api.md does not list: {missing}"
    assert "flashref.torch.attention" in documented


def test_the_page_is_in_the_table_of_contents():
    assert "file: book/api" in (ROOT / "_toc.yml").read_text()


def test_every_function_of_the_core_says_what_it_returns():
    """``help(flashref.tiled_attention)`` and the API page say what each call gives back."""
    import inspect

    says = re.compile(r"\breturns?\b", re.IGNORECASE)  # not return_lse
    silent = [
        n
        for n in flashref.__all__
        if inspect.isfunction(getattr(flashref, n))
        and not says.search(inspect.getdoc(getattr(flashref, n)) or "")
    ]
    assert not silent, f"these docstrings never say what the function returns: {silent}"
