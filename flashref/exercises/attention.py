"""Checkers for chapters 3 and 4: streaming attention for one query, and the tiled loop.

``check_one_query_attention(fn)`` runs ``fn(q, K, V, tile_size)`` with
``q (d,)``, ``K (N, d)``, ``V (N, dv)``; ``fn`` should return the ``(dv,)``
attention output of that one query, visiting ``tile_size`` keys at a time.

``check_tiled_attention(fn)`` runs ``fn(q, k, v, block_q, block_k, causal)``
with ``q (Nq, d)``, ``k (Nk, d)``, ``v (Nk, dv)``; ``fn`` should return
``O (Nq, dv)`` exactly as ``flashref.tiled_attention`` does (``causal`` aligned
top-left: query ``i`` sees keys ``j <= i``).

Both use the scale ``1/sqrt(d)``, float64 inputs, and compare with
``flashref.naive_attention`` in float64. When an output is wrong, the checker
also runs the known-wrong algorithms of ``_attention_mistakes`` on the same
input; if one of them reproduces the output, the report names that mistake.
The inputs are built in ``_cases``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..attention import naive_attention
from ._attention_mistakes import (
    BOTTOM_RIGHT,
    DIVIDE_INSIDE,
    NO_RESCALE,
    NO_SHIFT,
    OFF_BY_ONE,
    PER_TILE,
    STRICT_CAUSAL,
    WRONG_WAY,
    candidates,
    simulate_tiled,
)
from ._cases import one_query_cases, tiled_cases
from ._report import NOT_IMPLEMENTED, CheckResult, Failure, array_problem

__all__ = [
    "check_one_query_attention",
    "check_tiled_attention",
    # what a report can say
    "NOT_IMPLEMENTED",
    "NO_RESCALE",
    "WRONG_WAY",
    "OFF_BY_ONE",
    "BOTTOM_RIGHT",
    "STRICT_CAUSAL",
    "PER_TILE",
    "DIVIDE_INSIDE",
    "NO_SHIFT",
]

# Outputs are convex combinations of the rows of V, so errors are measured against
# max|V|. Inputs are float64; a float64 solution lands within ~1e-13 of the reference
# whatever its summation order, and one that computes in float32 passes the
# moderate-score cases (errors ~1e-7) but not scores near 1000, where float32 rounds
# each score by ~6e-5. Every named mistake misses by more than 1e-2 on the cases that
# expose it (tests/test_exercises_attention.py plants each one).
TOL = 1e-5


# ---------------------------------------------------------------------------
# Comparing


def _wrong_rows(expected, got, scale, undefined=None):
    """Boolean (rows,) of rows outside tolerance (NaN-safe; NaN matches only NaN)."""
    with np.errstate(invalid="ignore"):
        err = np.abs(got - expected)
    same_special = (np.isnan(got) & np.isnan(expected)) | (np.isinf(expected) & (got == expected))
    bad = ~(same_special | (err <= TOL * scale))  # NaN err compares False: bad
    bad = bad.reshape(bad.shape[0], -1).any(axis=1)
    return bad if undefined is None else bad & ~undefined


def _diagnose(got, causal, simulate):
    """Names of the mistakes whose output equals ``got`` on this case (may be empty)."""
    names = []
    with np.errstate(all="ignore"):
        for name, kwargs in candidates(causal):
            if name in names:
                continue
            if name == WRONG_WAY and kwargs["rule"] == "wrong_way" and not np.isnan(got).all():
                continue
            candidate, undefined = simulate(**kwargs)
            scale = np.nanmax(np.abs(np.where(np.isfinite(candidate), candidate, 0)), initial=1.0)
            if not _wrong_rows(candidate, got, scale, undefined).any():
                names.append(name)
    return names


def _run(exercise, fn, cases, call, expected_of, simulate_of, describe, causal_of):
    if not callable(fn):
        raise TypeError(f"fn must be a function, got {type(fn).__name__}")
    result = CheckResult(exercise)
    for case in cases:
        result.cases_run += 1
        label = describe(case)
        try:
            got = call(fn, case)
        except NotImplementedError:
            result.failures.append(Failure(label, NOT_IMPLEMENTED))
            return result
        except Exception as exc:  # the reader's code raised: report it, keep checking
            result.failures.append(Failure(label, f"raised {type(exc).__name__}: {exc}"))
            continue
        expected, scale = expected_of(case)
        problem = array_problem(expected, got)
        if problem:
            result.failures.append(Failure(label, problem))
            continue
        if got.dtype.kind != "f":
            result.failures.append(Failure(label, f"expected a float array, got dtype {got.dtype}"))
            continue
        got = got.astype(np.float64)
        bad = _wrong_rows(expected, got, scale)
        if not bad.any():
            continue
        problem = _describe_mismatch(expected, got, bad, scale)
        names = _diagnose(got, causal_of(case), simulate_of(case))
        result.failures.append(Failure(label, problem, " or ".join(names) or None))
    return result


def _describe_mismatch(expected, got, bad, scale):
    """Where the first wrong row is, expected against got, and the largest error."""
    r = int(np.argmax(bad))
    with np.errstate(invalid="ignore"):
        err = np.abs(got - expected)
    err = np.where(np.isnan(err), np.inf, err)
    worst = float(err.max())
    if expected.ndim == 1:  # one query: the rows are the elements of the output
        where, e, g = f"element {r}", expected[r], got[r]
    else:
        c = int(np.argmax(err[r]))
        where, e, g = f"row {r} (the first wrong row), column {c}", expected[r, c], got[r, c]
    return (
        f"{where}: expected {e:.6g}, got {g:.6g}\n"
        f"  largest error {worst:.3g}; tolerance {TOL * scale:.3g} = {TOL:g} x max|V|"
    )


# ---------------------------------------------------------------------------
# The checkers


def check_one_query_attention(fn: Callable) -> CheckResult:
    """Check ``fn(q, K, V, tile_size) -> (dv,)``: attention of one query, streamed in tiles.

    ``q (d,)``, ``K (N, d)``, ``V (N, dv)``, float64; scores ``K @ q / sqrt(d)``;
    ``fn`` should visit ``tile_size`` keys at a time keeping only the running
    ``m``, ``l`` and unnormalised ``o``, and return ``o / l``. Cases include
    ``N = 1``, tile sizes 1 and larger than ``N``, ``N`` not a multiple of the
    tile size, and scores near +-1000 whose maximum is in the last tile.
    """

    def call(fn, case):
        _, q, K, V, tile = case
        return fn(q.copy(), K.copy(), V.copy(), tile)

    def expected_of(case):
        _, q, K, V, _ = case
        return naive_attention(q[None], K, V)[0], float(np.abs(V).max())

    def simulate_of(case):
        _, q, K, V, tile = case

        def simulate(**kwargs):
            O, undefined = simulate_tiled(q[None], K, V, 1, tile, False, **kwargs)
            return O[0], None

        return simulate

    def describe(case):
        label, q, K, V, tile = case
        return f"{label}: q {q.shape}, K {K.shape}, V {V.shape}, tile_size={tile}"

    return _run(
        "check_one_query_attention",
        fn,
        one_query_cases(),
        call,
        expected_of,
        simulate_of,
        describe,
        causal_of=lambda case: False,
    )


def check_tiled_attention(fn: Callable) -> CheckResult:
    """Check ``fn(q, k, v, block_q, block_k, causal) -> O (Nq, dv)``: tiled FlashAttention.

    ``q (Nq, d)``, ``k (Nk, d)``, ``v (Nk, dv)``, float64; scale ``1/sqrt(d)``;
    ``causal`` aligned top-left (query ``i`` sees keys ``j <= i``), as in
    ``flashref.tiled_attention``. Cases include ``N = 1``, ``Nq != Nk`` both
    ways with ``causal``, block sizes 1 and larger than ``N``, sizes that are
    not multiples of the blocks, and large scores peaking in the last tile.
    """

    def call(fn, case):
        _, q, k, v, Br, Bc, causal = case
        return fn(q.copy(), k.copy(), v.copy(), Br, Bc, causal)

    def expected_of(case):
        _, q, k, v, _, _, causal = case
        return naive_attention(q, k, v, causal=causal), float(np.abs(v).max())

    def simulate_of(case):
        _, q, k, v, Br, Bc, causal = case
        return lambda **kwargs: simulate_tiled(q, k, v, Br, Bc, causal, **kwargs)

    def describe(case):
        label, q, k, v, Br, Bc, causal = case
        return (
            f"{label}: q {q.shape}, k {k.shape}, v {v.shape}, "
            f"block_q={Br}, block_k={Bc}, causal={causal}"
        )

    return _run(
        "check_tiled_attention",
        fn,
        tiled_cases(),
        call,
        expected_of,
        simulate_of,
        describe,
        causal_of=lambda case: case[-1],
    )
