"""Checkers for chapters 1 and 2: safe softmax and online softmax.

Each checker runs the reader's function on ordinary and adversarial inputs
(scores near +-1000, the maximum at the start or the end of the row, ties,
ragged tails, block size 1 and larger than N, N = 1, -inf entries, rows of a
batch), compares with a float64 reference, and returns a ``CheckResult``. The
inputs are built in ``_cases``; ``_run`` calls the function, ``_answer`` says
what it may return.

When an answer is wrong, the checker also runs the known-wrong algorithms of
``_softmax_mistakes`` (no rescaling, rescaling the wrong way, the stale maximum,
off-by-one tiles, no shift: overflow or underflow...) on the same inputs. A
mistake is named when the reader's outputs match what that wrong algorithm
returns: on every case if possible, otherwise on the failing case.

Tolerances. Every input is float64 and every expected value is computed in
float64. A correct float64 online softmax differs from the two-pass reference
only by rounding: at most N + N/Bc roundings of relative size 2**-53 = 1.1e-16
in ``l`` (N <= 37 here), plus the error of ``exp``, which is relative to its
argument (|x - m| * 1.1e-16 <= 2.2e-13 for scores spanning -1000 to 1000).
Measured on these inputs with block sizes 1, 2, 3, 64 and the cases' own, three
independent correct implementations (a per-row loop in Python floats,
flashref.online_softmax, a log-sum-exp softmax) agree to a relative 4.8e-14.
``RTOL = 1e-10`` leaves a factor of 2000 over that, while every named mistake
is wrong by 0.6 or more, or NaN, on some case. Softmax outputs are
probabilities whose row sums to 1, so an absolute error of ``ATOL = 1e-15``
(a few roundings of a value near 1) is relative to the row total; it lets
values below 1e-15 differ in the last bits of an underflowing ``exp``. A
float32 computation misses ``RTOL`` by a factor of 10**3 or more and is named
as such.
"""

from __future__ import annotations

import numpy as np

from ..softmax import safe_softmax
from ._answer import array_answer, excess
from ._cases import softmax_inputs
from ._report import PRECISION, CheckResult
from ._run import Case, check_callable, checker, float32_band, run
from ._softmax_mistakes import (
    BLOCK_NORM,
    GLOBAL_MAX,
    M0_ZERO,
    MIN_SHIFT,
    NO_GUARD,
    NO_MAX,
    NO_MAX_BOTH,
    NO_MAX_UNDERFLOW,
    NO_RESCALE,
    OFF_BY_ONE,
    STALE_MAX,
    WRONG_AXIS,
    WRONG_WAY,
    name_mistakes,
    wrong_online_softmax,
    wrong_safe_softmax,
)

__all__ = [
    "check_safe_softmax",
    "check_online_softmax",
    # the mistakes these checkers can name
    "NO_RESCALE",
    "WRONG_WAY",
    "STALE_MAX",
    "OFF_BY_ONE",
    "NO_MAX",
    "NO_MAX_UNDERFLOW",
    "NO_MAX_BOTH",
    "NO_GUARD",
    "M0_ZERO",
    "BLOCK_NORM",
    "GLOBAL_MAX",
    "MIN_SHIFT",
    "WRONG_AXIS",
    "PRECISION",
]

RTOL = 1e-10  # see the module docstring
ATOL = 1e-15  # absolute, in units of the row total (softmax rows sum to 1)


def where_worst(expected: np.ndarray, value: np.ndarray, tol, what: str = "position") -> str:
    """'row 2, column 9: expected 0.0312, got 0.5' for the element furthest outside ``tol``."""
    ratio = excess(expected, value, tol)
    idx = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    if len(idx) == 0:
        where = "value"
    elif len(idx) == 1:
        where = f"{what} {idx[0]}"
    else:
        where = f"row {idx[0]}, column {idx[1]}"
    return f"{where}: expected {expected[idx]:.6g}, got {value[idx]:.6g}"


def finite_abs(x: np.ndarray) -> np.ndarray:
    """|x|, with 0 for the infinite entries (masked scores round to nothing)."""
    return np.where(np.isfinite(x), np.abs(x), 0.0)


def _softmax_case(label, args, x, wrong) -> Case:
    """A case whose answer is the softmax of ``x``: a float64 array of its shape."""
    expected = safe_softmax(x)
    tol = ATOL + RTOL * expected
    # float32 rounds each x, its maximum, and N terms of the sum (see _run)
    magnitude = finite_abs(x) + finite_abs(x).max(axis=-1, keepdims=True) + x.shape[-1]
    tol32 = ATOL + float32_band(magnitude * expected)
    return Case(
        label,
        args,
        expected,
        accept=lambda got: array_answer(got, expected.shape, np.float64, "p"),
        distance=lambda value: float(excess(expected, value, tol).max(initial=0.0)),
        describe=lambda value: where_worst(expected, value, tol),
        within_float32=lambda value: bool((excess(expected, value, tol32) <= 1).all()),
        wrong=wrong,
    )


# --- the checkers ----------------------------------------------------------------------


@checker
def check_safe_softmax(fn) -> CheckResult:
    """Check ``fn(x) -> softmax of x along the last axis`` (x float64, 1-D or 2-D).

    The answer must be a float64 numpy array shaped like ``x``.
    """
    check_callable(fn, "fn(x) -> softmax of x")
    cases = [
        _softmax_case(
            f"{inp.whole_row_label}: x {inp.x.shape}",
            (inp.x,),
            inp.x,
            lambda x=inp.x: wrong_safe_softmax(x),
        )
        for inp in softmax_inputs()
        if inp.whole_row_label is not None  # the others only vary the block size
    ]
    return run("check_safe_softmax", fn, cases, name_mistakes)


@checker
def check_online_softmax(fn) -> CheckResult:
    """Check ``fn(x, block_size) -> softmax of x along the last axis``, streamed in blocks.

    ``x`` is float64, 1-D ``(N,)`` or 2-D ``(rows, N)``; the answer must be a
    float64 numpy array of the same shape and equal the two-pass softmax up to
    rounding.
    """
    check_callable(fn, "fn(x, block_size) -> softmax of x")
    cases = [
        _softmax_case(
            f"{inp.label}: x {inp.x.shape}, block_size={inp.block}",
            (inp.x, inp.block),
            inp.x,
            lambda x=inp.x, B=inp.block: wrong_online_softmax(x, B),
        )
        for inp in softmax_inputs()
    ]
    return run("check_online_softmax", fn, cases, name_mistakes)
