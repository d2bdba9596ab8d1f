"""Checkers for the softmax chapters: safe softmax, online softmax, merge, streaming sum.

Each checker runs the reader's function on ordinary and adversarial inputs
(scores near +-1000, the maximum in the first or the last block, ties, ragged
tails, block size 1 and larger than N, N = 1, -inf entries, rows of a batch),
compares with a float64 reference, and returns a ``CheckResult``.

When an answer is wrong, the checker also runs the known-wrong algorithms of
``_softmax_mistakes`` (no rescaling, rescaling the wrong way, off-by-one tiles,
...) on the same inputs. A mistake is named when the reader's outputs match what
that wrong algorithm returns: on every case if possible, otherwise on the
failing case. The inputs are built in ``_cases``.

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
values below 1e-15 differ in the last bits of an underflowing ``exp``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..softmax import safe_softmax
from ..state import SoftmaxState
from ._cases import rising, softmax_inputs
from ._report import NOT_IMPLEMENTED, CheckResult, Failure, array_problem
from ._softmax_mistakes import (
    BLOCK_NORM,
    GLOBAL_MAX,
    M0_ZERO,
    MERGE_ADD,
    MERGE_NO_GUARD,
    MERGE_NONE,
    MERGE_ONE,
    MERGE_OTHER,
    MIN_SHIFT,
    NO_GUARD,
    NO_MAX,
    NO_RESCALE,
    NO_RESCALE_O,
    OFF_BY_ONE,
    TILE_AVERAGE,
    WRONG_AXIS,
    WRONG_WAY,
    name_mistakes,
    wrong_merges,
    wrong_online_softmax,
    wrong_safe_softmax,
    wrong_weighted_sums,
)

__all__ = [
    "check_safe_softmax",
    "check_online_softmax",
    "check_streaming_weighted_sum",
    "check_merge_states",
    # the mistakes the checkers can name
    "NO_RESCALE",
    "NO_RESCALE_O",
    "WRONG_WAY",
    "OFF_BY_ONE",
    "NO_MAX",
    "NO_GUARD",
    "M0_ZERO",
    "BLOCK_NORM",
    "TILE_AVERAGE",
    "GLOBAL_MAX",
    "MIN_SHIFT",
    "WRONG_AXIS",
    "MERGE_ONE",
    "MERGE_NONE",
    "MERGE_OTHER",
    "MERGE_ADD",
    "MERGE_NO_GUARD",
]

RTOL = 1e-10  # see the module docstring
ATOL = 1e-15  # absolute, in units of the row total (softmax rows sum to 1)


@dataclass
class _Case:
    label: str  # "scores near 1000: x (3, 20), block_size=4"
    args: tuple  # what fn is called with (copied before each call)
    expected: object  # the float64 reference
    compare: Callable  # (expected, got) -> problem string or None
    wrong: Callable  # () -> [(mistake name, what that wrong algorithm returns)]


def _run(exercise: str, fn, cases: list[_Case]) -> CheckResult:
    """Call ``fn`` on every case, collect failures, then name the likely mistakes."""
    result = CheckResult(exercise)
    ran = []  # (case, got, failure index or None)
    for case in cases:
        result.cases_run += 1
        args = [_copy(a) for a in case.args]  # fn may modify its inputs
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                got = fn(*args)
            except NotImplementedError:
                result.failures.append(Failure(case.label, NOT_IMPLEMENTED))
                return result
            except Exception as exc:
                result.failures.append(Failure(case.label, f"raised {type(exc).__name__}: {exc}"))
                continue
        problem = case.compare(case.expected, got)
        if problem is None:
            ran.append((case, got, None))
            continue
        problem = "\n  " + problem  # the report prints "- case: problem": one line each
        heard = sorted({str(w.message) for w in caught})
        if heard:
            problem += f"\n  NumPy warned: {'; '.join(heard)}"
        ran.append((case, got, len(result.failures)))
        result.failures.append(Failure(case.label, problem))
    if any(i is not None for _, _, i in ran):
        name_mistakes(result, ran)
    return result


def _compare_array(expected: np.ndarray, got, scale=None, what: str = "position") -> str | None:
    """NaN-safe relative comparison, naming the worst element by row and column.

    The tolerance is ``ATOL + RTOL * |expected|``, or ``RTOL * scale`` when a
    scale (the size of the terms that were summed) is given.
    """
    if isinstance(got, np.generic | list | tuple | float):
        try:
            got = np.asarray(got, dtype=np.float64)
        except (TypeError, ValueError):
            pass
    problem = array_problem(expected, got)
    if problem:
        return problem
    if got.dtype != expected.dtype:
        return f"expected dtype {expected.dtype} (the input's), got {got.dtype}"
    with np.errstate(invalid="ignore"):
        err = np.abs(got - expected)
    err = np.where(np.isnan(got) | np.isnan(err), np.inf, err)  # a NaN never passes
    err = np.where(got == expected, 0.0, err)  # equal infinities and zeros match
    tol = ATOL + RTOL * np.abs(expected) if scale is None else RTOL * scale
    excess = err - tol
    if (excess <= 0).all():
        return None
    idx = np.unravel_index(int(np.argmax(excess)), excess.shape)
    if len(idx) == 0:
        where = "value"
    elif len(idx) == 1:
        where = f"{what} {idx[0]}"
    else:
        where = f"row {idx[0]}, column {idx[1]}"
    return f"{where}: expected {expected[idx]:.6g}, got {got[idx]:.6g}"


def _copy(a):
    if isinstance(a, SoftmaxState):
        return SoftmaxState(a.m.copy(), a.l.copy(), None if a.o is None else a.o.copy())
    return a.copy() if isinstance(a, np.ndarray) else a


# --- the checkers ----------------------------------------------------------------------


def check_safe_softmax(fn) -> CheckResult:
    """Check ``fn(x) -> softmax of x along the last axis`` (x float64, 1-D or 2-D)."""
    cases = [
        _Case(
            f"{desc}: x {x.shape}",
            (x,),
            safe_softmax(x),
            _compare_array,
            lambda x=x: wrong_safe_softmax(x),
        )
        for desc, x, _ in softmax_inputs()
        if not desc.startswith("block size")  # those two only vary the block size
    ]
    return _run("check_safe_softmax", fn, cases)


def check_online_softmax(fn) -> CheckResult:
    """Check ``fn(x, block_size) -> softmax of x along the last axis``, streamed in blocks.

    ``x`` is float64, 1-D ``(N,)`` or 2-D ``(rows, N)``; the answer must be
    float64 of the same shape and equal the two-pass softmax up to rounding.
    """
    cases = [
        _Case(
            f"{desc}: x {x.shape}, block_size={B}",
            (x, B),
            safe_softmax(x),
            _compare_array,
            lambda x=x, B=B: wrong_online_softmax(x, B),
        )
        for desc, x, B in softmax_inputs()
    ]
    return _run("check_online_softmax", fn, cases)


# --- streaming weighted sum -----------------------------------------------------------------


def _compare_float(expected: tuple[float, float], got) -> str | None:
    """``expected`` is (value, scale): the tolerance is RTOL * sum(p * |v|)."""
    value, scale = expected
    try:
        g = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        return f"expected a float, got {type(got).__name__}"
    if g.size != 1:
        return f"expected a single float, got an array of shape {g.shape}"
    g = float(g.reshape(()))
    if not abs(g - value) <= RTOL * scale:  # NaN fails this test
        return f"expected {value:.9g}, got {g:.9g}"
    return None


def check_streaming_weighted_sum(fn) -> CheckResult:
    """Check ``fn(scores, values, tile_size) -> sum(softmax(scores) * values)`` (a float).

    ``scores`` and ``values`` are float64 of shape ``(N,)``. The tolerance is
    relative to ``sum(p * |values|)``, the size of the terms being added, so
    results that cancel to nearly 0 are judged fairly.
    """
    rng = np.random.default_rng(20240602)
    seed_scores = 1000.0 + np.log(np.arange(1.0, 5.0))
    seed_values = np.array([10.0, 20.0, 30.0, 40.0])
    inputs = [
        (
            "the worked example (1000 + log i; values 10, 20, 30, 40)",
            seed_scores,
            seed_values,
            B,
        )
        for B in (1, 2, 4)
    ]
    for desc, x, B in softmax_inputs():
        for r, row in enumerate(np.atleast_2d(x)[:2]):
            label = f"{desc}, example {r + 1}" if np.ndim(x) == 2 else desc
            inputs.append((label, row, rng.normal(0.0, 5.0, row.shape), B))
    cases = []
    for desc, s, v, B in inputs:
        p = safe_softmax(s)
        expected = (math.fsum(p * v), math.fsum(p * np.abs(v)))
        cases.append(
            _Case(
                f"{desc}: scores {s.shape}, tile_size={B}",
                (s, v, B),
                expected,
                _compare_float,
                lambda s=s, v=v, B=B: wrong_weighted_sums(s, v, B),
            )
        )
    return _run("check_streaming_weighted_sum", fn, cases)


# --- merging two states ---------------------------------------------------------------------


def _compare_state(expected, got) -> str | None:
    """``expected`` is (m, l, o, |o| scale); m and l relative, o relative to the scale."""
    m, l, o, o_scale = expected
    if not (hasattr(got, "m") and hasattr(got, "l")):
        return f"expected a SoftmaxState (with .m and .l), got {type(got).__name__}"
    for name, e, g, scale in (
        ("m", m, got.m, None),
        ("l", l, got.l, None),
        ("o", o, got.o, o_scale),
    ):
        if e is None:
            continue
        problem = _compare_array(e, g, scale, what="row")
        if problem:
            return f"{name}, {problem}"
    return None


def check_merge_states(fn, with_o: bool = False) -> CheckResult:
    """Check ``fn(a, b) -> SoftmaxState`` merging two partial states over disjoint scores.

    The states have rows of shape ``(R,)``; ``m`` must be the larger maximum and
    ``l`` the sum over both score sets on that scale. With ``with_o=True`` the
    states also carry an unnormalised output ``o (R, dv)`` that must be merged too.
    """
    rng = np.random.default_rng(20240603)
    empty = np.full(5, -np.inf)

    def rows(*rs):
        return np.stack(rs)

    pairs = [
        ("a holds the larger maximum", rows(rising(rng, (6,), 2, 9)), rows(rng.normal(0, 1, 5))),
        ("b holds the larger maximum", rows(rng.normal(0, 1, 6)), rows(rising(rng, (5,), 2, 9))),
        ("rows of a batch", rng.normal(0, 3, (4, 6)), rng.normal(0, 3, (4, 5))),
        ("equal maxima (ties)", rows([1.0, 4.0, 4.0, 0.0, 2.0, 3.0]), rows([4.0, 4.0, -1, 0, 2])),
        (
            "a near 1000, b near -1000",
            1000 + rng.normal(0, 2, (3, 6)),
            -1000 + rng.normal(0, 2, (3, 5)),
        ),
        (
            "a near -1000, b near 1000",
            -1000 + rng.normal(0, 2, (3, 6)),
            1000 + rng.normal(0, 2, (3, 5)),
        ),
        ("both near 1000", 1000 + rng.normal(0, 2, (2, 6)), 1003 + rng.normal(0, 2, (2, 5))),
        (
            "one state empty (m = -inf, l = 0)",
            rows(np.full(6, -np.inf), rng.normal(0, 1, 6)),
            rows(rng.normal(0, 1, 5), empty),
        ),
        (
            "both states empty in row 0",
            rows(np.full(6, -np.inf), rng.normal(0, 1, 6)),
            rows(empty, rng.normal(0, 1, 5)),
        ),
    ]
    cases = []
    for desc, s_a, s_b in pairs:
        # The rows are queries sharing one set of keys and values, as in attention.
        v_a = rng.normal(0, 1, (s_a.shape[-1], 3)) if with_o else None  # (n_a, dv)
        v_b = rng.normal(0, 1, (s_b.shape[-1], 3)) if with_o else None  # (n_b, dv)
        a, b = SoftmaxState.from_scores(s_a, v_a), SoftmaxState.from_scores(s_b, v_b)
        s = np.concatenate([s_a, s_b], axis=-1)  # (R, n_a + n_b)
        v = None if v_a is None else np.concatenate([v_a, v_b])  # (n_a + n_b, dv)
        ref = SoftmaxState.from_scores(s, v)
        o_scale = None if v is None else SoftmaxState.from_scores(s, np.abs(v)).o
        cases.append(
            _Case(
                f"{desc}: rows {a.m.shape}" + (f", dv={v.shape[-1]}" if with_o else ""),
                (a, b),
                (ref.m, ref.l, ref.o, o_scale),
                _compare_state,
                lambda a=a, b=b: wrong_merges(a, b),
            )
        )
    return _run("check_merge_states", fn, cases)
