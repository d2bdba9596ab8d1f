"""Checkers for chapters 3 and 4: streaming attention for one query, and the tiled loop.

``check_one_query_attention(fn)`` runs ``fn(q, K, V, tile_size)`` with
``q (d,)``, ``K (N, d)``, ``V (N, dv)``; ``fn`` should return the ``(dv,)``
attention output of that one query, visiting ``tile_size`` keys at a time.

``check_tiled_attention(fn)`` runs ``fn(q, k, v, block_q, block_k, causal)``
with ``q (Nq, d)``, ``k (Nk, d)``, ``v (Nk, dv)``; ``fn`` should return
``O (Nq, dv)`` exactly as ``flashref.tiled_attention`` does (``causal`` aligned
top-left: query ``i`` sees keys ``j <= i``).

Both use the scale ``1/sqrt(d)``, float64 inputs, and compare with
``flashref.naive_attention`` in float64; the answer must be a numpy float
array (``_answer`` says what else is refused, and why). When an output is
wrong, the checker also runs the known-wrong algorithms of
``_attention_mistakes`` on the same input; if one of them reproduces the
output, the report names that mistake. The inputs are built in ``_cases``;
``_run`` calls the function.

``check_tiled_attention`` also runs a long sequence (Nq = Nk = 2048) twice, with
tall and with wide tiles, its peak memory measured: a right answer that built the
whole ``(Nq, Nk)`` score matrix, as plain attention does, fails both, and one with
scores for a whole row or column of tiles at once fails one (``_memory``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from ..attention import naive_attention
from ._answer import TIGHT, array_answer, excess
from ._attention_mistakes import (
    BOTTOM_RIGHT,
    CAUSAL_FIRST_ROW,
    DIVIDE_INSIDE,
    NAN_EVERYWHERE,
    NO_CAUSAL,
    NO_RESCALE,
    NO_SCALE,
    NO_SHIFT,
    OFF_BY_ONE,
    PER_TILE,
    STALE_MAX,
    STRICT_CAUSAL,
    WRONG_WAY,
    candidates,
    simulate_tiled,
)
from ._cases import memory_cases, one_query_cases, tiled_cases
from ._memory import (
    NOT_TILED,
    UNTILED_KEYS,
    UNTILED_QUERIES,
    memory_verdict,
    name_untiled,
    tiled_budget,
)
from ._report import NOT_IMPLEMENTED, PRECISION, CheckResult
from ._run import Case, check_callable, checker, float32_band, name_with, run

__all__ = [
    "check_one_query_attention",
    "check_tiled_attention",
    # what a report can say
    "NOT_IMPLEMENTED",
    "NO_RESCALE",
    "WRONG_WAY",
    "STALE_MAX",
    "OFF_BY_ONE",
    "BOTTOM_RIGHT",
    "STRICT_CAUSAL",
    "NO_CAUSAL",
    "CAUSAL_FIRST_ROW",
    "PER_TILE",
    "DIVIDE_INSIDE",
    "NO_SHIFT",
    "NO_SCALE",
    "PRECISION",
    "NOT_TILED",
    "UNTILED_KEYS",
    "UNTILED_QUERIES",
]

# Outputs are convex combinations of the rows of V, so errors are measured against
# max|V|. Inputs are float64; a float64 solution lands within ~1e-13 of the reference
# whatever its summation order, and one that computes in float32 passes the
# moderate-score cases (errors ~1e-7) but not scores near 1000, where float32 rounds
# each score by ~6e-5: that failure is named float32 precision. Every named mistake
# misses by more than 1e-2 on the cases that expose it (tests/exercises/test_exercises_attention.py
# plants each one).
TOL = 1e-5


# ---------------------------------------------------------------------------
# Comparing


def _wrong_rows(expected, got, tol, undefined=None):
    """Boolean (rows,) of rows outside tolerance (NaN matches only NaN)."""
    bad = excess(expected, got, tol, nan_matches=True) > 1
    bad = bad.reshape(bad.shape[0], -1).any(axis=1)
    return bad if undefined is None else bad & ~undefined


def _diagnose(case: Case, got) -> list[str]:
    """Names of the mistakes whose output equals ``got`` on this case (may be empty).

    A mistake is named when its simulated output matches ``got`` and is wrong
    itself, either reproducing ``got`` to float64 rounding or lying outside the
    float32 band (see ``_run``): a float32 answer that misses by a hair is not
    blamed on a mistake that moves the output by a hair.
    """
    names = []
    mistakes, simulate = case.wrong
    for name, kwargs in mistakes:
        if name in names:
            continue
        if kwargs.get("rule") in NAN_EVERYWHERE and not np.isnan(got).all():
            continue  # these give NaN everywhere: a candidate only for such an answer
        candidate, undefined = simulate(**kwargs)  # the mistake's output on this case
        scale = np.nanmax(np.abs(np.where(np.isfinite(candidate), candidate, 0)), initial=1.0)
        if _wrong_rows(candidate, got, TOL * scale, undefined).any():
            continue  # it does not match
        if undefined is not None:  # rows left without keys: the mistake gives them anything
            candidate = np.where(undefined[:, None], got, candidate)
        if case.distance(candidate) <= 1:
            continue  # it is not wrong on this case
        tight = not _wrong_rows(candidate, got, TIGHT * scale, undefined).any()
        if tight or not case.within_float32(candidate):
            names.append(name)
    return names


_name_mistakes = name_with(_diagnose)


def _describe_mismatch(expected, got, tol):
    """Where the first wrong row is, expected against got, and the largest error."""
    bad = excess(expected, got, tol) > 1
    r = int(np.argmax(bad.reshape(bad.shape[0], -1).any(axis=1)))
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
        f"  largest error {worst:.3g}; tolerance {tol:.3g} = {TOL:g} x max|V|"
    )


def _case(label, args, q, k, v, expected, wrong, memory=None) -> Case:
    """A case whose answer is O, shaped like ``expected``, judged against ``TOL x max|V|``.

    ``q (Nq, d)`` and ``k (Nk, d)`` size the float32 band: float32 rounds each
    score (at most max|q| max|k| / sqrt(d)), the d terms of a score, and N terms.
    """
    d, N = q.shape[-1], k.shape[0]
    max_v = float(np.abs(v).max())
    tol = TOL * max_v
    top_score = np.linalg.norm(q, axis=-1).max() * np.linalg.norm(k, axis=-1).max() / np.sqrt(d)
    tol32 = float32_band((top_score + d + N) * max_v)
    return Case(
        label,
        args,
        expected,
        accept=lambda got: array_answer(got, expected.shape, None, "O"),
        distance=lambda value: float(excess(expected, value, tol).max(initial=0.0)),
        describe=lambda value: _describe_mismatch(expected, value, tol),
        within_float32=lambda value: bool((excess(expected, value, tol32) <= 1).all()),
        wrong=wrong,  # (mistakes to try, their simulator), or None
        memory=memory,
    )


def _one_query_case(label, q, K, V, tile) -> Case:
    def simulate(**kwargs):
        O, _ = simulate_tiled(q[None], K, V, 1, tile, False, **kwargs)
        return O[0], None

    return _case(
        f"{label}: q {q.shape}, K {K.shape}, V {V.shape}, tile_size={tile}",
        (q, K, V, tile),
        q,
        K,
        V,
        naive_attention(q[None], K, V)[0],
        (candidates(False), simulate),
    )


def _tiled_case(label, q, k, v, Br, Bc, causal, measure_memory=False) -> Case:
    blocks = f"block_q={Br}, block_k={Bc}"
    if measure_memory:  # too large to simulate every mistake on: the small cases name them
        budget = tiled_budget(len(q), len(k), q.shape[1], v.shape[1], Br, Bc)
        wrong = None
        untiled = UNTILED_KEYS if Br > Bc else UNTILED_QUERIES  # what this tile shape shows
        memory = lambda peak: memory_verdict(peak, len(q), len(k), budget, blocks, untiled)  # noqa: E731
    else:
        simulate = lambda **kw: simulate_tiled(q, k, v, Br, Bc, causal, **kw)  # noqa: E731
        wrong, memory = (candidates(causal), simulate), None
    return _case(
        f"{label}: q {q.shape}, k {k.shape}, v {v.shape}, {blocks}, causal={causal}",
        (q, k, v, Br, Bc, causal),
        q,
        k,
        v,
        naive_attention(q, k, v, causal=causal),
        wrong,
        memory,
    )


@functools.cache
def _long_cases() -> tuple[Case, ...]:
    """The memory cases, built once per session: their float64 references take 0.1 s each."""
    return tuple(_tiled_case(*case, measure_memory=True) for case in memory_cases())


# ---------------------------------------------------------------------------
# The checkers


@checker
def check_one_query_attention(fn: Callable) -> CheckResult:
    """Check ``fn(q, K, V, tile_size) -> (dv,)``: attention of one query, streamed in tiles.

    ``q (d,)``, ``K (N, d)``, ``V (N, dv)``, float64; scores ``K @ q / sqrt(d)``;
    ``fn`` should visit ``tile_size`` keys at a time keeping only the running
    ``m``, ``l`` and unnormalised ``o``, and return ``o / l``. Cases include
    ``N = 1``, tile sizes 1 and larger than ``N``, ``N`` not a multiple of the
    tile size, and scores near +-1000 whose maximum is in the last tile.
    """
    check_callable(fn, "fn(q, K, V, tile_size) -> o (dv,)")
    cases = [_one_query_case(*case) for case in one_query_cases()]
    return run("check_one_query_attention", fn, cases, _name_mistakes)


@checker
def check_tiled_attention(fn: Callable) -> CheckResult:
    """Check ``fn(q, k, v, block_q, block_k, causal) -> O (Nq, dv)``: tiled FlashAttention.

    ``q (Nq, d)``, ``k (Nk, d)``, ``v (Nk, dv)``, float64; scale ``1/sqrt(d)``;
    ``causal`` aligned top-left (query ``i`` sees keys ``j <= i``), as in
    ``flashref.tiled_attention``. Cases include ``N = 1``, ``Nq != Nk`` both
    ways with ``causal``, block sizes 1 and larger than ``N``, sizes that are
    not multiples of the blocks, large scores peaking in the last tile, and a
    long sequence (tall tiles, then wide ones) whose peak memory must stay within what
    the tiles need.
    """
    check_callable(fn, "fn(q, k, v, block_q, block_k, causal) -> O (Nq, dv)")
    cases = [_tiled_case(*case) for case in tiled_cases()] + list(_long_cases())
    result = run("check_tiled_attention", fn, cases, _name_mistakes)
    name_untiled(result, "a long sequence, peak memory measured")
    return result
