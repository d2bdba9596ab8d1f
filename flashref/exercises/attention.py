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
also runs the known-wrong algorithms of ``_candidates`` on the same input; if
one of them reproduces the output, the report names that mistake.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..attention import naive_attention
from ._report import CheckResult, Failure

# Outputs are convex combinations of the rows of V, so errors are measured against
# max|V|. Inputs are float64; a float64 solution lands within ~1e-13 of the reference
# whatever its summation order, and one that computes in float32 passes the
# moderate-score cases (errors ~1e-7) but not scores near 1000, where float32 rounds
# each score by ~6e-5. Every named mistake misses by more than 1e-2 on the cases that
# expose it (tests/test_exercises_attention.py plants each one).
TOL = 1e-5

NOT_IMPLEMENTED = "not implemented yet"
NO_RESCALE = "no rescaling of O and l when the maximum grows"
WRONG_WAY = "rescaling the wrong way"
OFF_BY_ONE = "off-by-one tile bounds"
BOTTOM_RIGHT = "wrong causal alignment (bottom-right instead of top-left)"
STRICT_CAUSAL = "causal mask off by one (j < i instead of j <= i)"
PER_TILE = "normalising each tile's output separately / averaging per-tile outputs"
DIVIDE_INSIDE = "dividing by l inside the loop"
NO_SHIFT = "exp of the raw scores (no maximum subtracted), which overflows or underflows"


# ---------------------------------------------------------------------------
# The inputs


def _project_scores(q, K, target):
    """Move each row of K along q so that its score ``K_j . q / sqrt(d)`` equals ``target[j]``."""
    d = q.shape[-1]
    s = K @ q / np.sqrt(d)  # (N,)
    return K + np.outer((target - s) * np.sqrt(d) / (q @ q), q)  # (N, d)


def _one_query_cases():
    """(label, q (d,), K (N, d), V (N, dv), tile_size): ordinary first, then adversarial."""
    rng = np.random.default_rng(2022)

    def rand(N, d, dv):
        return rng.standard_normal(d), rng.standard_normal((N, d)), rng.standard_normal((N, dv))

    cases = []
    for label, N, d, dv, tile in [
        ("random", 16, 8, 4, 4),
        ("N not a multiple of tile_size", 37, 8, 4, 8),
        ("d and dv not powers of two", 23, 5, 3, 6),
        ("tile_size 1", 10, 8, 4, 1),
        ("tile_size larger than N", 12, 8, 4, 32),
        ("N = 1", 1, 8, 4, 1),
        ("N = 1, tile_size larger than N", 1, 8, 4, 4),
    ]:
        cases.append((label, *rand(N, d, dv), tile))
    # Scores near +1000 rising tile by tile: exp overflows without the shift, and the
    # maximum arrives in the last tile, so every earlier tile must be rescaled.
    q, K, V = rand(40, 8, 4)
    target = 990.0 + np.linspace(0.0, 10.0, 40) + 0.5 * rng.standard_normal(40)
    cases.append(("large scores, maximum in the last tile", q, _project_scores(q, K, target), V, 8))
    # Scores near -1000: exp underflows to 0 without the shift.
    q, K, V = rand(29, 8, 4)
    target = -1000.0 + np.linspace(0.0, 6.0, 29) + 0.5 * rng.standard_normal(29)
    cases.append(("large negative scores", q, _project_scores(q, K, target), V, 5))
    return cases


def _tiled_cases():
    """(label, q (Nq, d), k (Nk, d), v (Nk, dv), block_q, block_k, causal)."""
    rng = np.random.default_rng(2023)

    def rand(Nq, Nk, d, dv):
        return (
            rng.standard_normal((Nq, d)),
            rng.standard_normal((Nk, d)),
            rng.standard_normal((Nk, dv)),
        )

    cases = []
    for label, Nq, Nk, d, dv, Br, Bc, causal in [
        ("random", 64, 64, 16, 8, 16, 16, False),
        ("random", 64, 64, 16, 8, 16, 16, True),
        ("N not a multiple of the blocks", 45, 45, 8, 5, 16, 8, False),
        ("N not a multiple of the blocks", 45, 45, 8, 5, 16, 8, True),
        ("Nq < Nk", 20, 50, 8, 4, 8, 16, True),
        ("Nq > Nk", 50, 20, 8, 4, 16, 8, True),
        ("Nq > Nk", 50, 20, 8, 4, 16, 8, False),
        ("block sizes 1", 7, 9, 8, 4, 1, 1, True),
        ("blocks larger than N", 10, 10, 8, 4, 64, 64, False),
        ("blocks larger than N", 10, 10, 8, 4, 64, 64, True),
        ("N = 1", 1, 1, 8, 4, 4, 4, False),
        ("N = 1", 1, 1, 8, 4, 4, 4, True),
    ]:
        cases.append((label, *rand(Nq, Nk, d, dv), Br, Bc, causal))
    # Large scores whose maximum, for every query, lies in the last key tile.
    for causal in (False, True):
        q, k, v = rand(48, 48, 8, 4)
        direction = q.mean(axis=0)
        target = 990.0 + np.linspace(0.0, 10.0, 48)  # score of key j against the mean query
        k = _project_scores(direction, k, target)
        q = direction + 0.02 * (q - direction)  # queries close to the mean: similar scores
        cases.append(("large scores, maximum in the last tile", q, k, v, 16, 16, causal))
    return cases


# ---------------------------------------------------------------------------
# Known-wrong algorithms, simulated on full score matrices (the inputs are small)


def _stream(S, V, tiles, rule):
    """Fold key tiles into running (m, l, o) for rows S (R, Nk), V (Nk, dv), under a rule.

    ``rule`` is "correct" or one of the mistakes below. Arithmetic is left literal
    (inf and NaN are allowed to appear) so that the output matches what a reader's
    code with the same mistake computes.
    """
    R, dv = S.shape[0], V.shape[-1]
    m = np.full(R, -np.inf)
    l = np.zeros(R)
    o = np.zeros((R, dv))
    outs, masses = [], []  # per-tile outputs and their masses, for the per-tile rules
    first = True
    for idx in tiles:
        s, v = S[:, idx], V[idx]  # (R, Bc), (Bc, dv)
        m_new = np.maximum(m, s.max(axis=-1, initial=-np.inf))
        shift = np.where(np.isneginf(m_new), 0.0, m_new)
        p = np.exp(s - shift[:, None])  # (R, Bc)
        alpha = np.exp(m - shift)
        if rule == "correct":
            l, o = l * alpha + p.sum(-1), o * alpha[:, None] + p @ v
        elif rule == "no_rescale":
            l, o = l + p.sum(-1), o + p @ v
        elif rule == "wrong_way":  # exp(m_new - m_old): inf times 0 on the first tile
            beta = np.exp(m_new - m)
            l, o = l * beta + p.sum(-1), o * beta[:, None] + p @ v
        elif rule == "wrong_way_from_first":  # the same, with the state started from tile 1
            beta = np.ones(R) if first else np.exp(m_new - m)
            l, o = l * beta + p.sum(-1), o * beta[:, None] + p @ v
        elif rule == "rescale_new_tile":  # the correction applied to the new tile instead
            l, o = l + alpha * p.sum(-1), o + alpha[:, None] * (p @ v)
        elif rule == "divide_inside":  # o kept normalised, without undoing the old division
            l = l * alpha + p.sum(-1)
            o = (o * alpha[:, None] + p @ v) / l[:, None]
        elif rule == "no_shift":
            e = np.exp(s)
            l, o = l + e.sum(-1), o + e @ v
        elif rule in ("average", "sum", "average_all", "sum_all"):  # tiles normalised alone
            tile_m = s.max(axis=-1, initial=-np.inf)
            p_t = np.exp(s - np.where(np.isneginf(tile_m), 0.0, tile_m)[:, None])  # (R, Bc)
            tile_l = p_t.sum(-1)
            outs.append((p_t @ v) / tile_l[:, None])
            masses.append(tile_l > 0)
        else:
            raise ValueError(f"unknown rule {rule!r}")
        m, first = m_new, False
    if rule in ("average_all", "sum_all"):  # a tile with every key masked gives 0/0 = NaN
        total = np.sum(outs, axis=0)
        return total if rule == "sum_all" else total / len(outs)
    if rule in ("average", "sum"):  # tiles with every key masked left out, row by row
        if not outs:
            return o
        seen = np.array(masses)  # (T, R): tile has an allowed key for this row
        stacked = np.where(seen[..., None], np.array(outs), 0.0)  # (T, R, dv)
        total = stacked.sum(0)
        return total if rule == "sum" else total / seen.sum(0)[:, None]
    if rule == "divide_inside":
        return o
    return o / l[:, None]


def _key_tiles(stop, Bc, variant):
    """Key index tiles ``0..stop`` in steps of Bc, with an optional off-by-one."""
    if variant == "correct":
        return [np.arange(c, min(c + Bc, stop)) for c in range(0, stop, Bc)]
    if variant == "drop_tail":  # range(stop // Bc): the ragged last tile is never visited
        return [np.arange(c, c + Bc) for c in range(0, stop - stop % Bc, Bc)]
    if variant == "drop_last":  # range(0, stop - Bc, Bc)
        return [np.arange(c, min(c + Bc, stop)) for c in range(0, stop - Bc, Bc)]
    if variant == "short":  # slice c : c + Bc - 1
        return [np.arange(c, min(c + Bc - 1, stop)) for c in range(0, stop, Bc)]
    if variant == "overlap":  # slice c : c + Bc + 1, the boundary key counted twice
        return [np.arange(c, min(c + Bc + 1, stop)) for c in range(0, stop, Bc)]
    raise ValueError(f"unknown tile variant {variant!r}")


def _simulate(
    q, k, v, Br, Bc, causal, rule="correct", tiles="correct", mask="top_left", causal_stop="skip"
):
    """Output (Nq, dv) of a tiled loop with the given rule, tile variant and mask.

    Also returns a boolean (Nq,) of rows that may attend to no key under this mask:
    their output is undefined (zeros, NaN or anything), so they match anything.
    """
    Nq, Nk = q.shape[0], k.shape[0]
    S = q @ k.T / np.sqrt(q.shape[-1])  # (Nq, Nk)
    i, j = np.arange(Nq)[:, None], np.arange(Nk)
    allowed = np.ones((Nq, Nk), dtype=bool)
    if causal:
        allowed = {
            "top_left": j <= i,
            "bottom_right": j <= i + Nk - Nq,
            "strict": j < i,
        }[mask] & allowed
    S = np.where(allowed, S, -np.inf)
    O = np.zeros((Nq, v.shape[-1]))
    for r0 in range(0, Nq, Br):
        r1 = min(r0 + Br, Nq)
        if not causal or causal_stop == "all":
            stop = Nk
        elif causal_stop == "skip":
            stop = min(Nk, r1)
        elif causal_stop == "before_diagonal":  # the loop ends where the query tile starts
            stop = min(Nk, r0)
        else:  # "one_short": range(0, r1 - 1, Bc)
            stop = min(Nk, r1 - 1)
        O[r0:r1] = _stream(S[r0:r1], v, _key_tiles(stop, Bc, tiles), rule)
    return O, ~allowed.any(axis=1)


def _candidates(causal):
    """(mistake name, keyword arguments of ``_simulate``) for every known mistake."""
    out = [
        (NO_RESCALE, {"rule": "no_rescale"}),
        (WRONG_WAY, {"rule": "wrong_way_from_first"}),
        (WRONG_WAY, {"rule": "rescale_new_tile"}),
        (PER_TILE, {"rule": "average"}),
        (PER_TILE, {"rule": "sum"}),
        (DIVIDE_INSIDE, {"rule": "divide_inside"}),
        (NO_SHIFT, {"rule": "no_shift"}),
    ]
    stops = ("skip", "all") if causal else ("skip",)
    if causal:
        for rule in ("average_all", "sum_all"):
            out += [(PER_TILE, {"rule": rule, "causal_stop": s}) for s in stops]
    for variant in ("drop_tail", "drop_last", "short", "overlap"):
        out += [(OFF_BY_ONE, {"tiles": variant, "causal_stop": s}) for s in stops]
    if causal:
        out += [
            (OFF_BY_ONE, {"causal_stop": "before_diagonal"}),
            (OFF_BY_ONE, {"causal_stop": "one_short"}),
            (BOTTOM_RIGHT, {"mask": "bottom_right", "causal_stop": "all"}),
            (STRICT_CAUSAL, {"mask": "strict", "causal_stop": "all"}),
        ]
    # Last, because it is NaN everywhere and so only recognisable by elimination.
    out.append((WRONG_WAY, {"rule": "wrong_way"}))
    return out


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
        for name, kwargs in _candidates(causal):
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
        if not isinstance(got, np.ndarray):
            problem = f"expected a numpy array, got {type(got).__name__}"
            result.failures.append(Failure(label, problem))
            continue
        if got.shape != expected.shape:
            problem = f"expected shape {expected.shape}, got shape {got.shape}"
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
        f"{where}: expected {e:.6g}, got {g:.6g} "
        f"(largest error {worst:.3g}; tolerance {TOL * scale:.3g} = {TOL:g} x max|V|)"
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
            O, undefined = _simulate(q[None], K, V, 1, tile, False, **kwargs)
            return O[0], None

        return simulate

    def describe(case):
        label, q, K, V, tile = case
        return f"{label}: q {q.shape}, K {K.shape}, V {V.shape}, tile_size={tile}"

    return _run(
        "check_one_query_attention",
        fn,
        _one_query_cases(),
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
        return lambda **kwargs: _simulate(q, k, v, Br, Bc, causal, **kwargs)

    def describe(case):
        label, q, k, v, Br, Bc, causal = case
        return (
            f"{label}: q {q.shape}, k {k.shape}, v {v.shape}, "
            f"block_q={Br}, block_k={Bc}, causal={causal}"
        )

    return _run(
        "check_tiled_attention",
        fn,
        _tiled_cases(),
        call,
        expected_of,
        simulate_of,
        describe,
        causal_of=lambda case: case[-1],
    )
