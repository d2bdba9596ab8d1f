"""Checkers for the book's exercises.

Each ``check_*`` function runs a reader's function on ordinary and adversarial
inputs, compares with flashref's float64 reference, and returns a
``CheckResult``: it prints as a short report saying which case failed (shape,
parameters, row), expected against got, and, where the error matches a known
mistake (no rescaling, rescaling the wrong way, off-by-one tile bounds, wrong
causal alignment...), the mistake's name. ``bool(result)`` is True when every
case passed.

    from flashref.exercises import check_online_softmax
    check_online_softmax(my_online_softmax)
"""

from __future__ import annotations

import importlib

from ._report import CheckResult, Failure

# checker name -> submodule that defines it (loaded on first use)
_CHECKERS = {
    "check_online_softmax": "softmax",
    "check_merge_states": "softmax",
    "check_streaming_weighted_sum": "softmax",
    "check_safe_softmax": "softmax",
    "check_one_query_attention": "attention",
    "check_tiled_attention": "attention",
}

__all__ = ["CheckResult", "Failure", *_CHECKERS]


def __getattr__(name: str):
    if name in _CHECKERS:
        module = importlib.import_module(f".{_CHECKERS[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
