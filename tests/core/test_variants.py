"""Attention variants in NumPy (``flashref.variants``): sliding windows, softcap, ALiBi, sinks,
``score_mod`` and ``mask_mod``, forward and backward, naive and tiled, against an independent
float64 reference written pair by pair from their definitions; the block mask against brute
force; gradients (the sinks' too) against finite differences; every bad argument named."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import variant_attention_ref

from flashref import (
    naive_attention,
    naive_attention_backward,
    tiled_attention,
    tiled_attention_backward,
)
from flashref.state import SoftmaxState
from flashref.variants import EMPTY, FULL, PARTIAL, block_mask

B, HQ, HKV, NQ, NK, D, DV = 2, 4, 2, 21, 29, 8, 5
SLOPES = np.array([0.25, 0.125, 0.0625, 0.5])
SINKS = np.array([0.5, -1.0, 2.0, -np.inf])  # the last head has no sink


def bias(s, b, h, q_idx, kv_idx):  # a relative bias, and a per-batch, per-head shift
    return s + 0.3 * np.sin(0.7 * (q_idx - kv_idx)) + 0.1 * b - 0.05 * h


def bias_grad(s, b, h, q_idx, kv_idx):
    return np.ones_like(s)


def squash(s, b, h, q_idx, kv_idx):  # a score_mod that is a function of the score
    return s - 0.1 * s**2 / (1 + q_idx)


def squash_grad(s, b, h, q_idx, kv_idx):
    return 1 - 0.2 * s / (1 + q_idx)


def documents(b, h, q_idx, kv_idx):  # a document mask: tokens attend inside their document
    doc_q, doc_k = (q_idx + 5 * b) // 9, (kv_idx + 5 * b) // 9
    return doc_q == doc_k


def prefix_lm(b, h, q_idx, kv_idx):  # the first 6 keys are seen by every query, then causal
    return (kv_idx < 6) | (kv_idx <= q_idx)


def _scalar(f):  # the reference calls the user functions with Python numbers
    return lambda *args: f(*(np.asarray(a) for a in args)).item()


VARIANTS = {
    "window": dict(window=(4, 2)),
    "window, causal": dict(window=(6, -1), causal="top_left"),
    "window left only": dict(window=(-1, 3)),
    "softcap": dict(softcap=1.5),
    "alibi": dict(alibi_slopes=SLOPES),
    "sinks": dict(sinks=SINKS),
    "score_mod": dict(score_mod=bias, score_mod_grad=bias_grad),
    "score_mod of the score": dict(score_mod=squash, score_mod_grad=squash_grad),
    "mask_mod": dict(mask_mod=documents),
    "mask_mod, causal": dict(mask_mod=prefix_lm, causal="top_left"),
    "everything": dict(
        window=(9, 4),
        softcap=2.0,
        alibi_slopes=SLOPES,
        sinks=SINKS,
        score_mod=squash,
        score_mod_grad=squash_grad,
        mask_mod=documents,
    ),
}


def _inputs(seed=0, Nq=NQ, Nk=NK, scale=2.0):
    rng = np.random.default_rng(seed)
    q = scale * rng.standard_normal((B, HQ, Nq, D))
    k = rng.standard_normal((B, HKV, Nk, D))
    v = rng.standard_normal((B, HKV, Nk, DV))
    return q, k, v


def _reference(q, k, v, kw):
    return variant_attention_ref(
        q,
        k,
        v,
        causal=kw.get("causal"),
        window=kw.get("window"),
        softcap=kw.get("softcap"),
        alibi=kw.get("alibi_slopes"),
        sinks=kw.get("sinks"),
        score_mod=_scalar(kw["score_mod"]) if "score_mod" in kw else None,
        mask_mod=_scalar(kw["mask_mod"]) if "mask_mod" in kw else None,
    )


def _forward_args(kw):
    return {name: value for name, value in kw.items() if name != "score_mod_grad"}


@pytest.mark.parametrize("name", VARIANTS)
def test_each_variant_matches_the_reference(name):
    kw = VARIANTS[name]
    q, k, v = _inputs(Nq=NK if "causal" in kw else NQ)
    want, want_lse = _reference(q, k, v, kw)
    args = _forward_args(kw)
    for got, lse in (
        naive_attention(q, k, v, return_lse=True, **args),
        tiled_attention(q, k, v, return_lse=True, block_q=8, block_k=5, **args),
        tiled_attention(q, k, v, return_lse=True, block_q=64, block_k=64, **args),
    ):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
        finite = np.isfinite(want_lse)
        np.testing.assert_allclose(lse[finite], want_lse[finite], rtol=1e-12, atol=0)


def test_fully_masked_rows_see_only_their_sink():
    """A row the mask leaves empty: O = 0, and lse = -inf, or the sink's logit if it has one."""
    q, k, v = _inputs()
    none = lambda b, h, q_idx, kv_idx: (q_idx % 3 != 0) & (kv_idx >= 0)  # noqa: E731
    O, lse = tiled_attention(q, k, v, mask_mod=none, sinks=SINKS, return_lse=True, block_k=8)
    assert (O[:, :, ::3] == 0).all()
    np.testing.assert_array_equal(lse[:, :, ::3], np.broadcast_to(SINKS[:, None], (B, HQ, 7)))
    O, lse = naive_attention(q, k, v, mask_mod=none, return_lse=True)
    assert (O[:, :, ::3] == 0).all() and np.isneginf(lse[:, :, ::3]).all()


def test_a_sink_is_a_key_whose_value_is_zero():
    """The sink is one more score in the denominator: the same as appending a key whose score
    is the sink's logit (set by a score_mod) and whose value is zero."""
    q, k, v = _inputs(1)
    sinks = SINKS[:3].tolist() + [0.25]
    want = naive_attention(q, k, v, sinks=np.array(sinks))
    k1 = np.concatenate([k, np.zeros((B, HKV, 1, D))], axis=2)
    v1 = np.concatenate([v, np.zeros((B, HKV, 1, DV))], axis=2)
    logit = np.array(sinks)[:, None, None]

    def the_sink(s, b, h, q_idx, kv_idx):
        return np.where(kv_idx == NK, logit[h[..., 0, 0]] if np.ndim(h) else logit[0], s)

    got = naive_attention(q, k1, v1, score_mod=the_sink)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-14)


def test_no_variant_is_the_plain_function_bit_for_bit():
    q, k, v = _inputs(2, Nq=NK)
    for causal in (False, True):
        plain = tiled_attention(q, k, v, causal=causal, return_lse=True, block_k=8)
        off = tiled_attention(
            q, k, v, causal=causal, return_lse=True, block_k=8, window=(-1, -1), softcap=0.0
        )
        for a, b in zip(plain, off, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", VARIANTS)
def test_gradients_match_finite_differences(name):
    """The backward (naive and tiled, the same to rounding) against central differences of the
    float64 forward, at entries spread over every input; the sinks' gradient as well."""
    kw = VARIANTS[name]
    q, k, v = _inputs(3, Nq=NK if "causal" in kw else NQ, scale=1.0)
    args = _forward_args(kw)
    O, lse = naive_attention(q, k, v, return_lse=True, **args)
    do = np.random.default_rng(4).standard_normal(O.shape)
    grads = naive_attention_backward(q, k, v, O, lse, do, **kw)
    tiled = tiled_attention_backward(q, k, v, O, lse, do, block_q=8, block_k=6, **kw)
    assert len(grads) == len(tiled) == (4 if "sinks" in kw else 3)
    for a, b in zip(grads, tiled, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-12)
    inputs = {"q": q, "k": k, "v": v} | ({"sinks": kw["sinks"]} if "sinks" in kw else {})

    def loss(**change):
        x = inputs | change
        extra = {"sinks": x["sinks"]} if "sinks" in x else {}
        return float((naive_attention(x["q"], x["k"], x["v"], **(args | extra)) * do).sum())

    rng, eps = np.random.default_rng(5), 1e-6
    for grad, (arg, x) in zip(grads, inputs.items(), strict=True):
        finite = np.flatnonzero(np.isfinite(x))
        for flat in rng.choice(finite, size=min(12, finite.size), replace=False):
            idx = np.unravel_index(flat, x.shape)
            up, down = x.copy(), x.copy()
            up[idx] += eps
            down[idx] -= eps
            numeric = (loss(**{arg: up}) - loss(**{arg: down})) / (2 * eps)
            assert abs(grad[idx] - numeric) <= 1e-6 * (1 + abs(numeric)), (arg, idx)


def test_the_sink_gradient_of_a_head_without_sink_is_zero():
    q, k, v = _inputs(6)
    O, lse = naive_attention(q, k, v, sinks=SINKS, return_lse=True)
    *_, dsinks = naive_attention_backward(q, k, v, O, lse, O, sinks=SINKS)
    assert dsinks.shape == SINKS.shape and dsinks[-1] == 0 and (dsinks[:-1] != 0).all()


def test_softcap_keeps_large_logits_finite_and_bounded():
    q, k, v = _inputs(7, scale=1e4)
    O, lse = tiled_attention(q, k, v, softcap=5.0, return_lse=True)
    assert np.isfinite(O).all() and (lse <= 5.0 + math.log(NK)).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_low_precision_accumulates_in_float32(dtype):
    kw = _forward_args(VARIANTS["everything"])
    q, k, v = (x.astype(dtype) for x in _inputs(8))
    O = tiled_attention(q, k, v, block_q=16, block_k=16, **kw)
    want, _ = _reference(q, k, v, VARIANTS["everything"])
    assert O.dtype == dtype
    assert np.abs(O - want).max() <= 64 * np.finfo(np.float32).eps * np.abs(want).max() + (
        np.finfo(dtype).eps * np.abs(want).max()
    )


# ---- the block mask ----------------------------------------------------------------------------


def _brute_kinds(allowed, Br, Bc):
    Nq, Nk = allowed.shape[-2:]
    kinds = np.empty((-(-Nq // Br), -(-Nk // Bc)), np.int8)
    for a in range(kinds.shape[0]):
        for c in range(kinds.shape[1]):
            tile = allowed[..., a * Br : (a + 1) * Br, c * Bc : (c + 1) * Bc]
            kinds[a, c] = FULL if tile.all() else PARTIAL if tile.any() else EMPTY
    return kinds


@settings(max_examples=60, deadline=None)
@given(
    Nq=st.integers(1, 70),
    Nk=st.integers(1, 70),
    Br=st.integers(1, 20),
    Bc=st.integers(1, 20),
    left=st.integers(-1, 30),
    right=st.integers(-1, 30),
    causal=st.booleans(),
)
def test_block_mask_is_what_the_pairs_say(Nq, Nk, Br, Bc, left, right, causal):
    Nq = Nk if causal else Nq  # a window with a top-left causal mask needs Nq == Nk
    kinds = block_mask(Nq, Nk, Br, Bc, causal=causal, window=(left, right))
    i, j = np.arange(Nq)[:, None] + Nk - Nq, np.arange(Nk)
    allowed = np.ones((Nq, Nk), bool)
    if left >= 0:
        allowed &= j >= i - left
    if right >= 0 or causal:
        allowed &= j <= i + (min(right, 0) if causal and right >= 0 else 0 if causal else right)
    np.testing.assert_array_equal(kinds, _brute_kinds(allowed, Br, Bc))


def test_block_mask_of_a_mask_mod_over_heads():
    def per_head(b, h, q_idx, kv_idx):  # head h sees keys within h * 8 of the query
        return np.abs(q_idx - kv_idx) <= 8 * h

    kinds = block_mask(40, 40, 8, 8, mask_mod=per_head, heads=3)
    i, j = np.arange(40)[:, None], np.arange(40)
    allowed = np.stack([np.abs(i - j) <= 8 * h for h in range(3)])
    np.testing.assert_array_equal(kinds, _brute_kinds(allowed, 8, 8))


def test_the_tiled_loops_visit_exactly_the_tiles_that_are_not_empty(monkeypatch):
    """Forward and backward compute the score tiles of the block mask's non-empty tiles only."""
    Nq = Nk = 96
    q, k, v = _inputs(9, Nq=Nq, Nk=Nk)
    visited = []
    update = SoftmaxState.update

    def counting(self, s, v=None):
        visited.append(s.shape)
        return update(self, s, v)

    monkeypatch.setattr(SoftmaxState, "update", counting)
    kw = dict(causal=True, window=(20, -1), mask_mod=prefix_lm)
    kinds = block_mask(Nq, Nk, 16, 8, **kw)
    O, lse = tiled_attention(q, k, v, block_q=16, block_k=8, return_lse=True, **kw)
    assert len(visited) == (kinds != EMPTY).sum() < kinds.size
    want, _ = _reference(q, k, v, kw | {"causal": "top_left"})
    np.testing.assert_allclose(O, want, rtol=0, atol=1e-12)


# ---- bad arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, error, match",
    [
        ({"window": 5}, TypeError, r"window must be None or a pair"),
        ({"window": (3, 1.5)}, TypeError, r"window's right bound must be an int, got float"),
        ({"window": (-2, 0)}, ValueError, r"window's left bound must be >= 0, or -1"),
        ({"window": (True, 0)}, TypeError, r"window's left bound must be an int, got bool"),
        ({"softcap": -1.0}, ValueError, r"softcap must be finite and > 0"),
        ({"softcap": math.inf}, ValueError, r"softcap must be finite and > 0"),
        ({"softcap": "30"}, TypeError, r"softcap must be a real number or None, got str"),
        ({"alibi_slopes": np.ones(3)}, ValueError, r"alibi_slopes has shape \(3,\); expected"),
        ({"alibi_slopes": [1, 2, np.nan, 4]}, ValueError, r"alibi_slopes holds nan"),
        ({"alibi_slopes": np.ones(4, int)}, TypeError, r"alibi_slopes has dtype int64"),
        ({"sinks": np.ones((2, 4))}, ValueError, r"sinks has shape \(2, 4\); expected \(4,\)"),
        ({"sinks": [0, 0, np.inf, 0]}, ValueError, r"sinks holds inf"),
        ({"score_mod": 3}, TypeError, r"score_mod must be a function or None, got int"),
        ({"mask_mod": "causal"}, TypeError, r"mask_mod must be a function or None, got str"),
        (
            {"mask_mod": lambda b, h, i, j: (i - j).astype(float)},
            TypeError,
            r"mask_mod returned dtype float64; expected bool",
        ),
        (
            {"score_mod": lambda s, b, h, i, j: s[..., :1, :1, :1].sum(-1)},
            ValueError,
            r"score_mod returned shape .* which does not broadcast to the tile",
        ),
    ],
)
def test_bad_variant_arguments_are_named(kw, error, match):
    q, k, v = _inputs()
    for f in (naive_attention, tiled_attention):
        with pytest.raises(error, match=match):
            f(q, k, v, **kw)


def test_a_window_with_a_top_left_causal_mask_needs_equal_lengths():
    q, k, v = _inputs()  # Nq = 21, Nk = 29
    with pytest.raises(ValueError, match=r"window is aligned on the diagonal j = i \+ Nk - Nq"):
        tiled_attention(q, k, v, causal=True, window=(4, 0))
    tiled_attention(q, k, v, window=(4, 0))  # bottom-right on its own: fine


def test_the_backward_of_a_score_mod_needs_its_derivative():
    q, k, v = _inputs()
    O, lse = naive_attention(q, k, v, score_mod=bias, return_lse=True)
    for f in (naive_attention_backward, tiled_attention_backward):
        with pytest.raises(ValueError, match=r"needs score_mod_grad, the derivative of score_mod"):
            f(q, k, v, O, lse, O, score_mod=bias)
        with pytest.raises(ValueError, match="score_mod_grad was given without the score_mod"):
            f(q, k, v, O, lse, O, score_mod_grad=bias_grad)


@settings(max_examples=25, deadline=None)
@given(Br=st.integers(1, 40), Bc=st.integers(1, 40))
def test_the_result_does_not_depend_on_the_tiles(Br, Bc):
    kw = _forward_args(VARIANTS["everything"])
    q, k, v = _inputs(10)
    want = naive_attention(q, k, v, **kw)
    np.testing.assert_allclose(
        tiled_attention(q, k, v, block_q=Br, block_k=Bc, **kw), want, rtol=0, atol=1e-12
    )


def test_a_misspelt_variant_is_named_with_the_right_ones():
    q, k, v = _inputs()
    with pytest.raises(
        TypeError,
        match=r"tiled_attention\(\) got an unexpected keyword argument "
        r"'windw'; its variants are window, softcap",
    ):
        tiled_attention(q, k, v, windw=(3, 0))
    with pytest.raises(TypeError, match=r"naive_attention\(\) .* 'score_mod_grad'"):
        naive_attention(q, k, v, score_mod=bias, score_mod_grad=bias_grad)
