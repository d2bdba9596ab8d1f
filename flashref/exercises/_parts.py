"""Answers made of several arrays, ``(D, dS)`` or ``(dq, dk, dv)``, judged part by part.

The backward exercises return several arrays at once. The answer rule is ``_answer``'s
for each of them, inside a tuple of the right length. Each part has its own tolerance
(``rtol`` times the largest size of its entries) and its own float32 band, a failing
case's report names the first wrong part, and a mistake is named when its simulated
output reproduces a wrong part of the answer, with the rule of ``attention._diagnose``:
it matches to float64 rounding, or it is wrong by more than the float32 band.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._answer import RETURNED_NONE, TIGHT, array_answer, excess, type_name
from ._run import Case, float32_band, name_with


@dataclass
class PartsCase(Case):
    """A case whose answer is a tuple of arrays, each judged against its own tolerance.

    ``part_distances(value)`` lists each part's worst error in units of ``tols``; the
    mistake namer compares part by part, with ``tols32`` the float32 band of each part.
    """

    part_distances: Callable | None = None
    rtol: float = 0.0
    tols: list[float] | None = None
    tols32: list[float] | None = None


def tuple_answer(got, names, shapes):
    """Accept a tuple of plain float arrays with these shapes; the value in float64."""
    if got is None:
        return None, RETURNED_NONE
    wanted = f"({', '.join(names)})"
    if not isinstance(got, tuple):
        return None, f"expected a tuple {wanted}, got {type_name(got)}"
    if len(got) != len(names):
        return None, f"expected a tuple {wanted} of {len(names)} arrays, got {len(got)} values"
    values = []
    for name, shape, part in zip(names, shapes, got, strict=True):
        value, problem = array_answer(part, shape, None, name)
        if problem:
            return None, f"{name}: {problem}"
        values.append(value)
    return tuple(values), None


def where_wrong(expected, got, tol, rtol, name):
    """The first wrong entry of one array, expected against got, and the largest error."""
    bad = excess(expected, got, tol) > 1
    err = np.abs(got - expected)
    worst = float(np.where(np.isnan(err), np.inf, err).max())
    if expected.ndim == 1:
        i = int(np.argmax(bad))
        where, e, g = f"element {i}", expected[i], got[i]
    else:
        r = int(np.argmax(bad.any(axis=1)))
        c = int(np.argmax(bad[r]))
        where, e, g = f"row {r} (the first wrong row), column {c}", expected[r, c], got[r, c]
    return (
        f"{name}, {where}: expected {e:.6g}, got {g:.6g}\n"
        f"  largest error {worst:.3g}; tolerance {tol:.3g} = {rtol:g} x max sum of |terms|"
    )


def parts_case(label, args, names, expected, sizes, rtol, magnitude, wrong, memory=None):
    """A ``PartsCase`` for arrays named ``names``: each part within ``rtol`` times the
    largest of its ``sizes``; ``magnitude`` counts what float32 rounds (``_run``)."""
    tols = [rtol * float(s.max(initial=0.0)) for s in sizes]
    tols32 = [float32_band(magnitude * float(s.max(initial=0.0))) for s in sizes]

    def distances(value, tols=tols):
        return [
            float(excess(e, g, t).max(initial=0.0))
            for e, g, t in zip(expected, value, tols, strict=True)
        ]

    def describe(value):
        worst = next(i for i, dist in enumerate(distances(value)) if dist > 1)
        return where_wrong(expected[worst], value[worst], tols[worst], rtol, names[worst])

    return PartsCase(
        label,
        args,
        expected,
        accept=lambda got: tuple_answer(got, names, [e.shape for e in expected]),
        distance=lambda value: max(distances(value)),
        describe=describe,
        within_float32=lambda value: max(distances(value, tols32)) <= 1,
        wrong=wrong,  # (candidates, simulator returning a tuple shaped like expected), or None
        memory=memory,
        part_distances=distances,
        rtol=rtol,
        tols=tols,
        tols32=tols32,
    )


def _matches(candidate, got, tol) -> bool:
    return bool((excess(candidate, got, tol, nan_matches=True) <= 1).all())


def _diagnose(case: PartsCase, value) -> list[str]:
    """Names of the mistakes whose simulated output reproduces a wrong part of ``value``.

    ``case.wrong`` is (candidates, simulate): ``simulate(**kwargs)`` gives a candidate's
    whole tuple, or raises ValueError where the mistake does not fit the case's shapes.
    """
    candidates, simulate = case.wrong
    wrong_parts = [i for i, dist in enumerate(case.part_distances(value)) if dist > 1]
    names = []
    for name, kwargs in candidates:
        if name in names:
            continue
        try:
            simulated = simulate(**kwargs)
        except ValueError:  # a transpose that does not fit this case's shapes
            continue
        wrong_there = case.part_distances(simulated)
        for i in wrong_parts:
            if wrong_there[i] <= 1 or not _matches(simulated[i], value[i], case.tols[i]):
                continue
            tight = _matches(simulated[i], value[i], TIGHT * case.tols[i] / case.rtol)
            if tight or not _matches(simulated[i], case.expected[i], case.tols32[i]):
                names.append(name)
                break
    return names


name_part_mistakes = name_with(_diagnose)  # the namer ``_run.run`` calls
