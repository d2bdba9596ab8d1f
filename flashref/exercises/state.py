"""Checkers for chapter 2's running state: the streaming weighted sum, and merging states.

``check_streaming_weighted_sum(fn)`` runs ``fn(scores, values, tile_size)`` and
wants one float, ``sum(softmax(scores) * values)``; ``check_merge_states(fn)``
runs ``fn(a, b)`` on two ``SoftmaxState`` and wants their exact merge. Both
compare with float64 references; the tolerance ``RTOL`` and its reasons are in
``softmax``. The weighted sum is judged relative to ``sum(p * |values|)``, the
size of the terms being added, so results that cancel to nearly 0 are judged
fairly; a merged ``o`` likewise relative to the merge of ``|v|``. A wrong answer
is matched against the known-wrong algorithms of ``_softmax_mistakes``.
"""

from __future__ import annotations

import math

import numpy as np

from ..softmax import safe_softmax
from ..state import SoftmaxState
from ._answer import excess, float_answer, state_answer
from ._cases import rising, softmax_inputs
from ._report import PRECISION, CheckResult
from ._run import Case, check_callable, checker, float32_band, run
from ._softmax_mistakes import (
    MERGE_ADD,
    MERGE_NO_GUARD,
    MERGE_NONE,
    MERGE_ONE,
    MERGE_OTHER,
    MERGE_SHIFT_AS_M,
    NO_MAX,
    NO_MAX_UNDERFLOW,
    NO_RESCALE,
    NO_RESCALE_O,
    OFF_BY_ONE,
    STALE_MAX,
    TILE_AVERAGE,
    WRONG_WAY,
    name_mistakes,
    wrong_merges,
    wrong_weighted_sums,
)
from .softmax import ATOL, RTOL, finite_abs, where_worst

__all__ = [
    "check_streaming_weighted_sum",
    "check_merge_states",
    # the mistakes these checkers can name
    "NO_RESCALE",
    "NO_RESCALE_O",
    "WRONG_WAY",
    "STALE_MAX",
    "OFF_BY_ONE",
    "NO_MAX",
    "NO_MAX_UNDERFLOW",
    "TILE_AVERAGE",
    "MERGE_ONE",
    "MERGE_NONE",
    "MERGE_OTHER",
    "MERGE_ADD",
    "MERGE_NO_GUARD",
    "MERGE_SHIFT_AS_M",
    "PRECISION",
]


# --- streaming weighted sum -----------------------------------------------------------------


def _magnitude(s: np.ndarray) -> float:
    """What float32 rounds in a streamed sum over scores s (N,): twice max|s| and N terms."""
    return 2 * float(finite_abs(s).max()) + s.shape[-1]


def _weighted_sum_case(label, s, v, B) -> Case:
    p = safe_softmax(s)
    value = math.fsum(p * v)
    size = math.fsum(p * np.abs(v))  # the size of the terms being added
    tol, tol32 = RTOL * size, float32_band(_magnitude(s) * size)
    return Case(
        label,
        (s, v, B),
        value,
        accept=lambda got: float_answer(got, "o / l"),
        distance=lambda g: float(excess(value, g, tol)),
        describe=lambda g: f"expected {value:.9g}, got {g:.9g}",
        within_float32=lambda g: bool(excess(value, g, tol32) <= 1),
        wrong=lambda: wrong_weighted_sums(s, v, B),
    )


@checker
def check_streaming_weighted_sum(fn) -> CheckResult:
    """Check ``fn(scores, values, tile_size) -> sum(softmax(scores) * values)`` (a float).

    ``scores`` and ``values`` are float64 of shape ``(N,)``. The answer must be a
    real float (a Python float, a NumPy float or a 0-d float array).
    """
    check_callable(fn, "fn(scores, values, tile_size) -> float")
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
    for inp in softmax_inputs():
        for r, row in enumerate(np.atleast_2d(inp.x)[:2]):
            label = f"{inp.label}, example {r + 1}" if inp.x.ndim == 2 else inp.label
            inputs.append((label, row, rng.normal(0.0, 5.0, row.shape), inp.block))
    cases = [
        _weighted_sum_case(f"{desc}: scores {s.shape}, tile_size={B}", s, v, B)
        for desc, s, v, B in inputs
    ]
    return run("check_streaming_weighted_sum", fn, cases, name_mistakes)


# --- merging two states ---------------------------------------------------------------------


def _merge_case(label, a, b, ref, o_scale, magnitude) -> Case:
    """Judge a merged state's parts: m and l relative, o relative to the merge of |v|."""
    # (name, expected, absolute floor, size, what float32 rounds); |m| is inf where m = -inf
    parts = [("m", ref.m, ATOL, np.abs(ref.m), 1.0), ("l", ref.l, ATOL, ref.l, magnitude)]
    if ref.o is not None:
        parts.append(("o", ref.o, 0.0, o_scale, magnitude))
    tols = [floor + RTOL * size for _, _, floor, size, _ in parts]
    tols32 = [floor + float32_band(size * mag) for _, _, floor, size, mag in parts]

    def distances(value, tols=tols):
        return [
            float(excess(e, g, tol).max(initial=0.0))
            for (_, e, *_), g, tol in zip(parts, value, tols, strict=True)
        ]

    def describe(value):
        worst = next(i for i, d in enumerate(distances(value)) if d > 1)
        name, e, *_ = parts[worst]
        return f"{name}, {where_worst(e, value[worst], tols[worst], what='row')}"

    return Case(
        label,
        (a, b),
        tuple(e for _, e, *_ in parts),
        accept=lambda got: state_answer(got, {name: e.shape for name, e, *_ in parts}),
        distance=lambda value: max(distances(value)),
        describe=describe,
        within_float32=lambda value: max(distances(value, tols32)) <= 1,
        wrong=lambda: wrong_merges(a, b),
    )


@checker
def check_merge_states(fn, with_o: bool = False) -> CheckResult:
    """Check ``fn(a, b) -> SoftmaxState`` merging two partial states over disjoint scores.

    The states have rows of shape ``(R,)``; ``m`` must be the larger maximum and
    ``l`` the sum over both score sets on that scale. With ``with_o=True`` the
    states also carry an unnormalised output ``o (R, dv)`` that must be merged too.
    """
    check_callable(fn, "fn(a, b) -> SoftmaxState")
    if not isinstance(with_o, bool | np.bool_):
        raise TypeError(f"with_o must be True or False, got {with_o!r}")
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
        label = f"{desc}: rows {a.m.shape}" + (f", dv={v.shape[-1]}" if with_o else "")
        cases.append(_merge_case(label, a, b, ref, o_scale, _magnitude(s)))
    return run("check_merge_states", fn, cases, name_mistakes)
