"""Checkers whose answers are integers, compared exactly at a list of points.

A case calls the reader's function at every point (a tuple of arguments) and compares the
answers, each an int or a tuple of ints, with the expected ones. A mistake is named when
it gives exactly the reader's answer at every point of the case, from the candidates
``candidates(*point) -> [(name, answer)]`` of its module; ``effect(point, answer)``, when
given, adds a line saying what the wrong answer would do. Used by the Hopper checkers and
by those of chapters 6 and 7.
"""

from __future__ import annotations

import copy
import textwrap
from functools import partial

import numpy as np

from ._answer import RETURNED_NONE, type_name
from ._report import ALL_NAN, WIDTH, CheckResult
from ._run import Case, check_callable, run
from .ring import name_mistakes


def _is_int(x) -> bool:
    return hasattr(x, "__index__") and not isinstance(x, bool)


def _is_nan(x) -> bool:
    return isinstance(x, float | np.floating) and bool(np.isnan(x))


def _one(got, size: int, what: str):
    """An int (size 1) or a tuple/list of ``size`` ints, as a tuple; or None and a problem.

    NaN in place of the answer (or of every number of a pair) is a placeholder: the report
    reads "not implemented yet", as for ``NotImplementedError``.
    """
    if got is None:
        return None, RETURNED_NONE
    if _is_nan(got) or (
        isinstance(got, tuple | list) and len(got) == size and all(map(_is_nan, got))
    ):
        return None, ALL_NAN
    if size == 1:
        if _is_int(got):
            return int(got), None
        return None, f"expected an int ({what}), got {type_name(got)} {got!r}"
    if not isinstance(got, tuple | list) or len(got) != size or not all(map(_is_int, got)):
        return None, f"expected {what}, a pair of ints, got {type_name(got)} {got!r}"
    return tuple(int(x) for x in got), None


def _table(fn, points):
    """The reader's answer at every point (each a tuple of arguments), in order. The function
    gets a copy of each point's arguments: what it does to a list it was given (a pop, a
    reverse) changes neither the expected answer nor the report."""
    return [(p, fn(*copy.deepcopy(p))) for p in points]


def _accept(size: int, what: str, call: str):
    def accept(got):
        out = []
        for p, answer in got:
            value, problem = _one(answer, size, what)
            if problem == ALL_NAN:  # a placeholder: said as it is
                return None, problem
            if problem:
                return None, f"{call}{p}: {problem}"
            out.append(value)
        return tuple(out), None

    return accept


def _case(label, points, expected, size, what, call, candidates, effect=None) -> Case:
    """One case: the reader's function at every point against ``expected`` (one answer each)."""
    expected = tuple(expected)

    def describe(value):
        bad = [i for i, (e, g) in enumerate(zip(expected, value, strict=True)) if e != g]
        i = bad[0]
        text = f"{call}{points[i]}: expected {expected[i]}, got {value[i]}"
        text += f" ({len(bad)} of {len(points)} wrong)" if len(bad) > 1 else ""
        if effect is not None:  # what the wrong wait does, wrapped as the report's lines
            text += "\n" + textwrap.fill(
                effect(points[i], value[i]), WIDTH, initial_indent="  ", subsequent_indent="  "
            )
        return text

    return Case(
        label,
        (points,),  # run calls _table(fn, points)
        expected,
        accept=_accept(size, what, call),
        distance=lambda value: 0.0 if value == expected else float("inf"),
        describe=describe,
        within_float32=lambda value: False,  # integers: no rounding to blame
        wrong=(points, candidates),
    )


def _mistakes(case, value) -> list[str]:
    """The mistakes that give exactly the reader's answer, at every point of the case."""
    points, candidates = case.wrong
    found = None
    for p, got in zip(points, value, strict=True):
        here = [name for name, c in candidates(*p) if c == got]
        found = here if found is None else [name for name in found if name in here]
        if not found:
            return []
    return list(dict.fromkeys(found))


def check_exercise(exercise, fn, signature, cases) -> CheckResult:
    check_callable(fn, signature)
    built = [_case(*case) for case in cases]
    return run(exercise, partial(_table, fn), built, partial(name_mistakes, matches=_mistakes))
