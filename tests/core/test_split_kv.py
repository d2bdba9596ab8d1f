"""split_kv_attention (Flash-Decoding) and split_bounds: against the float64 reference, split
counts that must not change the result, splits that see no key, the partial results, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import (
    allowed_pairs,
    assert_close,
    attention_gqa_ref,
    attention_naive_lowp,
    attention_ref,
    no_warnings,
    rel_error,
)

import flashref.decode
from flashref import KVSplit, naive_attention, split_bounds, split_kv_attention

# float64 tolerance, as in test_attention.py: each output is a weighted average of at most
# ~80 value rows with scores from dot products of length <= 24 (a worst case of ~1e-14);
# every split adds one merge, a rescaling by a rounded exp and a multiply-add, a few units
# of roundoff each, for at most ~90 splits here. 1e-12 is above that and far below any real
# mistake (a chunk missed or counted twice, a mask shifted by a chunk: all O(1)).
RTOL64 = 1e-12

rngs = st.integers(min_value=0, max_value=2**32 - 1).map(np.random.default_rng)


def qkv(rng, batch, Hq, Hkv, Nq, Nk, d, dv, dtype=np.float64):
    shapes = [(Hq, Nq, d), (Hkv, Nk, d), (Hkv, Nk, dv)]
    return tuple(rng.standard_normal(batch + s).astype(dtype) for s in shapes)


# ---- against the float64 reference ---------------------------------------------------------

SHAPES = [  # (batch, Hq, Hkv, Nq, Nk, d, dv)
    ((), 1, 1, 1, 1, 1, 1),
    ((), 4, 1, 1, 77, 16, 8),  # decoding: one query, multi-query K/V
    ((2,), 8, 2, 3, 40, 8, 8),  # a few queries, grouped heads
    ((2, 2), 3, 3, 9, 13, 5, 7),
    ((), 2, 2, 20, 6, 3, 4),  # Nq > Nk
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("splits", [1, 2, 3, 7, "Nk", "Nk + 5"])
@pytest.mark.parametrize("batch, Hq, Hkv, Nq, Nk, d, dv", SHAPES)
def test_matches_reference(batch, Hq, Hkv, Nq, Nk, d, dv, splits, causal):
    q, k, v = qkv(np.random.default_rng(Nq * 100 + Nk), batch, Hq, Hkv, Nq, Nk, d, dv)
    num_splits = {"Nk": Nk, "Nk + 5": Nk + 5}.get(splits, splits)
    O_ref, lse_ref = attention_gqa_ref(q, k, v, causal=causal)
    with no_warnings():  # empty or fully masked splits must not warn
        O, lse = split_kv_attention(q, k, v, num_splits=num_splits, causal=causal, return_lse=True)
    assert O.dtype == lse.dtype == np.float64
    assert_close(O, O_ref, RTOL64, "O")
    assert_close(lse, lse_ref, RTOL64, "lse")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_low_precision_error_at_most_twice_naive(dtype):
    # FlashAttention's rule (CONVENTIONS.md): within 2x the error of the same-precision
    # textbook formula, plus one unit roundoff for the final rounding.
    q, k, v = qkv(np.random.default_rng(2), (2,), 4, 4, 5, 300, 32, 32, dtype)
    O_ref, lse_ref = attention_ref(q, k, v)
    O_low, lse_low = attention_naive_lowp(q, k, v, dtype)
    for num_splits in (1, 4, 33):
        O, lse = split_kv_attention(q, k, v, num_splits=num_splits, return_lse=True)
        assert O.dtype == dtype and lse.dtype == np.float32
        assert rel_error(O, O_ref) <= 2 * rel_error(O_low, O_ref) + np.finfo(dtype).eps
        eps32 = np.finfo(np.float32).eps
        assert rel_error(lse, lse_ref) <= 2 * rel_error(lse_low, lse_ref) + eps32


# ---- the number of splits does not matter -------------------------------------------------


@st.composite
def problems(draw):
    """Random problems with grouped heads, Nk from 0, masks that hide whole rows and whole
    ranges of keys (so that some splits see no key), and a split count up to Nk + 3."""
    batch = tuple(draw(st.lists(st.integers(1, 2), max_size=2), label="batch"))
    Hkv, G = draw(st.integers(1, 2), label="Hkv"), draw(st.integers(1, 3), label="G")
    Nq, Nk = draw(st.integers(1, 8), label="Nq"), draw(st.integers(0, 30), label="Nk")
    d, dv = draw(st.integers(1, 6), label="d"), draw(st.integers(1, 6), label="dv")
    rng = draw(rngs)
    q, k, v = qkv(rng, batch, G * Hkv, Hkv, Nq, Nk, d, dv)
    kw = dict(causal=draw(st.booleans(), label="causal"))
    if draw(st.booleans(), label="mask"):
        mask = rng.random(batch + (G * Hkv, Nq, Nk)) < 0.7
        lo = draw(st.integers(0, Nk), label="hidden from")
        mask[..., lo : lo + draw(st.integers(0, Nk), label="hidden keys")] = False
        mask[..., rng.random(Nq) < 0.2, :] = False  # rows that see nothing
        kw["mask"] = mask
    splits = st.integers(1, Nk + 3)
    return q, k, v, kw, draw(splits, label="num_splits"), draw(splits, label="other")


@settings(max_examples=150, deadline=None)
@given(problem=problems())
def test_split_count_does_not_change_the_result(problem):
    q, k, v, kw, a, b = problem
    with no_warnings():
        O_a, lse_a = split_kv_attention(q, k, v, num_splits=a, return_lse=True, **kw)
        O_b, lse_b = split_kv_attention(q, k, v, num_splits=b, return_lse=True, **kw)
        O_n, lse_n = naive_attention(q, k, v, return_lse=True, **kw)
    assert_close(O_a, O_b, RTOL64, f"O, {a} vs {b} splits")
    assert_close(lse_a, lse_b, RTOL64, f"lse, {a} vs {b} splits")
    assert_close(O_a, O_n, RTOL64, f"O, {a} splits vs naive")
    assert_close(lse_a, lse_n, RTOL64, f"lse, {a} splits vs naive")


# ---- splits with no unmasked key, empty splits, the partial results -------------------------


def test_a_split_whose_keys_are_all_masked_changes_nothing():
    q, k, v = qkv(np.random.default_rng(4), (), 2, 1, 3, 12, 4, 4)
    mask = np.ones(12, dtype=bool)
    mask[4:8] = False  # exactly the keys of split 1 of 3
    with no_warnings():
        O, lse, splits = split_kv_attention(
            q, k, v, num_splits=3, mask=mask, return_lse=True, return_splits=True
        )
    assert [s.keys for s in splits] == [range(0, 4), range(4, 8), range(8, 12)]
    assert np.isneginf(splits[1].lse).all() and not splits[1].O.any()
    assert np.isfinite(splits[0].lse).all() and np.isfinite(splits[2].lse).all()
    O_ref, lse_ref = attention_gqa_ref(q, k, v, mask=np.broadcast_to(mask, (2, 3, 12)))
    assert_close(O, O_ref, RTOL64, "O")
    assert_close(lse, lse_ref, RTOL64, "lse")


def test_causal_splits_after_every_query_see_nothing():
    # Top-left causal with Nq = 2 < Nk: queries see keys 0 and 0..1 only, so every split
    # after the first holds no visible key, and its partial result is the empty state.
    q, k, v = qkv(np.random.default_rng(5), (), 3, 3, 2, 20, 4, 4)
    O, splits = split_kv_attention(q, k, v, num_splits=5, causal=True, return_splits=True)
    assert all(np.isneginf(s.lse).all() and not s.O.any() for s in splits[1:])
    assert_close(O, attention_ref(q, k, v, causal=True)[0], RTOL64, "O")


def test_more_splits_than_keys_gives_empty_splits():
    q, k, v = qkv(np.random.default_rng(6), (2,), 2, 2, 3, 4, 5, 3)
    with no_warnings():
        O, lse, splits = split_kv_attention(
            q, k, v, num_splits=9, return_lse=True, return_splits=True
        )
    assert len(splits) == 9 and sum(len(s.keys) for s in splits) == 4
    empty = [s for s in splits if len(s.keys) == 0]
    assert len(empty) == 5 and all(np.isneginf(s.lse).all() and not s.O.any() for s in empty)
    assert_close(O, attention_ref(q, k, v)[0], RTOL64, "O")
    # No keys at all: every split is empty, every query gets zeros and -inf.
    O, lse = split_kv_attention(q, k[..., :0, :], v[..., :0, :], num_splits=3, return_lse=True)
    assert not O.any() and np.isneginf(lse).all() and O.shape == (2, 2, 3, 3)


def test_partial_results_are_attention_to_each_chunk_and_combine_by_lse():
    # Each KVSplit is attention to its chunk alone (the causal mask at the chunk's global
    # positions), and O is sum_s exp(lse_s - lse) O_s with lse = log sum_s exp(lse_s):
    # the combine step, written out here from the formula instead of merge_states.
    q, k, v = qkv(np.random.default_rng(7), (2,), 4, 2, 6, 23, 5, 4)
    O, lse, splits = split_kv_attention(
        q, k, v, num_splits=4, causal=True, return_lse=True, return_splits=True
    )
    assert [len(s.keys) for s in splits] == [5, 6, 6, 6]
    causal = allowed_pairs(6, 23, True, None, ())  # (Nq, Nk), top-left
    for s in splits:
        assert isinstance(s, KVSplit) and s.O.shape == (2, 4, 6, 4) and s.lse.shape == (2, 4, 6)
        c = slice(s.keys.start, s.keys.stop)
        O_s, lse_s = attention_gqa_ref(q, k[..., c, :], v[..., c, :], mask=causal[:, c])
        assert_close(s.O, O_s, RTOL64, f"O of split {s.keys}")
        assert_close(s.lse, lse_s, RTOL64, f"lse of split {s.keys}")
    lses = np.stack([s.lse for s in splits])  # (S, 2, 4, 6)
    with np.errstate(divide="ignore"):  # exp(-inf) = 0 for the splits a row does not see
        total = np.log(np.sum(np.exp(lses - lses.max(0)), axis=0)) + lses.max(0)
        weights = np.exp(lses - total)  # (S, 2, 4, 6)
    assert_close(lse, total, RTOL64, "lse")
    assert_close(O, np.sum(weights[..., None] * np.stack([s.O for s in splits]), 0), RTOL64, "O")


def test_partials_stay_in_the_accumulation_dtype():
    q, k, v = qkv(np.random.default_rng(8), (), 2, 2, 3, 10, 4, 4, np.float16)
    O, splits = split_kv_attention(q, k, v, num_splits=2, return_splits=True)
    assert O.dtype == np.float16
    assert all(s.O.dtype == s.lse.dtype == np.float32 for s in splits)


@pytest.mark.parametrize("Nk", [0, 1, 5, 16, 17, 100])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 16, 40])
def test_split_bounds_are_contiguous_and_even(Nk, num_splits):
    chunks = split_bounds(Nk, num_splits)
    assert len(chunks) == num_splits and chunks[0].start == 0 and chunks[-1].stop == Nk
    assert all(a.stop == b.start for a, b in zip(chunks[:-1], chunks[1:], strict=True))
    sizes = [len(c) for c in chunks]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == Nk
    assert max(sizes) == math.ceil(Nk / num_splits)


# ---- errors ---------------------------------------------------------------------------------


def expect(exc_type, call, *needles):
    with pytest.raises(exc_type) as info:
        call()
    assert type(info.value) is exc_type, type(info.value)
    for needle in needles:
        assert needle in str(info.value), f"{needle!r} not in {str(info.value)!r}"


@pytest.fixture
def no_work(monkeypatch):
    """Any attention call inside split_kv_attention fails the test: errors must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("naive_attention was called before the arguments were checked")

    monkeypatch.setattr(flashref.decode, "naive_attention", refuse)


Q, K, V = qkv(np.random.default_rng(0), (), 4, 2, 3, 10, 4, 4)


@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize(
    "kw, exc, needles",
    [
        (dict(num_splits=0), ValueError, ("num_splits must be >= 1, got 0",)),
        (dict(num_splits=-2), ValueError, ("num_splits must be >= 1, got -2",)),
        (dict(num_splits=2.0), TypeError, ("num_splits must be an int, got float",)),
        (dict(num_splits=True), TypeError, ("num_splits must be an int, got bool",)),
        (dict(num_splits="2"), TypeError, ("num_splits must be an int, got str",)),
        (dict(num_splits=None), TypeError, ("num_splits must be an int, got NoneType",)),
        (dict(num_splits=2, return_splits=1), TypeError, ("return_splits must be a bool",)),
        (dict(num_splits=2, return_lse="no"), TypeError, ("return_lse must be a bool",)),
        (dict(num_splits=2, causal=None), TypeError, ("causal must be False, True",)),
        (
            dict(num_splits=2, causal="bottom_right"),
            ValueError,
            ("causal='bottom_right'", "Nq = 3, Nk = 10", "split_kv_attention is top-left"),
        ),
        (dict(num_splits=2, scale=0.0), ValueError, ("scale must be finite and nonzero",)),
        (dict(num_splits=2, mask=np.ones((3, 9), bool)), ValueError, ("mask has shape (3, 9)",)),
    ],
)
def test_bad_arguments_are_refused_before_any_work(kw, exc, needles):
    expect(exc, lambda: split_kv_attention(Q, K, V, **kw), *needles)


@pytest.mark.usefixtures("no_work")
def test_bad_shapes_are_refused_before_any_work():
    expect(
        ValueError,
        lambda: split_kv_attention(Q, K[:1].repeat(3, 0), V, num_splits=2),
        "leading (batch/head) dimensions must be equal in k and v",
    )
    expect(
        ValueError,
        lambda: split_kv_attention(Q[:3], K, V, num_splits=2),
        "q has 3 heads but k has 2",
    )
    expect(
        TypeError,
        lambda: split_kv_attention(Q.astype(int), K, V, num_splits=2),
        "q has dtype int64",
    )


def test_num_splits_is_required():
    with pytest.raises(TypeError, match="num_splits"):
        split_kv_attention(Q, K, V)


def test_split_bounds_errors():
    expect(ValueError, lambda: split_bounds(-1, 2), "Nk must be >= 0, got -1")
    expect(ValueError, lambda: split_bounds(5, 0), "num_splits must be >= 1, got 0")
    expect(TypeError, lambda: split_bounds(5.0, 2), "Nk must be an int, got float")


def test_numpy_integers_and_bools_are_accepted():
    O = split_kv_attention(Q, K, V, num_splits=np.int64(3), causal=np.True_)
    with no_warnings():
        assert_close(O, attention_gqa_ref(Q, K, V, causal=True)[0], RTOL64, "O")
