"""Checkers for the chapter on attention variants: a window's tiles, a sink's gradient, a
softcap's derivative.

``check_window_tiles(fn)`` runs ``fn(N, Br, Bc, left)`` and wants the pair ``(visited,
masked)`` for causal attention with a sliding window ``window=(left, 0)`` (query ``i`` sees
keys ``i - left .. i``), ``Nq = Nk = N``, cut into ``Br x Bc`` tiles: the tiles a tiled loop
computes (those with a pair that may attend) and, of those, the tiles that need a mask (some
pair may not). The pairs are compared exactly with ``flashref.variants.block_mask``.

``check_sink_grad(fn)`` runs ``fn(lse, D, sink)`` with one head's rows, ``lse (B, N)`` (the
forward's log-sum-exp, the sink's term included) and ``D (B, N)`` (``rowsum(dO * O)``), and
its sink logit, a float; it wants d(loss)/d(sink), a float, to 1e-10 relative.

``check_softcap_grad(fn)`` runs ``fn(dS, S, c)`` with ``S (Br, Bc)`` the scaled scores before
the cap ``c tanh(S / c)`` and ``dS`` the gradient of the capped scores; it wants the
gradient of ``S``, an array of ``S``'s shape, to 1e-10 relative to ``max|dS|``.

Every wrong answer is checked against the mistakes of ``_variants_mistakes``
(``tests/exercises/test_exercises_variants.py`` plants each).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..variants import EMPTY, PARTIAL, block_mask
from . import _variants_mistakes as vm
from ._answer import array_answer, excess, float_answer
from ._exact import check_exercise
from ._report import CheckResult
from ._run import Case, check_callable, checker, run
from .ring import name_mistakes

__all__ = ["check_window_tiles", "check_sink_grad", "check_softcap_grad"]

RTOL = 1e-10

# --- the tiles of a sliding window ------------------------------------------------------------

# (N, Br, Bc, lefts): square and oblong tiles, N not a multiple of either, windows narrower
# than a tile, wider than several, and wider than the sequence
WINDOW = [
    (1024, 128, 64, (256, 1000, 64)),
    (1000, 64, 128, (1, 100, 5000)),
    (777, 48, 80, (31, 160, 400)),
]


def _window_reference(N, Br, Bc, left) -> tuple[int, int]:
    kinds = block_mask(N, N, Br, Bc, causal=True, window=(left, 0))
    return int((kinds != EMPTY).sum()), int((kinds == PARTIAL).sum())


@checker
def check_window_tiles(fn) -> CheckResult:
    """Check ``fn(N, Br, Bc, left) -> (visited, masked)``: the tiles of a causal sliding
    window (see the module docstring)."""
    cases = []
    for N, Br, Bc, lefts in WINDOW:
        points = [(N, Br, Bc, left) for left in lefts]
        cases.append(
            (
                f"N={N}, Br={Br}, Bc={Bc}, left in {lefts}",
                points,
                [_window_reference(*p) for p in points],
                2,
                "(visited, masked)",
                "fn",
                vm.window_candidates,
                None,
            )
        )
    return check_exercise(
        "check_window_tiles", fn, "fn(N, Br, Bc, left) -> (visited, masked)", cases
    )


# --- floats: one case, its reference and its mistakes -------------------------------------------


def _float_case(label, args, reference, mistakes, accept, size, size_text) -> Case:
    """A case whose answer is a float or an array, within ``RTOL * size`` of ``reference``
    (``size_text`` says what ``size`` is, in the report)."""
    expected = reference(*args)
    tol = RTOL * max(size, np.finfo(np.float64).tiny)

    def distance(value):
        return float(excess(expected, value, tol).max(initial=0.0))

    def describe(value):
        got, want = np.ravel(value), np.ravel(expected)
        i = int(np.argmax(excess(want, got, tol)))
        at = tuple(int(x) for x in np.unravel_index(i, np.shape(expected)))
        where = f"element {at}: " if got.size > 1 else ""
        return f"{where}expected {want[i]:.6g}, got {got[i]:.6g} (tolerance {RTOL:g} x {size_text})"

    def wrong():
        return [(name, reference(*args, mistake=key)) for key, name in mistakes.items()]

    return Case(
        label,
        args,
        expected,
        accept=accept,
        distance=distance,
        describe=describe,
        within_float32=lambda value: False,  # float64 in, float64 out
        wrong=wrong,
    )


def _float_mistakes(case, value) -> list[str]:
    """The mistakes whose answer is the reader's (to float64 rounding) and wrong here."""
    names = []
    for name, candidate in case.wrong():
        if case.distance(candidate) > 1 and case.distance(value) > 1:
            tight = 1e-9 * np.maximum(np.abs(np.asarray(candidate)), 1e-300)
            if (excess(candidate, value, tight) <= 1).all() and name not in names:
                names.append(name)
    return names


# --- the gradient of a sink -------------------------------------------------------------------


def _sink_cases():
    rng = np.random.default_rng(51)
    cases = []
    for label, B, N, sink, lse_mid in [
        ("one sequence", 1, 16, 0.5, 2.0),
        ("a batch of 3", 3, 40, -1.0, 1.0),
        ("a sink that dominates", 2, 8, 6.0, 6.5),
        ("scores near 1000", 2, 12, 1000.0, 1002.0),
    ]:
        lse = lse_mid + rng.random((B, N))  # above the sink's logit: it is one term of lse
        lse = np.maximum(lse, sink + 0.01)
        D = rng.standard_normal((B, N))
        cases.append((label, (lse, D, sink)))
    return cases


@checker
def check_sink_grad(fn) -> CheckResult:
    """Check ``fn(lse, D, sink) -> float``: the gradient of one head's sink logit (see the
    module docstring)."""
    check_callable(fn, "fn(lse, D, sink) -> dsink")
    cases = []
    for label, (lse, D, sink) in _sink_cases():
        size = float(np.sum(np.exp(sink - lse) * np.abs(D)))
        cases.append(
            _float_case(
                f"{label}: lse {lse.shape}, sink={sink:g}",
                (lse, D, sink),
                vm.sink_grad,
                vm.SINK_MISTAKES,
                partial(float_answer, what="dsink"),
                size,
                "sum|P_sink D|",
            )
        )
    return run("check_sink_grad", fn, cases, partial(name_mistakes, matches=_float_mistakes))


# --- the derivative of a softcap --------------------------------------------------------------


def _softcap_cases():
    rng = np.random.default_rng(30)
    out = []
    for label, shape, spread, c in [
        ("scores within the cap", (4, 8), 3.0, 30.0),
        ("scores past the cap", (6, 5), 80.0, 30.0),
        ("a cap of 1", (3, 7), 2.0, 1.0),
    ]:
        S = spread * rng.standard_normal(shape)
        dS = rng.standard_normal(shape)
        out.append((f"{label}: S {shape}, c={c:g}", (dS, S, c)))
    return out


@checker
def check_softcap_grad(fn) -> CheckResult:
    """Check ``fn(dS, S, c) -> dS_before``: the gradient back through ``c tanh(S / c)`` (see
    the module docstring)."""
    check_callable(fn, "fn(dS, S, c) -> gradient of S")
    cases = []
    for label, (dS, S, c) in _softcap_cases():
        cases.append(
            _float_case(
                label,
                (dS, S, c),
                vm.softcap_grad,
                vm.SOFTCAP_MISTAKES,
                partial(array_answer, shape=S.shape, what="the gradient of S"),
                float(np.abs(dS).max()),
                "max|dS|",
            )
        )
    return run("check_softcap_grad", fn, cases, partial(name_mistakes, matches=_float_mistakes))
