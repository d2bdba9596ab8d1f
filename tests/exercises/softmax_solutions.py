"""Softmax, merge and weighted-sum solutions for the checker tests: right ones and wrong ones.

Each correct solution here is written independently of flashref (per row, in
Python floats, or through log-sum-exp) so that a checker cannot pass merely
because it agrees with the library it compares against. Each planted mistake is
the kind of code a reader writes; the tests assert that the report names it.
"""

from __future__ import annotations

import math

import numpy as np

from flashref import SoftmaxState


def flat(result) -> str:
    """A report on one line: a long mistake name is wrapped over two lines when printed."""
    return " ".join(str(result).split())


# --- correct solutions, written differently from the library -------------------------------


def safe_softmax_via_lse(x):
    m = x.max(axis=-1, keepdims=True)
    lse = m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
    return np.exp(x - lse)


def online_softmax_per_row(x, block_size):
    rows = np.atleast_2d(x)
    out = np.empty_like(rows)
    for r, row in enumerate(rows):
        m, l = -math.inf, 0.0
        for start in range(0, len(row), block_size):
            block = row[start : start + block_size]
            m_block = float(block.max())
            if m_block == -math.inf:
                continue  # a fully masked block adds nothing
            m_new = max(m, m_block)
            l = l * math.exp(m - m_new) + float(np.exp(block - m_new).sum())
            m = m_new
        out[r] = np.exp(row - m) / l
    return out.reshape(x.shape)


def weighted_sum_in_floats(scores, values, tile_size):
    m, l, o = -math.inf, 0.0, 0.0
    for start in range(0, len(scores), tile_size):
        tile = range(start, min(start + tile_size, len(scores)))
        m_new = max([m] + [float(scores[i]) for i in tile])
        if m_new == -math.inf:
            continue
        c = math.exp(m - m_new)
        w = [math.exp(scores[i] - m_new) for i in tile]
        l = l * c + sum(w)
        o = o * c + sum(wi * values[i] for wi, i in zip(w, tile, strict=True))
        m = m_new
    return o / l


def merge_with_where(a, b):
    m = np.maximum(a.m, b.m)
    finite = np.isfinite(m)
    ca = np.exp(a.m - m, out=np.zeros_like(m), where=finite)
    cb = np.exp(b.m - m, out=np.zeros_like(m), where=finite)
    o = None if a.o is None else a.o * ca[..., None] + b.o * cb[..., None]
    return SoftmaxState(m, a.l * ca + b.l * cb, o)


# --- planted mistakes ----------------------------------------------------------------------


def streamed(rescale="right", bounds="ok", shift=True, stale=None):
    """A vectorised online softmax with one mistake switched on."""

    def fn(x, B):
        N = x.shape[-1]
        m = np.full(x.shape[:-1], -np.inf)
        l = np.zeros(x.shape[:-1])
        if bounds == "long":
            tiles = [slice(s, s + B + 1) for s in range(0, N, B)]
        elif bounds == "drop_tail":
            tiles = [slice(s, s + B) for s in range(0, N // B * B, B)]
        else:
            tiles = [slice(s, s + B) for s in range(0, N, B)]
        with np.errstate(all="ignore"):
            for t in tiles:
                block = x[..., t]
                if not shift:
                    l = l + np.exp(block).sum(axis=-1)
                    continue
                m_new = np.maximum(m, block.max(axis=-1))
                ref = np.where(np.isneginf(m_new), 0.0, m_new)
                if rescale == "right":
                    alpha = np.exp(m - ref)
                elif rescale == "wrong":
                    alpha = np.exp(m_new - m)
                else:
                    alpha = 1.0
                p_ref = ref  # the right shift: the new maximum
                if stale == "guarded":  # the old maximum, or the block's own on the first block
                    p_ref = np.where(np.isneginf(m), ref, m)
                elif stale == "literal":  # the old maximum, -inf on the first block
                    p_ref = m
                l = l * alpha + np.exp(block - p_ref[..., None]).sum(axis=-1)
                m = m_new
            if not shift:
                return np.exp(x) / l[..., None]
            ref = np.where(np.isneginf(m), 0.0, m)
            return np.exp(x - ref[..., None]) / l[..., None]

    return fn


def weighted(
    rescale_l="right", rescale_o="right", bounds="ok", shift=True, average=False, stale=False
):
    """A scalar-values streaming weighted sum with one mistake switched on."""

    def fn(scores, values, tile_size):
        m, l, o, results = -np.inf, 0.0, 0.0, []
        N, B = len(scores), tile_size
        stop = N // B * B if bounds == "drop_tail" else N
        with np.errstate(all="ignore"):
            for s in range(0, stop, B):
                t = slice(s, s + B - 1) if bounds == "short" else slice(s, s + B)
                if t.stop <= t.start:
                    continue
                if average:
                    p = np.exp(scores[t] - scores[t].max())
                    results.append(p @ values[t] / p.sum())
                    continue
                m_new = max(m, scores[t].max()) if shift else 0.0
                ref = 0.0 if m_new == -np.inf else m_new
                right = np.exp(m - ref) if shift else 1.0
                wrong = np.exp(m_new - m)
                factor = {"right": right, "wrong": wrong, "none": 1.0}
                p = np.exp(scores[t] - (m if stale and m > -np.inf else ref))
                l = l * factor[rescale_l] + p.sum()
                o = o * factor[rescale_o] + p @ values[t]
                m = m_new
        return float(np.mean(results)) if average else float(o / l)

    return fn


def merge(alpha_a, alpha_b, m_rule="max"):
    """A merge with its correction factors (and maximum) chosen by the caller."""

    def fn(a, b):
        with np.errstate(all="ignore"):
            m = {"max": np.maximum(a.m, b.m), "sum": a.m + b.m}[m_rule]
            ref = np.where(np.isneginf(m), 0.0, m)
            ca, cb = alpha_a(a, b, ref), alpha_b(a, b, ref)
            o = None if a.o is None else a.o * ca[..., None] + b.o * cb[..., None]
            return SoftmaxState(m, a.l * ca + b.l * cb, o)

    return fn


def own(state):
    return lambda a, b, ref: np.exp(state(a, b).m - ref)


def unit(a, b, ref):
    return np.ones_like(ref)


A, B = (lambda a, b: a), (lambda a, b: b)


# --- correct, in float32 ------------------------------------------------------------------


def online_softmax_float32(x, block_size):
    """A correct online softmax that computes in float32 and hands back float64."""
    return online_softmax_per_row(x.astype(np.float32), block_size).astype(np.float64)


def weighted_sum_float32(scores, values, tile_size):
    """A correct streaming weighted sum in float32 arithmetic, returned as a Python float."""
    s, v = scores.astype(np.float32), values.astype(np.float32)
    m, l, o = np.float32(-np.inf), np.float32(0), np.float32(0)
    for start in range(0, len(s), tile_size):
        m_new = max(m, s[start : start + tile_size].max())
        if m_new == -np.inf:
            continue
        alpha = np.exp(m - m_new)
        p = np.exp(s[start : start + tile_size] - m_new)
        l, o, m = alpha * l + p.sum(), alpha * o + p @ v[start : start + tile_size], m_new
    return float(o / l)
