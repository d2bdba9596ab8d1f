"""Attention solutions for the checker tests: right ones and wrong ones.

Every solution here is written the way a reader might write it, independently of
flashref's own code: the correct ones keep the output normalised between tiles
(the update equations of Algorithm 1 in the FlashAttention paper) rather than
dividing once at the end as flashref does.
"""

from __future__ import annotations

import numpy as np


def flat(result) -> str:
    """A report on one line: a long mistake name is wrapped over two lines when printed."""
    return " ".join(str(result).split())


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


def one_query_loop(rule):
    """A streaming loop for one query with one planted mistake."""

    def fn(q, K, V, tile_size):
        s_all = K @ q / (1.0 if rule == "no_scale" else np.sqrt(len(q)))
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
            elif rule in ("stale_max", "stale_max_literal"):
                # the new scores on the old maximum's scale (the first tile on its own, or -inf)
                stale = m_new if rule == "stale_max" and m == -np.inf else m
                p = np.exp(s - stale)
                l, o = l * np.exp(m - m_new) + p.sum(), o * np.exp(m - m_new) + p @ Vt
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


def tiled_loop(rule):
    """A FlashAttention-2-order loop (query tiles outer) with one planted mistake."""

    def fn(q, k, v, block_q, block_k, causal):
        Nq, Nk = len(q), len(k)
        O = np.zeros((Nq, v.shape[1]))
        for r in range(0, Nq, block_q):
            Qi = q[r : r + block_q] / (1.0 if rule == "no_scale" else np.sqrt(q.shape[1]))
            rows = np.arange(r, r + len(Qi))
            m = np.full(len(Qi), -np.inf)
            l = np.zeros(len(Qi))
            acc = np.zeros((len(Qi), v.shape[1]))
            tile_outputs = []
            stop = min(Nk, r + len(Qi)) if causal and rule != "no_causal" else Nk
            if rule == "off_by_one":
                stop = Nk - Nk % block_k  # forgets the ragged last tile
            elif rule == "skip_diagonal" and causal:
                stop = min(Nk, r)  # stops before the tile that holds the diagonal
            elif rule.startswith("first_row") and causal:
                stop = min(Nk, r + 1)  # the bound of the tile's first row, not its last
            for c in range(0, stop, block_k):
                end = min(c + block_k, stop) if rule == "first_row_clipped" else c + block_k
                Kj, Vj = k[c:end], v[c:end]
                cols = np.arange(c, c + len(Kj))
                S = Qi @ Kj.T
                if causal and rule != "no_causal":
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
                elif rule == "stale_max":  # P on the old maximum's scale (the first tile's own)
                    P = np.exp(S - np.where(np.isneginf(m), m_new, m)[:, None])
                    f = np.exp(m - m_new)
                    l, acc = l * f + P.sum(1), acc * f[:, None] + P @ Vj
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


# ---------------------------------------------------------------------------
# Float32 precision


def in_float32(solution, returns=np.float32):
    """``solution`` run on float32 copies of its inputs, its answer cast to ``returns``."""

    def fn(*args):
        arrays = [a.astype(np.float32) for a in args if isinstance(a, np.ndarray)]
        rest = [a for a in args if not isinstance(a, np.ndarray)]
        return solution(*arrays, *rest).astype(returns)

    return fn


# ---------------------------------------------------------------------------
# Tiling: the peak memory of a right answer


def naive(q, k, v, block_q, block_k, causal):
    """Right, and not tiled: the whole (Nq, Nk) score matrix at once."""
    S = q @ k.T / np.sqrt(q.shape[1])  # (Nq, Nk)
    if causal:
        S = np.where(np.tril(np.ones(S.shape, dtype=bool)), S, -np.inf)
    P = np.exp(S - S.max(axis=1, keepdims=True))
    return P @ v / P.sum(axis=1, keepdims=True)


def query_strips(q, k, v, block_q, block_k, causal):
    """Right, with query tiles but every key at once: (block_q, Nk) strips of scores."""
    O = np.empty((len(q), v.shape[1]))
    for r in range(0, len(q), block_q):
        rows = np.arange(r, min(r + block_q, len(q)))
        S = q[rows] @ k.T / np.sqrt(q.shape[1])  # (Br, Nk)
        if causal:
            S = np.where(np.arange(len(k)) <= rows[:, None], S, -np.inf)
        P = np.exp(S - S.max(axis=1, keepdims=True))
        O[rows] = P @ v / P.sum(axis=1, keepdims=True)
    return O
