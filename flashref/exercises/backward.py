"""Checkers for the backward-pass chapter: one tile's D and dS, and the tiled backward.

``check_backward_tile(fn)`` runs ``fn(Qi, Kj, Vj, Oi, dOi, lse_i)`` on one tile of a
longer row of keys: ``Qi (Br, d)``, ``Kj (Bc, d)``, ``Vj (Bc, dv)`` and, for the queries,
the forward's output ``Oi (Br, dv)`` and ``lse_i (Br,)`` over *every* key, with the
upstream gradient ``dOi (Br, dv)``. ``fn`` should return the tuple ``(D, dS)``:
``D = rowsum(dO * O)`` of shape ``(Br,)`` and ``dS = P * (dP - D)`` of shape ``(Br, Bc)``,
with ``P = exp(S - lse)`` recomputed from ``S = Qi Kj^T / sqrt(d)`` and ``dP = dOi Vj^T``.

``check_tiled_backward(fn)`` runs ``fn(q, k, v, o, lse, do, block_q, block_k, causal)``
with ``q (Nq, d)``, ``k (Nk, d)``, ``v (Nk, dv)``, the forward's ``o (Nq, dv)`` and
``lse (Nq,)``, and ``do (Nq, dv)``; ``fn`` should return ``(dq, dk, dv)`` as
``flashref.tiled_attention_backward`` does (``causal`` aligned top-left). Its cases
include a long sequence (tall tiles, then wide ones) whose peak memory must stay within
what tiles need, and a causal case whose keys after the last query tile hold NaN: no
query may attend to them, so a loop that skips fully masked tiles never reads them.

Both use the scale ``1/sqrt(d)`` and float64 inputs, and compare with
``flashref.naive_attention_backward`` in float64. Each returned array is judged against
``TOL`` times the largest *size* of its entries: the sum of the absolute values of the
terms an entry adds up (for dS, ``P * (|dO| |V|^T + rowsum(|dO| |O|))``; for dQ,
``scale * size(dS) |K|``...). A gradient can be small by cancellation, the rows of dS
always sum to zero, so its own size is no yardstick; its terms' is. A float64 solution
lands within 1e-13 of that; one computed in float32 passes the moderate cases but not
scores near 1000, where float32 rounds each score by about 6e-5, and that failure is
named float32 precision (its band, as in ``_run``, counts ``max|S| + max|lse| + d + dv +
N`` roundings). Each named mistake of ``_backward_mistakes`` misses by more than 1e-2 on
some case, and on every case either by more than 1e-4 or, where the case cannot expose
it, not at all beyond rounding (``tests/exercises/test_exercises_backward.py`` plants each one). A
mistake is named when its simulated output reproduces a wrong array of the answer
(``_parts``); the names found for dq, dk and dv (or D and dS) are listed together.
"""

from __future__ import annotations

import functools

import numpy as np

from ..attention import naive_attention
from ..backward import naive_attention_backward
from . import _backward_mistakes as mistakes
from ._backward_mistakes import (
    BOTTOM_RIGHT,
    D_ONE_TILE,
    D_WRONG_ARRAYS,
    DKDV_OVERWRITTEN,
    DP_FROM_O,
    DQ_OVERWRITTEN,
    NO_CAUSAL,
    NO_D,
    NO_LSE,
    NO_P,
    NO_SCALE_DK,
    NO_SCALE_DQ,
    NO_SCALE_S,
    NO_SKIP,
    OFF_BY_ONE,
    STRICT_CAUSAL,
    TILE_SOFTMAX,
    TRANSPOSE_DK,
    TRANSPOSE_DQ,
    TRANSPOSE_DV,
    TWICE_SCALE_DK,
    WRONG_SKIP,
)
from ._cases import project_scores
from ._memory import NOT_TILED, UNTILED_KEYS, UNTILED_QUERIES, memory_verdict, name_untiled
from ._parts import PartsCase, name_part_mistakes, parts_case
from ._report import PRECISION, CheckResult
from ._run import check_callable, checker, run

__all__ = [
    "check_backward_tile",
    "check_tiled_backward",
    # what a report can say
    "D_WRONG_ARRAYS",
    "D_ONE_TILE",
    "NO_D",
    "NO_P",
    "NO_LSE",
    "TILE_SOFTMAX",
    "NO_SCALE_S",
    "DP_FROM_O",
    "NO_SCALE_DQ",
    "NO_SCALE_DK",
    "TWICE_SCALE_DK",
    "TRANSPOSE_DQ",
    "TRANSPOSE_DK",
    "TRANSPOSE_DV",
    "DQ_OVERWRITTEN",
    "DKDV_OVERWRITTEN",
    "NO_SKIP",
    "WRONG_SKIP",
    "NO_CAUSAL",
    "BOTTOM_RIGHT",
    "STRICT_CAUSAL",
    "OFF_BY_ONE",
    "PRECISION",
    "NOT_TILED",
    "UNTILED_KEYS",
    "UNTILED_QUERIES",
]

TOL = 1e-5  # relative to the largest size of an array's entries (see the module docstring)
# Nq, Nk, d, dv, Br, Bc of the memory cases: tall tiles, then wide ones (_cases.memory_cases)
LONG = ((2048, 2048, 16, 16, 512, 32), (2048, 2048, 16, 16, 32, 512))


# ---------------------------------------------------------------------------
# Exercise 1: one tile


def _random(rng, *shapes):
    return tuple(rng.standard_normal(s) for s in shapes)


def tile_cases():
    """(label, Qi, K, V, dOi, c0, c1): the tile is keys c0..c1-1 of a row of len(K) keys."""
    rng = np.random.default_rng(2031)
    cases = []
    for label, Br, Nk, c0, c1, d, dv in [
        ("a tile inside a longer row", 8, 48, 16, 32, 8, 4),
        ("the first tile of the row", 8, 40, 0, 16, 8, 4),
        ("the ragged last tile", 6, 45, 40, 45, 8, 4),
        ("more queries than keys in the tile", 16, 30, 10, 14, 8, 4),
        ("d and dv not powers of two", 5, 23, 6, 18, 5, 3),
        ("one query (Br = 1)", 1, 20, 4, 12, 8, 4),
        ("one key (Bc = 1)", 6, 20, 7, 8, 8, 4),
        ("the tile holds every key", 7, 12, 0, 12, 8, 4),
    ]:
        cases.append((label, *_random(rng, (Br, d), (Nk, d), (Nk, dv), (Br, dv)), c0, c1))
    for label, level in (("scores near 1000", 990.0), ("scores near -1000", -1000.0)):
        Q, K, V, dO = _random(rng, (6, 8), (40, 8), (40, 4), (6, 4))
        direction = Q.mean(axis=0)
        K = project_scores(direction, K, level + np.linspace(0.0, 10.0, 40))
        Q = direction + 0.02 * (Q - direction)  # queries close to the mean: similar scores
        cases.append((label, Q, K, V, dO, 16, 32))
    return cases


def _tile_case(label, Q, K, V, dO, c0, c1) -> PartsCase:
    O, lse = naive_attention(Q, K, V, return_lse=True)  # (Br, dv), (Br,) over every key
    Kj, Vj = K[c0:c1], V[c0:c1]  # (Bc, d), (Bc, dv)
    D, P, dS = mistakes.simulate_tile(Q, Kj, Vj, O, dO, lse)  # the right D and dS
    D_size = (np.abs(dO) * np.abs(O)).sum(axis=1)  # (Br,)
    dS_size = P * (np.abs(dO) @ np.abs(Vj).T + D_size[:, None])  # (Br, Bc)
    S_max = np.abs(Q @ Kj.T).max() / np.sqrt(Q.shape[1])
    magnitude = S_max + np.abs(lse).max() + Q.shape[1] + V.shape[1] + len(K)

    def simulate(**kwargs):
        D, _, dS = mistakes.simulate_tile(Q, Kj, Vj, O, dO, lse, **kwargs)
        return D, dS

    return parts_case(
        f"{label}: Qi {Q.shape}, Kj {Kj.shape} (keys {c0}-{c1 - 1} of {len(K)}), Vj {Vj.shape}",
        (Q, Kj, Vj, O, dO, lse),
        ("D", "dS"),
        (D, dS),
        (D_size, dS_size),
        TOL,
        magnitude,
        (mistakes.tile_candidates(), simulate),
    )


@checker
def check_backward_tile(fn) -> CheckResult:
    """Check ``fn(Qi, Kj, Vj, Oi, dOi, lse_i) -> (D (Br,), dS (Br, Bc))`` for one tile.

    float64 inputs; scores ``Qi Kj^T / sqrt(d)``; ``Oi`` and ``lse_i`` are the forward's
    over every key of the row, of which ``Kj`` and ``Vj`` are one tile. Cases include
    ``Br = 1``, ``Bc = 1``, more queries than keys, a ragged last tile, a tile holding
    every key, and scores near 1000 and near -1000.
    """
    check_callable(fn, "fn(Qi, Kj, Vj, Oi, dOi, lse_i) -> (D, dS)")
    cases = [_tile_case(*case) for case in tile_cases()]
    return run("check_backward_tile", fn, cases, name_part_mistakes)


# ---------------------------------------------------------------------------
# Exercise 2: the tiled backward


def tiled_cases():
    """(label, q, k, v, do, block_q, block_k, causal, poison): ``poison`` puts NaN in the
    keys and values of the key tiles that start after the last query (causal only)."""
    rng = np.random.default_rng(2032)
    cases = []
    for label, Nq, Nk, d, dv, Br, Bc, causal, poison in [
        ("random", 64, 64, 16, 8, 16, 16, False, False),
        ("random", 64, 64, 16, 8, 16, 16, True, False),
        ("N not a multiple of the blocks", 45, 45, 8, 5, 16, 8, False, False),
        ("N not a multiple of the blocks", 45, 45, 8, 5, 16, 8, True, False),
        ("Nq < Nk", 20, 50, 8, 4, 8, 16, True, True),
        ("Nq > Nk", 50, 20, 8, 4, 16, 8, True, False),
        ("Nq > Nk", 50, 20, 8, 4, 16, 8, False, False),
        ("block sizes 1", 7, 9, 8, 4, 1, 1, True, False),
        ("blocks larger than N", 10, 10, 8, 4, 64, 64, False, False),
        ("blocks larger than N", 10, 10, 8, 4, 64, 64, True, False),
        ("N = 1", 1, 1, 8, 4, 4, 4, False, False),
        ("N = 1", 1, 1, 8, 4, 4, 4, True, False),
    ]:
        q, k, v, do = _random(rng, (Nq, d), (Nk, d), (Nk, dv), (Nq, dv))
        cases.append((label, q, k, v, do, Br, Bc, causal, poison))
    for causal in (False, True):  # scores near 1000, the largest in the last key tile
        q, k, v, do = _random(rng, (48, 8), (48, 8), (48, 4), (48, 4))
        direction = q.mean(axis=0)
        k = project_scores(direction, k, 990.0 + np.linspace(0.0, 10.0, 48))
        q = direction + 0.02 * (q - direction)
        cases.append(("scores near 1000", q, k, v, do, 16, 16, causal, False))
    return cases


def _tiled_case(label, q, k, v, do, Br, Bc, causal, poison, memory=None) -> PartsCase:
    Nq, Nk = len(q), len(k)
    seen = Nk  # keys from `seen` on lie in tiles after the last query: NaN when poisoned
    if poison:
        seen = -(-Nq // Bc) * Bc
        k, v = k.copy(), v.copy()
        k[seen:], v[seen:] = np.nan, np.nan
        label += f", keys {seen}-{Nk - 1} NaN"  # no query may attend to them
    o, lse = naive_attention(q, k[:seen], v[:seen], causal=causal, return_lse=True)
    grads = naive_attention_backward(q, k[:seen], v[:seen], o, lse, do, causal=causal)
    dq, dk, dv = grads[0], np.zeros(k.shape), np.zeros(v.shape)
    dk[:seen], dv[:seen] = grads[1], grads[2]
    scale = 1 / np.sqrt(q.shape[1])
    S = q @ k[:seen].T * scale  # (Nq, seen)
    if causal:
        S = np.where(np.arange(seen) <= np.arange(Nq)[:, None], S, -np.inf)
    P = np.zeros((Nq, Nk))  # (Nq, Nk), 0 for the poisoned keys
    P[:, :seen] = np.exp(S - lse[:, None])
    ks, vs = np.nan_to_num(np.abs(k)), np.nan_to_num(np.abs(v))
    dS_size = P * (np.abs(do) @ vs.T + (np.abs(do) * np.abs(o)).sum(axis=1)[:, None])
    sizes = (scale * dS_size @ ks, scale * dS_size.T @ np.abs(q), P.T @ np.abs(do))
    magnitude = np.abs(S[np.isfinite(S)]).max() + np.abs(lse).max() + q.shape[1] + v.shape[1]
    magnitude += max(Nq, Nk)
    wrong = None
    if memory is None:  # the long case is too large to simulate every mistake on

        def simulate(**kwargs):
            return mistakes.simulate_backward(q, k, v, o, lse, do, Br, Bc, causal, **kwargs)

        wrong = (mistakes.backward_candidates(causal), simulate)
    return parts_case(
        f"{label}: q {q.shape}, k {k.shape}, v {v.shape}, block_q={Br}, block_k={Bc}, "
        f"causal={causal}",
        (q, k, v, o, lse, do, Br, Bc, causal),
        ("dq", "dk", "dv"),
        (dq, dk, dv),
        sizes,
        TOL,
        magnitude,
        wrong,
        memory,
    )


def backward_budget(Nq, Nk, d, dv, Br, Bc) -> int:
    """Bytes a float64 tiled backward may need beyond its inputs.

    Twice the bytes of q, k, v, o, do and the three gradients together (room for a scaled
    copy of q, the gradients, and a second buffer for them), plus twelve float64
    ``(Br, Bc)`` tiles (S, P, dP, dS, a mask and the temporaries of ``np.exp``,
    ``np.where`` and the products). At Nq = Nk = 2048, d = dv = 16 and 512 x 32 or 32 x 512
    tiles that is 5.5 MiB, against 8 MiB for one array that spans every key of a query tile
    ``(Br, Nk)`` or every query of a key tile ``(Nq, Bc)``, and 32 MiB for one (Nq, Nk)
    matrix; a tiled backward holds several such arrays at once (S, P, dP, dS). Measured:
    1.6-1.7 MiB for flashref's own in both cases, 49 MiB for ``(Nq, Bc)`` strips with wide
    tiles (4.0 with tall ones), 130 MiB for one (Nq, Nk) tile.
    """
    inputs = Nq * d + Nk * d + Nk * dv + 2 * Nq * dv  # q, k, v, o, do
    gradients = Nq * d + Nk * d + Nk * dv  # dq, dk, dv
    return 2 * 8 * (inputs + gradients) + 12 * 8 * min(Br, Nq) * min(Bc, Nk)


@functools.cache
def _long_cases() -> tuple[PartsCase, ...]:
    """The memory cases, built once per session (each float64 reference takes 0.3 s)."""
    cases = []
    for (Nq, Nk, d, dv, Br, Bc), shape in zip(LONG, ("tall", "wide"), strict=True):
        rng = np.random.default_rng(2033)
        q, k, v, do = _random(rng, (Nq, d), (Nk, d), (Nk, dv), (Nq, dv))
        blocks = f"block_q={Br}, block_k={Bc}"
        budget = backward_budget(Nq, Nk, d, dv, Br, Bc)
        untiled = UNTILED_KEYS if Br > Bc else UNTILED_QUERIES

        def verdict(peak, budget=budget, blocks=blocks, untiled=untiled, Nq=Nq, Nk=Nk):
            return memory_verdict(peak, Nq, Nk, budget, blocks, untiled, "the gradients are")

        label = f"a long sequence, peak memory measured, {shape} tiles"
        cases.append(_tiled_case(label, q, k, v, do, Br, Bc, False, False, memory=verdict))
    return tuple(cases)


@checker
def check_tiled_backward(fn) -> CheckResult:
    """Check ``fn(q, k, v, o, lse, do, block_q, block_k, causal) -> (dq, dk, dv)``.

    float64 inputs, scale ``1/sqrt(d)``, ``causal`` aligned top-left, as in
    ``flashref.tiled_attention_backward``. Cases include ``N = 1``, ``Nq != Nk`` both ways
    with ``causal``, block sizes 1 and larger than ``N``, sizes that are not multiples of
    the blocks, scores near 1000, a causal case with NaN in the keys after the last query
    tile (skipped tiles are never read), and a long sequence (tall tiles, then wide ones)
    whose peak memory must stay within what the tiles need.
    """
    check_callable(fn, "fn(q, k, v, o, lse, do, block_q, block_k, causal) -> (dq, dk, dv)")
    cases = [_tiled_case(*case) for case in tiled_cases()] + list(_long_cases())
    result = run("check_tiled_backward", fn, cases, name_part_mistakes)
    name_untiled(result, "a long sequence, peak memory measured")
    return result
