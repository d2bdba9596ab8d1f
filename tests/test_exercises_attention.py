"""The chapter 3 and 4 checkers accept correct solutions and name planted mistakes.

Every solution here is written the way a reader might write it, independently of
flashref's own code: the correct ones keep the output normalised between tiles
(the update equations of Algorithm 1 in the FlashAttention paper) rather than
dividing once at the end as flashref does.
"""

from __future__ import annotations

import numpy as np
import pytest

from flashref.exercises import check_one_query_attention, check_tiled_attention
from flashref.exercises.attention import (
    BOTTOM_RIGHT,
    DIVIDE_INSIDE,
    NO_RESCALE,
    NO_SHIFT,
    NOT_IMPLEMENTED,
    OFF_BY_ONE,
    PER_TILE,
    STRICT_CAUSAL,
    WRONG_WAY,
)

# ---------------------------------------------------------------------------
# One query: fn(q (d,), K (N, d), V (N, dv), tile_size) -> (dv,)


def one_query_correct(q, K, V, tile_size):
    """Algorithm 1's update: O stays normalised, rescaled by l_old / l_new each tile."""
    s_all = K @ q / np.sqrt(len(q))
    m, l, O = -np.inf, 0.0, np.zeros(V.shape[1])
    for start in range(0, len(K), tile_size):
        s, Vt = s_all[start : start + tile_size], V[start : start + tile_size]
        m_tile = s.max()
        p = np.exp(s - m_tile)
        m_new = max(m, m_tile)
        l_new = np.exp(m - m_new) * l + np.exp(m_tile - m_new) * p.sum()
        O = (l * np.exp(m - m_new) * O + np.exp(m_tile - m_new) * (p @ Vt)) / l_new
        m, l = m_new, l_new
    return O


def _one_query_loop(rule):
    """A streaming loop for one query with one planted mistake."""

    def fn(q, K, V, tile_size):
        s_all = K @ q / np.sqrt(len(q))
        N = len(K)
        starts = range(0, N, tile_size)
        if rule == "off_by_one":
            starts = range(0, N - tile_size, tile_size)  # misses the last tile
        m, l, o = -np.inf, 0.0, np.zeros(V.shape[1])
        tile_outputs = []
        for start in starts:
            s, Vt = s_all[start : start + tile_size], V[start : start + tile_size]
            m_new = max(m, s.max())
            p = np.exp(s - m_new)
            if rule == "no_rescale":
                l, o = l + p.sum(), o + p @ Vt
            elif rule == "wrong_way":
                l, o = l * np.exp(m_new - m) + p.sum(), o * np.exp(m_new - m) + p @ Vt
            elif rule == "average":
                p = np.exp(s - s.max())
                tile_outputs.append(p @ Vt / p.sum())
            elif rule == "divide_inside":
                l = l * np.exp(m - m_new) + p.sum()
                o = (o * np.exp(m - m_new) + p @ Vt) / l
            elif rule == "no_shift":
                l, o = l + np.exp(s).sum(), o + np.exp(s) @ Vt
            else:
                l, o = l * np.exp(m - m_new) + p.sum(), o * np.exp(m - m_new) + p @ Vt
            m = m_new
        if rule == "average":
            return np.mean(tile_outputs, axis=0)
        if rule == "divide_inside":
            return o
        return o / l

    return fn


def one_query_not_implemented(q, K, V, tile_size):
    raise NotImplementedError


def test_one_query_accepts_correct_solution():
    result = check_one_query_attention(one_query_correct)
    assert result, str(result)
    assert result.cases_run >= 9
    assert "all" in str(result) and "passed" in str(result)


def test_one_query_accepts_the_plain_loop():
    assert check_one_query_attention(_one_query_loop("correct"))


@pytest.mark.parametrize(
    "rule, name",
    [
        ("no_rescale", NO_RESCALE),
        ("wrong_way", WRONG_WAY),
        ("off_by_one", OFF_BY_ONE),
        ("average", PER_TILE),
        ("divide_inside", DIVIDE_INSIDE),
        ("no_shift", NO_SHIFT),
    ],
)
def test_one_query_names_planted_mistake(rule, name):
    with np.errstate(all="ignore"):  # the planted mistakes overflow, on purpose
        result = check_one_query_attention(_one_query_loop(rule))
    report = str(result)
    assert not result
    assert f"likely mistake: {name}" in report, report
    assert "expected" in report and "got" in report and "tile_size=" in report
    diagnosed = [f.diagnosis for f in result.failures if f.diagnosis]
    assert all(name in d for d in diagnosed), diagnosed


def test_one_query_not_implemented_and_exceptions():
    result = check_one_query_attention(one_query_not_implemented)
    assert not result and NOT_IMPLEMENTED in str(result)
    assert result.cases_run == 1

    def raises(q, K, V, tile_size):
        raise IndexError("tile out of range")

    report = str(check_one_query_attention(raises))
    assert "raised IndexError: tile out of range" in report

    report = str(check_one_query_attention(lambda q, K, V, t: np.zeros((1, V.shape[1]))))
    assert "expected shape (4,), got shape (1, 4)" in report


def test_one_query_rejects_non_callable():
    with pytest.raises(TypeError, match="fn must be a function"):
        check_one_query_attention(np.zeros(3))


# ---------------------------------------------------------------------------
# Tiled: fn(q (Nq, d), k (Nk, d), v (Nk, dv), block_q, block_k, causal) -> (Nq, dv)


def tiled_correct(q, k, v, block_q, block_k, causal):
    """Algorithm 1's loop order (key/value tiles outer) with its normalised O updates."""
    Nq, Nk = len(q), len(k)
    S_scale = 1 / np.sqrt(q.shape[1])
    O = np.zeros((Nq, v.shape[1]))
    l = np.zeros(Nq)
    m = np.full(Nq, -np.inf)
    for c in range(0, Nk, block_k):
        Kj, Vj = k[c : c + block_k], v[c : c + block_k]
        cols = np.arange(c, c + len(Kj))
        for r in range(0, Nq, block_q):
            rows = np.arange(r, min(r + block_q, Nq))
            S = q[rows] @ Kj.T * S_scale
            if causal:
                S = np.where(cols[None, :] <= rows[:, None], S, -np.inf)
            m_tile = S.max(axis=1)
            seen = np.isfinite(m_tile)  # rows with an allowed key in this tile
            P = np.exp(S - np.where(seen, m_tile, 0)[:, None])
            m_new = np.maximum(m[rows], m_tile)
            a = np.where(np.isfinite(m[rows]), np.exp(m[rows] - m_new), 0)
            b = np.where(seen, np.exp(m_tile - m_new), 0)
            l_new = a * l[rows] + b * P.sum(axis=1)
            O[rows] = ((a * l[rows])[:, None] * O[rows] + b[:, None] * (P @ Vj)) / np.where(
                l_new > 0, l_new, 1
            )[:, None]
            m[rows], l[rows] = m_new, l_new
    return O


def _tiled_loop(rule):
    """A FlashAttention-2-order loop (query tiles outer) with one planted mistake."""

    def fn(q, k, v, block_q, block_k, causal):
        Nq, Nk = len(q), len(k)
        O = np.zeros((Nq, v.shape[1]))
        for r in range(0, Nq, block_q):
            Qi = q[r : r + block_q] / np.sqrt(q.shape[1])
            rows = np.arange(r, r + len(Qi))
            m = np.full(len(Qi), -np.inf)
            l = np.zeros(len(Qi))
            acc = np.zeros((len(Qi), v.shape[1]))
            tile_outputs = []
            stop = min(Nk, r + len(Qi)) if causal else Nk
            if rule == "off_by_one":
                stop = Nk - Nk % block_k  # forgets the ragged last tile
            elif rule == "skip_diagonal" and causal:
                stop = min(Nk, r)  # stops before the tile that holds the diagonal
            for c in range(0, stop, block_k):
                Kj, Vj = k[c : c + block_k], v[c : c + block_k]
                cols = np.arange(c, c + len(Kj))
                S = Qi @ Kj.T
                if causal:
                    if rule == "bottom_right":
                        allowed = cols[None, :] <= rows[:, None] + Nk - Nq
                    elif rule == "strict":
                        allowed = cols[None, :] < rows[:, None]
                    else:
                        allowed = cols[None, :] <= rows[:, None]
                    S = np.where(allowed, S, -np.inf)
                m_new = np.maximum(m, S.max(axis=1))
                P = np.exp(S - m_new[:, None])
                if rule == "no_rescale":
                    l, acc = l + P.sum(1), acc + P @ Vj
                elif rule == "wrong_way":
                    f = np.exp(m_new - m)
                    l, acc = l * f + P.sum(1), acc * f[:, None] + P @ Vj
                elif rule == "average":
                    tile_outputs.append((P @ Vj) / P.sum(1)[:, None])
                elif rule == "divide_inside":
                    f = np.exp(m - m_new)
                    l = l * f + P.sum(1)
                    acc = (acc * f[:, None] + P @ Vj) / l[:, None]
                else:
                    f = np.exp(m - m_new)
                    l, acc = l * f + P.sum(1), acc * f[:, None] + P @ Vj
                m = m_new
            if rule == "average":
                O[rows] = np.mean(tile_outputs, axis=0)
            elif rule == "divide_inside":
                O[rows] = acc
            else:
                O[rows] = acc / l[:, None]
        return O

    return fn


def test_tiled_accepts_correct_solutions():
    result = check_tiled_attention(tiled_correct)
    assert result, str(result)
    assert result.cases_run >= 14
    assert check_tiled_attention(_tiled_loop("correct"))


@pytest.mark.parametrize(
    "rule, name",
    [
        ("no_rescale", NO_RESCALE),
        ("wrong_way", WRONG_WAY),
        ("off_by_one", OFF_BY_ONE),
        ("bottom_right", BOTTOM_RIGHT),
        ("strict", STRICT_CAUSAL),
        ("average", PER_TILE),
        ("skip_diagonal", OFF_BY_ONE),
        ("divide_inside", DIVIDE_INSIDE),
    ],
)
def test_tiled_names_planted_mistake(rule, name):
    with np.errstate(all="ignore"):  # several planted mistakes divide 0 by 0
        result = check_tiled_attention(_tiled_loop(rule))
    report = str(result)
    assert not result
    assert f"likely mistake: {name}" in report, report
    assert "block_q=" in report and "causal=" in report and "first wrong row" in report
    diagnosed = [f.diagnosis for f in result.failures if f.diagnosis]
    assert all(name in d for d in diagnosed), diagnosed


def test_tiled_not_implemented_and_exceptions():
    def stub(q, k, v, block_q, block_k, causal):
        raise NotImplementedError("write the tiled loop")

    result = check_tiled_attention(stub)
    assert not result and NOT_IMPLEMENTED in str(result)

    def only_causal(q, k, v, block_q, block_k, causal):
        if not causal:
            raise ValueError("causal only")
        return tiled_correct(q, k, v, block_q, block_k, causal)

    result = check_tiled_attention(only_causal)
    assert "raised ValueError: causal only" in str(result)
    assert all("causal=False" in f.case for f in result.failures)


def test_tiled_reports_nan_rows():
    def nan_last_row(q, k, v, block_q, block_k, causal):
        O = tiled_correct(q, k, v, block_q, block_k, causal)
        O[-1, 0] = np.nan
        return O

    result = check_tiled_attention(nan_last_row)
    assert not result
    assert "got nan" in str(result)
    # the first case is 64 x 64: the wrong element is row 63, column 0
    assert result.failures[0].problem.startswith("row 63 (the first wrong row), column 0: ")
    assert result.failures[0].diagnosis is None  # no known mistake puts one NaN there
