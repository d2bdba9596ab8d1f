"""Known-wrong softmax algorithms, simulated in float64 to name a reader's mistake.

Each ``wrong_*`` function takes one case's input and returns ``[(mistake name,
what that wrong algorithm returns)]``. The softmax checkers call them only when
an answer is wrong, through ``name_mistakes``: a mistake is named when the
reader's outputs match what that wrong algorithm returns, on every case if
possible, otherwise on the failing case; on a failing case only if that wrong
output is itself clearly wrong there (``_nameable``).

The streaming mistakes share one simulator, ``_stream``: a correct online pass
over one row with a single planted error switched on (no rescaling, rescaling
the wrong way, exponentiating with the stale maximum, the maximum started at 0,
no guard for a block of -inf scores, no shift at all, or off-by-one tile bounds).

Without the shift, exp overflows for scores near +1000 and underflows to 0 for
scores near -1000; ``no_max_name`` says which of the two a case's input causes.
"""

from __future__ import annotations

import numpy as np

from ..state import SoftmaxState
from ._answer import TIGHT, excess
from ._report import CheckResult, Failure

# "The reader's output is what this wrong algorithm returns": equal up to rounding,
# with the checkers' absolute floor (values below 1e-15 may differ in the last bits
# of an underflowing exp).
MATCH_RTOL = 1e-6
MATCH_ATOL = 1e-15

NO_RESCALE = "no rescaling of the running sum when the maximum grows"
NO_RESCALE_O = "no rescaling of the running output o when the maximum grows"
WRONG_WAY = "rescaling the wrong way (exp(m_new - m_old) instead of exp(m_old - m_new))"
OFF_BY_ONE = "off-by-one tile bounds (a score skipped or counted twice)"
NO_MAX = "not subtracting the maximum (overflow)"
NO_MAX_UNDERFLOW = "not subtracting the maximum (underflow to 0, then 0/0)"
NO_MAX_BOTH = "not subtracting the maximum (overflow and underflow)"
STALE_MAX = "exponentiated with the stale maximum (m_old, not m_new)"
NO_GUARD = "no guard for a block of only -inf scores (exp(-inf - (-inf)) is NaN)"
M0_ZERO = "running maximum started at 0 instead of -inf (all-negative rows give 0/0)"
BLOCK_NORM = "normalised each block by its own sum instead of the total"
TILE_AVERAGE = "averaged the per-tile results (the tiles' denominators differ)"
GLOBAL_MAX = "subtracted the maximum of the whole array instead of each row's"
MIN_SHIFT = "subtracted the minimum instead of the maximum"
WRONG_AXIS = "normalised along the wrong axis (softmax is along the last axis)"
MERGE_ONE = "forgot to rescale one of the two states"
MERGE_NONE = "forgot to rescale both states (added l directly)"
MERGE_OTHER = "used the other state's maximum"
MERGE_ADD = "added maxima"
MERGE_NO_GUARD = "no guard for two empty states (exp(-inf - (-inf)) is NaN)"
MERGE_SHIFT_AS_M = "stored the shift as m (an empty row keeps m = -inf, not 0)"

_LOG_MAX = float(np.log(np.finfo(np.float64).max))  # exp(x) overflows above this (709.78)


def no_max_name(x: np.ndarray) -> str:
    """Which way exp goes wrong on ``x`` without the shift: overflow, underflow or both."""
    top = x.reshape(-1, x.shape[-1]).max(axis=-1)  # (rows,)
    over = bool((top > _LOG_MAX).any())
    with np.errstate(under="ignore"):
        under = bool((np.isfinite(top) & (np.exp(top) == 0)).any())  # every exp is 0
    if over and under:
        return NO_MAX_BOTH
    return NO_MAX_UNDERFLOW if under else NO_MAX


# --- float64 simulation of a streaming pass, correct or with one planted mistake ----------


def _tiles(n: int, B: int, bounds: str) -> list[slice]:
    if bounds == "ok":
        starts, extra = range(0, n, B), 0
    elif bounds == "short":  # x[s : s + B - 1]: the last score of every tile is skipped
        starts, extra = range(0, n, B), -1
    elif bounds == "long":  # x[s : s + B + 1]: the next tile's first score counted twice
        starts, extra = range(0, n, B), 1
    elif bounds == "drop_tail":  # n // B tiles: a ragged tail is never visited
        starts, extra = range(0, n - n % B, B), 0
    elif bounds == "drop_last":  # range(0, n - B, B): the last tile is never visited
        starts, extra = range(0, n - B, B), 0
    else:  # "skip_first": range(1, n, B): the first score is never visited
        starts, extra = range(1, n, B), 0
    return [slice(s, min(s + B + extra, n)) for s in starts if min(s + B + extra, n) > s]


def _stream(
    s,
    v,
    B,
    *,
    alpha_l="right",
    alpha_o="right",
    shift=True,
    guard=True,
    m0=-np.inf,
    bounds="ok",
    stale=False,
):
    """One row's (m, l, o, shift) after streaming ``s (N,)`` and ``v (N,)`` in tiles of B.

    ``stale``: the new scores are exponentiated with the maximum before this tile
    (with ``guard``, the first tile uses its own maximum; without, ``exp(s + inf)``).
    """
    m, l, o, ref = m0, np.float64(0.0), np.float64(0.0), 0.0
    with np.errstate(all="ignore"):
        for t in _tiles(len(s), B, bounds):
            m_new = max(m, s[t].max()) if shift else 0.0
            ref = (0.0 if m_new == -np.inf else m_new) if guard else m_new
            right = np.exp(m - ref) if shift else 1.0
            if m == -np.inf and guard:
                wrong = 0.0  # a reader who starts from the first tile never rescales an empty l
            else:
                wrong = np.exp(m_new - m)
            alpha = {"right": right, "wrong": wrong, "none": 1.0}
            p_ref = m if stale and (m > -np.inf or not guard) else ref
            p = np.exp(s[t] - p_ref)  # (Bc,)
            l = l * alpha[alpha_l] + p.sum()
            o = o * alpha[alpha_o] + (p @ v[t] if v is not None else 0.0)
            m = m_new
    return m, l, o, ref


def _stream_variants(values: bool, x: np.ndarray):
    """(name, keyword arguments of _stream) for each known-wrong streaming algorithm on x."""
    out = [(NO_GUARD, {"guard": False}), (M0_ZERO, {"m0": 0.0}), (no_max_name(x), {"shift": False})]
    for guard in (True, False):
        out += [
            (NO_RESCALE, {"alpha_l": "none", "alpha_o": "none", "guard": guard}),
            (WRONG_WAY, {"alpha_l": "wrong", "alpha_o": "wrong", "guard": guard}),
            (STALE_MAX, {"stale": True, "guard": guard}),
        ]
        if values:
            out += [
                (NO_RESCALE, {"alpha_l": "none", "guard": guard}),
                (NO_RESCALE_O, {"alpha_o": "none", "guard": guard}),
            ]
        for bounds in ("short", "long", "drop_tail", "drop_last", "skip_first"):
            out.append((OFF_BY_ONE, {"bounds": bounds, "guard": guard}))
    return out


def _rows(x: np.ndarray, row_fn) -> np.ndarray:
    """Apply ``row_fn (N,) -> (N,)`` to every row of x (1-D or 2-D)."""
    with np.errstate(all="ignore"):
        return np.stack([row_fn(r) for r in x.reshape(-1, x.shape[-1])]).reshape(x.shape)


# --- one family of wrong answers per checker --------------------------------------------


def wrong_safe_softmax(x: np.ndarray):
    with np.errstate(all="ignore"):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        e_min = np.exp(x - x.min(axis=-1, keepdims=True))
        e_global = np.exp(x - x.max())
        e_col = np.exp(x - x.max(axis=0, keepdims=True))
        return [
            (no_max_name(x), np.exp(x) / np.exp(x).sum(axis=-1, keepdims=True)),
            (GLOBAL_MAX, e_global / e_global.sum(axis=-1, keepdims=True)),
            (MIN_SHIFT, e_min / e_min.sum(axis=-1, keepdims=True)),
            (WRONG_AXIS, e / e.sum(axis=0, keepdims=True)),
            (WRONG_AXIS, e / e.sum()),
            (WRONG_AXIS, e_col / e_col.sum(axis=-1, keepdims=True)),
        ]


def wrong_online_softmax(x: np.ndarray, B: int):
    def streamed(kwargs):
        def row(r):
            _, l, _, ref = _stream(r, None, B, **kwargs)
            return np.exp(r - ref) / l

        return _rows(x, row)

    def per_block(r):
        out = np.empty_like(r)
        for t in _tiles(len(r), B, "ok"):
            e = np.exp(r[t] - r[t].max())
            out[t] = e / e.sum()
        return out

    wrong = [(name, streamed(kw)) for name, kw in _stream_variants(False, x)]
    return wrong + [(BLOCK_NORM, _rows(x, per_block))]


def wrong_weighted_sums(s: np.ndarray, v: np.ndarray, B: int):
    out = []
    for name, kwargs in _stream_variants(True, s):
        _, l, o, _ = _stream(s, v, B, **kwargs)
        with np.errstate(all="ignore"):
            out.append((name, o / l))
    with np.errstate(all="ignore"):
        per_tile = []
        for t in _tiles(len(s), B, "ok"):
            p = np.exp(s[t] - s[t].max())
            per_tile.append(p @ v[t] / p.sum())
    return out + [(TILE_AVERAGE, float(np.mean(per_tile)))]


def wrong_merges(a: SoftmaxState, b: SoftmaxState):
    """Each wrong merge as an (m, l) pair, or (m, l, o) when the states carry an output."""
    with np.errstate(all="ignore"):
        m = np.maximum(a.m, b.m)
        ref = np.where(np.isneginf(m), 0.0, m)  # the shift used by a correct merge
        one = np.ones_like(m)

        def merged(m_out, alpha_a, alpha_b):
            l = a.l * alpha_a + b.l * alpha_b
            if a.o is None:
                return (m_out, l)
            return (m_out, l, a.o * alpha_a[..., None] + b.o * alpha_b[..., None])

        added = a.m + b.m
        return [
            (MERGE_NO_GUARD, merged(m, np.exp(a.m - m), np.exp(b.m - m))),
            (MERGE_SHIFT_AS_M, merged(ref, np.exp(a.m - ref), np.exp(b.m - ref))),
            (MERGE_ONE, merged(m, np.exp(a.m - ref), one)),
            (MERGE_ONE, merged(m, one, np.exp(b.m - ref))),
            (MERGE_NONE, merged(m, one, one)),
            (MERGE_OTHER, merged(m, np.exp(b.m - ref), np.exp(a.m - ref))),
            (MERGE_OTHER, merged(a.m, one, np.exp(b.m - a.m))),
            (MERGE_OTHER, merged(b.m, np.exp(a.m - b.m), one)),
            (MERGE_ADD, merged(added, np.exp(a.m - added), np.exp(b.m - added))),
            (MERGE_ADD, merged(added, np.exp(a.m - ref), np.exp(b.m - ref))),
        ]


# --- recognising a mistake in the reader's output ---------------------------------------


def name_mistakes(result: CheckResult, ran) -> None:
    """Name the wrong algorithms whose outputs match the reader's, in ``result``.

    ``ran`` lists ``(case, value, index of its failure or None)`` for every case
    whose answer was accepted; ``case.wrong()`` gives the wrong algorithms' outputs
    on that case (the same variants in the same order for every case).
    """
    wrong = [case.wrong() for case, _, _ in ran]
    same = [
        [_same(pred, value) for _, pred in w] for w, (_, value, _) in zip(wrong, ran, strict=True)
    ]
    # A variant "explains" the reader if it matches on every case the reader ran,
    # including the ones that passed (where it must then agree with the reference).
    everywhere = [k for k in range(len(wrong[0])) if all(row[k] for row in same)]
    for (case, value, index), w, row in zip(ran, wrong, same, strict=True):
        if index is None:
            continue
        here = [k for k, hit in enumerate(row) if hit and _nameable(case, w[k][1], value)]
        named = [w[k][0] for k in everywhere if k in here] or sorted({w[k][0] for k in here})
        if named:
            failure = result.failures[index]
            diagnosis = " or ".join(dict.fromkeys(named))  # each name once, in order
            result.failures[index] = Failure(failure.case, failure.problem, diagnosis)


def _nameable(case, pred, value) -> bool:
    """May a wrong algorithm's output ``pred``, which matches ``value``, be named here?

    It must be wrong itself, and either reproduce the answer to float64 rounding or
    lie outside the float32 band: a float32 answer that misses by a hair must not be
    blamed on a mistake that changes the result by a hair.
    """
    if case.distance(pred) <= 1:
        return False
    return _same(pred, value, rtol=TIGHT, atol=0.0) or not case.within_float32(pred)


def _same(pred, value, rtol=MATCH_RTOL, atol=MATCH_ATOL) -> bool:
    """NaN-safe 'equal up to rounding' for arrays, floats and (m, l[, o]) tuples."""
    if isinstance(pred, tuple):
        return all(_same(p, g, rtol, atol) for p, g in zip(pred, value, strict=True))
    p = np.asarray(pred, dtype=np.float64)
    g = np.asarray(value, dtype=np.float64)
    if g.shape != p.shape:
        if g.size != 1 or p.size != 1:
            return False
        g = g.reshape(p.shape)
    with np.errstate(all="ignore"):
        tol = atol + rtol * np.abs(p)
    return bool((excess(p, g, tol, nan_matches=True) <= 1).all())
