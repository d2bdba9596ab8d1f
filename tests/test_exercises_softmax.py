"""The softmax checkers accept correct solutions and name planted mistakes.

Each correct solution here is written independently of flashref (per row, in
Python floats, or through log-sum-exp) so that a checker cannot pass merely
because it agrees with the library it compares against. Each planted mistake is
the kind of code a reader writes, and the test asserts that the report names it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import flashref
from flashref import SoftmaxState
from flashref.exercises import (
    check_merge_states,
    check_online_softmax,
    check_safe_softmax,
    check_streaming_weighted_sum,
)
from flashref.exercises import softmax as ex

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


def streamed(rescale="right", bounds="ok", shift=True):
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
                l = l * alpha + np.exp(block - ref[..., None]).sum(axis=-1)
                m = m_new
            if not shift:
                return np.exp(x) / l[..., None]
            ref = np.where(np.isneginf(m), 0.0, m)
            return np.exp(x - ref[..., None]) / l[..., None]

    return fn


def test_streamed_is_right_when_no_mistake_is_planted():
    assert check_online_softmax(streamed())


# --- safe softmax --------------------------------------------------------------------------


def test_safe_softmax_accepts_correct_solutions():
    assert check_safe_softmax(safe_softmax_via_lse)
    assert check_safe_softmax(flashref.safe_softmax)


def test_safe_softmax_names_the_overflow_of_the_textbook_formula():
    result = check_safe_softmax(flashref.naive_softmax)
    text = str(result)
    assert not result
    assert ex.NO_MAX in text
    assert "scores near 1000" in text and "expected" in text and "got nan" in text
    assert "warned: " in text and "overflow encountered in exp" in text


def test_safe_softmax_names_global_max_and_wrong_axis():
    def global_max(x):
        e = np.exp(x - x.max())
        return e / e.sum(axis=-1, keepdims=True)

    def wrong_axis(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=0, keepdims=True)

    assert ex.GLOBAL_MAX in str(check_safe_softmax(global_max))
    assert ex.WRONG_AXIS in str(check_safe_softmax(wrong_axis))


# --- online softmax ------------------------------------------------------------------------


def test_online_softmax_accepts_correct_solutions():
    result = check_online_softmax(online_softmax_per_row)
    assert result, str(result)
    assert result.cases_run == 13
    assert check_online_softmax(flashref.online_softmax)


@pytest.mark.parametrize(
    ("mistake", "fn", "not_named"),
    [
        (ex.NO_RESCALE, streamed(rescale="none"), ex.WRONG_WAY),
        (ex.WRONG_WAY, streamed(rescale="wrong"), ex.NO_RESCALE),
        (ex.OFF_BY_ONE, streamed(bounds="long"), ex.NO_RESCALE),
        (ex.OFF_BY_ONE, streamed(bounds="drop_tail"), ex.NO_RESCALE),
        (ex.NO_MAX, streamed(shift=False), ex.NO_RESCALE),
    ],
)
def test_online_softmax_names_each_planted_mistake(mistake, fn, not_named):
    result = check_online_softmax(fn)
    text = str(result)
    assert not result
    assert f"likely mistake: {mistake}" in text
    assert not_named not in text
    assert "block_size=" in text and "expected" in text


def test_the_names_the_brief_promises_are_spelled_out():
    assert ex.NO_RESCALE == "no rescaling of the running sum when the maximum grows"
    assert ex.WRONG_WAY == (
        "rescaling the wrong way (exp(m_new - m_old) instead of exp(m_old - m_new))"
    )
    assert ex.OFF_BY_ONE == "off-by-one tile bounds (a score skipped or counted twice)"
    assert ex.NO_MAX == "not subtracting the maximum (overflow)"
    assert ex.MERGE_ONE == "forgot to rescale one of the two states"
    assert ex.MERGE_OTHER == "used the other state's maximum"
    assert ex.MERGE_ADD == "added maxima"


def test_online_softmax_names_a_missing_guard_for_masked_blocks():
    def unguarded(x, B):
        m = np.full(x.shape[:-1], -np.inf)
        l = np.zeros(x.shape[:-1])
        with np.errstate(all="ignore"):
            for s in range(0, x.shape[-1], B):
                m_new = np.maximum(m, x[..., s : s + B].max(axis=-1))
                l = l * np.exp(m - m_new) + np.exp(x[..., s : s + B] - m_new[..., None]).sum(-1)
                m = m_new
            return np.exp(x - m[..., None]) / l[..., None]

    result = check_online_softmax(unguarded)
    assert result.cases_run == 13 and len(result.failures) == 1
    assert "a whole first block of -inf" in str(result)
    assert ex.NO_GUARD in str(result)


def test_online_softmax_reports_exceptions_and_not_implemented():
    def todo(x, block_size):
        raise NotImplementedError

    def broken(x, block_size):
        raise ValueError("shapes do not match")

    assert "not implemented yet" in str(check_online_softmax(todo))
    assert not check_online_softmax(todo)
    result = check_online_softmax(broken)
    assert len(result.failures) == result.cases_run == 13
    assert "raised ValueError: shapes do not match" in str(result)


def test_online_softmax_fails_nan_wrong_shape_and_wrong_type():
    nan = check_online_softmax(lambda x, B: np.full(x.shape, np.nan))
    assert len(nan.failures) == 13 and "got nan" in str(nan)
    assert "expected shape (37,), got shape (1, 37)" in str(
        check_online_softmax(lambda x, B: online_softmax_per_row(np.atleast_2d(x), B))
    )
    assert "expected a numpy array, got NoneType" in str(check_online_softmax(lambda x, B: None))
    f32 = check_online_softmax(lambda x, B: online_softmax_per_row(x, B).astype(np.float32))
    assert "expected dtype float64 (the input's), got float32" in str(f32)


def test_online_softmax_does_not_pass_an_input_the_reader_can_spoil():
    def overwrites(x, B):
        out = online_softmax_per_row(x, B)
        x[...] = 0.0  # the checker must not compare against a modified input
        return out

    assert check_online_softmax(overwrites)


# --- streaming weighted sum ----------------------------------------------------------------


def weighted(rescale_l="right", rescale_o="right", bounds="ok", shift=True, average=False):
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
                p = np.exp(scores[t] - ref)
                l = l * factor[rescale_l] + p.sum()
                o = o * factor[rescale_o] + p @ values[t]
                m = m_new
        return float(np.mean(results)) if average else float(o / l)

    return fn


def test_streaming_weighted_sum_accepts_correct_solutions():
    result = check_streaming_weighted_sum(weighted_sum_in_floats)
    assert result, str(result)
    assert check_streaming_weighted_sum(flashref.streaming_weighted_sum)
    assert check_streaming_weighted_sum(weighted())


@pytest.mark.parametrize(
    ("mistake", "fn"),
    [
        (ex.NO_RESCALE, weighted(rescale_l="none", rescale_o="none")),
        (ex.NO_RESCALE, weighted(rescale_l="none")),
        (ex.NO_RESCALE_O, weighted(rescale_o="none")),
        (ex.WRONG_WAY, weighted(rescale_l="wrong", rescale_o="wrong")),
        (ex.OFF_BY_ONE, weighted(bounds="short")),
        (ex.OFF_BY_ONE, weighted(bounds="drop_tail")),
        (ex.NO_MAX, weighted(shift=False)),
        (ex.TILE_AVERAGE, weighted(average=True)),
    ],
)
def test_streaming_weighted_sum_names_each_planted_mistake(mistake, fn):
    result = check_streaming_weighted_sum(fn)
    text = str(result)
    assert not result
    assert f"likely mistake: {mistake}" in text
    assert "tile_size=" in text and "expected" in text


def test_streaming_weighted_sum_reports_the_worked_example_by_name():
    result = check_streaming_weighted_sum(weighted(rescale_l="none", rescale_o="none"))
    assert (
        "the worked example (1000 + log i; values 10, 20, 30, 40): scores (4,), tile_size=1"
        in str(result)
    )
    assert "expected 30, got" in str(result)


# --- merging states ------------------------------------------------------------------------


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


@pytest.mark.parametrize("with_o", [False, True])
def test_merge_accepts_correct_solutions(with_o):
    result = check_merge_states(merge_with_where, with_o=with_o)
    assert result, str(result)
    assert check_merge_states(flashref.merge_states, with_o=with_o)
    assert check_merge_states(merge(own(A), own(B)), with_o=with_o)


@pytest.mark.parametrize("with_o", [False, True])
@pytest.mark.parametrize(
    ("mistake", "fn"),
    [
        (ex.MERGE_ONE, merge(own(A), unit)),
        (ex.MERGE_ONE, merge(unit, own(B))),
        (ex.MERGE_OTHER, merge(own(B), own(A))),
        (ex.MERGE_ADD, merge(own(A), own(B), m_rule="sum")),
        (ex.MERGE_NONE, merge(unit, unit)),
    ],
)
def test_merge_names_each_planted_mistake(mistake, fn, with_o):
    result = check_merge_states(fn, with_o=with_o)
    text = str(result)
    assert not result
    assert f"likely mistake: {mistake}" in text
    assert "rows (" in text and "expected" in text


def test_merge_names_a_missing_guard_for_two_empty_states():
    def unguarded(a, b):
        m = np.maximum(a.m, b.m)
        with np.errstate(invalid="ignore"):
            return SoftmaxState(m, a.l * np.exp(a.m - m) + b.l * np.exp(b.m - m))

    result = check_merge_states(unguarded)
    assert len(result.failures) == 1
    assert "both states empty in row 0" in str(result) and ex.MERGE_NO_GUARD in str(result)


def test_merge_reports_a_tuple_instead_of_a_state():
    result = check_merge_states(lambda a, b: (a.m, a.l))
    assert "expected a SoftmaxState (with .m and .l), got tuple" in str(result)
